"""Tools as plain Python functions: ``@tool`` builds the JSON schema the model sees
(Hermes / Qwen function-calling format) from type hints and the docstring, and
:class:`ToolSet` validates and dispatches calls.

    @tool
    def add(a: int, b: int = 0) -> int:
        \"\"\"Adds two integers.

        Args:
            a: first addend
            b: second addend
        \"\"\"
        return a + b

Argument checking is strict and explains itself (wrong type, missing or unknown
argument), because those messages go back to the agent as observations.
"""

from __future__ import annotations

import inspect
import json
import re
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable, Sequence

_PRIMS = {int: "integer", float: "number", str: "string", bool: "boolean"}


class ToolArgumentError(ValueError):
    """A call whose arguments do not fit the tool's schema."""


def _json_type(hint) -> dict:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint in _PRIMS:
        return {"type": _PRIMS[hint]}
    if origin in (list, Sequence, tuple) or hint in (list, tuple):
        item = args[0] if args else Any
        return {"type": "array", "items": _json_type(item) if item is not Any else {}}
    if origin is dict or hint is dict:
        return {"type": "object"}
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return _json_type(inner[0])
        return {"anyOf": [_json_type(a) for a in inner]}
    if origin is typing.Literal:
        return {"type": _PRIMS.get(type(args[0]), "string"), "enum": list(args)}
    return {}


def _arg_docs(doc: str) -> dict[str, str]:
    out, in_args = {}, False
    for line in doc.splitlines():
        s = line.strip()
        if s.lower() in ("args:", "arguments:", "parameters:"):
            in_args = True
            continue
        if in_args:
            m = re.match(r"(\w+)\s*(\([^)]*\))?\s*:\s*(.*)", s)
            if m:
                out[m.group(1)] = m.group(3)
            elif not s or s.endswith(":"):
                in_args = False
    return out


@dataclass(frozen=True)
class Tool:
    name: str
    fn: Callable[..., Any]
    schema: dict  # {"type": "function", "function": {name, description, parameters}}
    hints: dict

    def check(self, arguments: Any) -> dict:
        if not isinstance(arguments, dict):
            raise ToolArgumentError(f"arguments of {self.name} must be a JSON object")
        params = self.schema["function"]["parameters"]
        unknown = set(arguments) - set(params["properties"])
        if unknown:
            raise ToolArgumentError(f"{self.name} got unknown argument(s) {sorted(unknown)}; "
                                    f"it takes {sorted(params['properties'])}")
        missing = [p for p in params["required"] if p not in arguments]
        if missing:
            raise ToolArgumentError(f"{self.name} is missing required argument(s) {missing}")
        return {k: _coerce(v, self.hints.get(k, Any), f"{self.name}.{k}")
                for k, v in arguments.items()}


def _coerce(value: Any, hint, where: str) -> Any:
    """Checks a JSON value against a hint (ints are accepted for floats)."""
    if hint is Any:
        return value
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, where)
            except ToolArgumentError:
                pass
        raise ToolArgumentError(f"{where}: {value!r} fits none of {hint}")
    if hint is bool:
        if isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif hint is str:
        if isinstance(value, str):
            return value
    elif origin in (list, Sequence) or hint is list:
        if isinstance(value, list):
            item = args[0] if args else Any
            return [_coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    elif origin is dict or hint is dict:
        if isinstance(value, dict):
            return value
    elif origin is typing.Literal:
        if value in args:
            return value
        raise ToolArgumentError(f"{where}: {value!r} is not one of {list(args)}")
    else:
        return value
    expect = _json_type(hint).get("type", str(hint))
    raise ToolArgumentError(f"{where} must be {expect}, got {type(value).__name__} {value!r}")


def tool(fn: Callable[..., Any] | None = None, *, name: str | None = None):
    """Decorator: ``fn`` becomes a :class:`Tool` with a schema from its signature."""
    def wrap(f: Callable[..., Any]) -> Tool:
        sig = inspect.signature(f)
        hints = typing.get_type_hints(f)
        doc = inspect.getdoc(f) or ""
        desc = doc.split("\n\n")[0].strip()
        arg_docs = _arg_docs(doc)
        props, required = {}, []
        for p in sig.parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise TypeError(f"tool {f.__name__}: *args/**kwargs cannot be described")
            spec = _json_type(hints.get(p.name, Any))
            if p.name in arg_docs:
                spec["description"] = arg_docs[p.name]
            props[p.name] = spec
            if p.default is inspect.Parameter.empty:
                required.append(p.name)
        schema = {"type": "function", "function": {
            "name": name or f.__name__, "description": desc,
            "parameters": {"type": "object", "properties": props, "required": required}}}
        return Tool(name or f.__name__, f, schema, {k: v for k, v in hints.items()
                                                      if k != "return"})
    return wrap(fn) if fn is not None else wrap


class ToolSet:
    """A group of tools: schemas for the prompt, checked dispatch for calls."""

    def __init__(self, tools: Sequence[Tool]):
        self.tools = {t.name: t for t in tools}
        if len(self.tools) != len(tools):
            raise ValueError("tool names must be unique")

    def schemas(self) -> list[dict]:
        return [t.schema for t in self.tools.values()]

    def system_prompt(self, preamble: str = "") -> str:
        """Hermes / Qwen 2.5 function-calling instructions with the tool signatures."""
        sigs = "\n".join(json.dumps(s) for s in self.schemas())
        return (f"{preamble}\n\n# Tools\n\nYou may call one or more functions to assist with "
                "the user query.\n\nYou are provided with function signatures within "
                f"<tools></tools> XML tags:\n<tools>\n{sigs}\n</tools>\n\nFor each function "
                "call, return a json object with function name and arguments within "
                "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
                "\"arguments\": <args-json-object>}\n</tool_call>").strip()

    def call(self, name: str, arguments: Any) -> Any:
        if name not in self.tools:
            raise ToolArgumentError(f"unknown tool {name!r}; available: {sorted(self.tools)}")
        t = self.tools[name]
        return t.fn(**t.check(arguments))
