"""Tool-call environments: Hermes/Qwen tool calls, sandboxed Python, a safe calculator."""

from .calculator import CalculatorError, evaluate
from .calls import CallError, ParsedResponse, ToolCall, parse_tool_calls, tool_response
from .sandbox import (SandboxConfig, SandboxError, SandboxLimits, SandboxResult,
                      SandboxUnavailableError, check_sandbox, run_python,
                      sandbox_unavailable_reason)
from .schema import Tool, ToolArgumentError, ToolSet, tool

__all__ = ["CalculatorError", "evaluate", "CallError", "ParsedResponse", "ToolCall",
           "parse_tool_calls", "tool_response", "SandboxConfig", "SandboxError",
           "SandboxLimits", "SandboxResult", "SandboxUnavailableError", "check_sandbox",
           "run_python", "sandbox_unavailable_reason", "Tool", "ToolArgumentError", "ToolSet",
           "tool"]
