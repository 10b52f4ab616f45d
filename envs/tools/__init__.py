"""Tool-call environments: Hermes/Qwen tool calls, sandboxed Python, a safe calculator."""

from .calculator import CalculatorError, evaluate
from .calls import CallError, ParsedResponse, ToolCall, parse_tool_calls, tool_response
from .sandbox import SandboxLimits, SandboxResult, run_python
from .schema import Tool, ToolArgumentError, ToolSet, tool

__all__ = ["CalculatorError", "evaluate", "CallError", "ParsedResponse", "ToolCall",
           "parse_tool_calls", "tool_response", "SandboxLimits", "SandboxResult", "run_python",
           "Tool", "ToolArgumentError", "ToolSet", "tool"]
