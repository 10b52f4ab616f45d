"""Turns raw model text into an env action.

Parsers live in a registry (``PARSERS``) chosen by ``agent.action_parser``:

* ``action_tag`` (ALFWorld / verl-agent style tags), expected output: optional ``<think>...</think>`` then exactly one
``<action>...</action>``.  Anything else parses to ``action=None`` with an error
string; the rollout shows the error as an observation and counts it, so bad
output never crashes a run.
* ``raw``: the whole response goes to the env, which owns its format (Search-R1's
  ``<search>``/``<answer>``, Hermes ``<tool_call>``) and reports validity in info.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

_ACTION = re.compile(r"<action>(.*?)</action>", re.DOTALL)
_THINK = re.compile(r"<think>(.*?)</think>", re.DOTALL)
_WS = re.compile(r"\s+")

INVALID_FORMAT_MESSAGE = "Invalid format. Reply with <action> command </action> ."


@dataclass(frozen=True)
class ParsedAction:
    action: str | None
    think: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.action is not None


def _precheck(text, require_think: bool) -> tuple[str | None, ParsedAction | None]:
    """The <think> block, or the failed parse when the text is unusable."""
    if not isinstance(text, str):
        return None, ParsedAction(None, error="output is not text")
    think_m = _THINK.search(text)
    think = think_m.group(1).strip() if think_m else None
    if require_think and think is None:
        return None, ParsedAction(None, error="missing <think> block")
    return think, None


def parse_action(text: str, require_think: bool = False, max_action_chars: int = 512
                 ) -> ParsedAction:
    think, failed = _precheck(text, require_think)
    if failed is not None:
        return failed
    found = _ACTION.findall(text)
    if not found:
        if "<action>" in text:
            return ParsedAction(None, think, error="unterminated <action> tag")
        return ParsedAction(None, think, error="no <action> tag")
    if len(found) > 1:
        return ParsedAction(None, think, error="more than one <action> tag")
    action = _WS.sub(" ", found[0]).strip()
    if not action:
        return ParsedAction(None, think, error="empty action")
    if "<" in action or ">" in action:
        return ParsedAction(None, think, error="nested tag inside <action>")
    if len(action) > max_action_chars:
        return ParsedAction(None, think, error="action too long")
    return ParsedAction(action, think)


def parse_raw(text: str, require_think: bool = False) -> ParsedAction:
    """Pass-through for envs that parse the response themselves: the whole response, so
    the env's own length bound (and its message about it) applies, never a silent cut."""
    think, failed = _precheck(text, require_think)
    if failed is not None:
        return failed
    return ParsedAction(text, think)


PARSERS: dict[str, Callable[..., ParsedAction]] = {"action_tag": parse_action, "raw": parse_raw}


def get_parser(name: str) -> Callable[..., ParsedAction]:
    try:
        return PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown action parser {name!r}; choose one of {sorted(PARSERS)}"
                         ) from None
