"""Parsing Hermes / Qwen tool calls out of a response, and formatting results.

``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (one or more).  Every
failure is a :class:`CallError` with a message written for the agent: malformed
JSON, a call cut off before ``</tool_call>``, a missing name, arguments that are
not an object.  The env turns them into ``<tool_response>`` observations and
counts an ``invalid_call``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


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
    for m in _CALL.finditer(text):
        calls.append(_one(m.group(1)))
    tail = _CALL.sub("", text)
    if "<tool_call>" in tail:
        calls.append(CallError("a <tool_call> was cut off before </tool_call>"))
    if len(calls) > max_calls:
        calls = calls[:max_calls] + [CallError(f"at most {max_calls} calls per turn")]
    am = _ANSWER.search(tail)
    answer = " ".join(am.group(1).split()) if am else None
    return ParsedResponse(tuple(calls), answer or None)


def _one(body: str) -> ToolCall | CallError:
    try:
        obj = json.loads(body.strip())
    except json.JSONDecodeError as exc:
        return CallError(f"tool call is not valid JSON ({exc.msg} at char {exc.pos})")
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
            args = json.loads(args)
        except json.JSONDecodeError:
            return CallError(f'"arguments" of {name} is a string that is not JSON')
    if not isinstance(args, dict):
        return CallError(f'"arguments" of {name} must be a JSON object')
    return ToolCall(name, {str(k).strip(): v for k, v in args.items()})


def tool_response(content: Any, max_chars: int = 4000) -> str:
    text = content if isinstance(content, str) else json.dumps(content, default=str)
    if len(text) > max_chars:
        text = text[:max_chars] + f"... [truncated {len(text) - max_chars} chars]"
    return f"<tool_response>\n{text}\n</tool_response>"
