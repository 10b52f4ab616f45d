"""Parsing Hermes / Qwen tool calls out of a response, and formatting results.

``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (one or more).  Every
failure is a :class:`CallError` with a message written for the agent: malformed
JSON, a call cut off before ``</tool_call>``, a missing name, arguments that are
not an object, JSON nested deeper than :data:`MAX_JSON_DEPTH`.  The env turns them
into ``<tool_response>`` observations and counts an ``invalid_call``.

The response is untrusted text, so parsing is linear in its length: tags are found
with ``str.find`` (no backtracking regex), only the first ``max_calls`` bodies are
decoded, and JSON nesting is measured in one pass before ``json.loads`` sees it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
MAX_JSON_DEPTH = 32  # nesting of [ and { a call's JSON may have
_JSON_SPECIAL = re.compile(r'["\\\[\]{}]')  # one character class: linear


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict


@dataclass(frozen=True)
class CallError:
    message: str


@dataclass(frozen=True)
class ParsedResponse:
    calls: tuple[ToolCall | CallError, ...]
    answer: str | None  # text inside <answer>...</answer>, if any

    @property
    def invalid(self) -> int:
        return sum(isinstance(c, CallError) for c in self.calls)


def parse_tool_calls(text: str, max_calls: int = 8) -> ParsedResponse:
    if not isinstance(text, str):
        return ParsedResponse((CallError("the response is not text"),), None)
    calls: list[ToolCall | CallError] = []
    rest: list[str] = []  # the text outside complete calls
    pos = found = 0
    for start, end in _spans(text, CALL_OPEN, CALL_CLOSE):
        rest.append(text[pos:start])
        pos = end
        found += 1
        if found <= max_calls:  # bodies past the limit are not decoded
            calls.append(_one(text[start + len(CALL_OPEN):end - len(CALL_CLOSE)]))
    rest.append(text[pos:])
    tail = "".join(rest)
    cut_off = CALL_OPEN in tail
    if found + cut_off > max_calls:
        calls = calls[:max_calls] + [CallError(f"at most {max_calls} calls per turn")]
    elif cut_off:
        calls.append(CallError("a <tool_call> was cut off before </tool_call>"))
    answer = None
    for start, end in _spans(tail, ANSWER_OPEN, ANSWER_CLOSE):
        answer = " ".join(tail[start + len(ANSWER_OPEN):end - len(ANSWER_CLOSE)].split())
        break
    return ParsedResponse(tuple(calls), answer or None)


def _spans(text: str, open_tag: str, close_tag: str) -> Iterator[tuple[int, int]]:
    """``(start, end)`` of each ``open_tag ... close_tag`` in ``text``, left to right,
    non-overlapping, each closed by the first ``close_tag`` after it: what
    ``re.finditer(open(.*?)close, re.DOTALL)`` matches, in one pass.  (An opening with
    no closing after it means no later opening has one either.)"""
    pos = 0
    while True:
        i = text.find(open_tag, pos)
        if i < 0:
            return
        j = text.find(close_tag, i + len(open_tag))
        if j < 0:
            return
        pos = j + len(close_tag)
        yield i, pos


def json_depth(text: str) -> int:
    """Deepest nesting of ``[``/``{`` in JSON ``text`` (brackets inside strings do not
    count), in one linear pass that never recurses."""
    depth = best = 0
    in_string = False
    skip = -1  # index of a character escaped by a backslash
    for m in _JSON_SPECIAL.finditer(text):
        i = m.start()
        if i == skip:
            continue
        c = text[i]
        if in_string:
            if c == "\\":
                skip = i + 1
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "[{":
            depth += 1
            best = max(best, depth)
        elif c in "]}":
            depth -= 1
    return best


class _NotJSON(ValueError):
    pass


def _loads(text: str, what: str) -> Any:
    """``json.loads`` for untrusted text; :class:`ValueError` with an agent-readable
    message for anything it cannot take (too deep, not JSON, huge integers)."""
    depth = json_depth(text)
    if depth > MAX_JSON_DEPTH:
        raise ValueError(f"{what} is nested {depth} levels deep; at most {MAX_JSON_DEPTH} "
                         "are allowed")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise _NotJSON(f"{what} is not valid JSON ({exc.msg} at char {exc.pos})") from None
    except (ValueError, RecursionError) as exc:  # e.g. an integer of 5,000 digits
        raise ValueError(f"{what} cannot be decoded ({type(exc).__name__}: {exc})") from None


def _one(body: str) -> ToolCall | CallError:
    try:
        obj = _loads(body.strip(), "tool call")
    except ValueError as exc:
        return CallError(str(exc))
    if not isinstance(obj, dict):
        return CallError('a tool call must be a JSON object {"name": ..., "arguments": {...}}')
    obj = {str(k).strip(): v for k, v in obj.items()}  # word-level detokenisers pad keys
    name = obj.get("name")
    if isinstance(name, str):
        name = name.strip()
    if not isinstance(name, str) or not name:
        return CallError('a tool call needs a "name" string')
    args = obj.get("arguments", {})
    if isinstance(args, str):  # some models double-encode the arguments
        try:
            args = _loads(args, f'"arguments" of {name}')
        except _NotJSON:
            return CallError(f'"arguments" of {name} is a string that is not JSON')
        except ValueError as exc:
            return CallError(str(exc))
    if not isinstance(args, dict):
        return CallError(f'"arguments" of {name} must be a JSON object')
    return ToolCall(name, {str(k).strip(): v for k, v in args.items()})


def tool_response(content: Any, max_chars: int = 4000) -> str:
    text = content if isinstance(content, str) else json.dumps(content, default=str)
    if len(text) > max_chars:
        text = text[:max_chars] + f"... [truncated {len(text) - max_chars} chars]"
    return f"<tool_response>\n{text}\n</tool_response>"
