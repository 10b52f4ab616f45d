"""``ToolEnv``: a text env whose actions are Hermes/Qwen tool calls.

Each step takes the agent's whole response.  Every ``<tool_call>`` in it is parsed,
checked against the tool schemas and executed; the observation is one
``<tool_response>`` per call (an error message for an invalid call, which is also
counted in ``info["invalid_calls"]``).  A response with ``<answer> ... </answer>``
ends the episode and is scored by :meth:`score_answer`; a response with neither
calls nor an answer is an invalid action.  ``max_turns`` truncates.

Actions longer than ``max_action_length`` (16,384 characters, what ``action_space``
declares) are cut to that length *before* parsing, and the cut is marked: the
observation starts with a note and ``info["action_truncated"]`` is True.  A call cut in
half by it becomes the usual "cut off before </tool_call>" error.  Parsing itself is
linear in the action's length.  Stepping a finished episode raises (call ``reset()``).

The first observation carries the tool signatures (``<tools>...</tools>``), the
env's instructions and the task, so any policy sees everything it needs as text.
"""

from __future__ import annotations

from typing import Any

from ..base import TextEnv, sanitize
from .calls import CallError, parse_tool_calls, tool_response
from .sandbox import SandboxError
from .schema import ToolArgumentError, ToolSet

NO_ACTION = ("Invalid response: call a tool with <tool_call>{\"name\": ..., \"arguments\": "
             "{...}}</tool_call> or finish with <answer> ... </answer>.")


class ToolEnv(TextEnv):
    max_observation_length = 16384
    max_action_length = 16384
    instructions = ""

    def __init__(self, max_turns: int = 8, max_calls_per_turn: int = 4,
                 render_mode: str | None = None):
        super().__init__(render_mode)
        if max_turns < 1 or max_calls_per_turn < 1:
            raise ValueError("max_turns and max_calls_per_turn must be >= 1")
        self.max_turns, self.max_calls = max_turns, max_calls_per_turn
        self.turns = 0
        self.done = True
        self.total_calls = 0
        self.total_invalid = 0

    # subclasses: the tools of the current task, the task text, scoring, task setup
    def toolset(self) -> ToolSet:
        raise NotImplementedError

    def task_text(self) -> str:
        raise NotImplementedError

    def setup(self, index: int) -> None:
        raise NotImplementedError

    def score_answer(self, answer: str) -> tuple[float, dict]:
        raise NotImplementedError

    def task_info(self) -> dict[str, Any]:
        return {}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        index = (options or {}).get("task_index", seed)
        if index is None:
            index = int(self.np_random.integers(0, 2**31 - 1))
        self.setup(int(index))
        self.turns, self.done, self.total_calls, self.total_invalid = 0, False, 0, 0
        obs = sanitize(f"{self.toolset().system_prompt(self.instructions)}\n\n"
                       f"{self.task_text()}", self.max_observation_length)
        self._last_obs = obs
        return obs, self._info(valid=True, calls=0, invalid=0)

    def step(self, action: str):
        if self.done:
            raise RuntimeError("episode is over; call reset()")
        self.turns += 1
        text = action if isinstance(action, str) else str(action)
        cut = len(text) > self.max_action_length
        if cut:
            text = text[: self.max_action_length]
        parsed = parse_tool_calls(text, self.max_calls)
        responses, n_calls, n_invalid = [], 0, 0
        for c in parsed.calls:
            n_calls += 1
            if isinstance(c, CallError):
                n_invalid += 1
                responses.append(tool_response(f"Error: {c.message}"))
                continue
            try:
                responses.append(tool_response(self.toolset().call(c.name, c.arguments)))
            except ToolArgumentError as exc:
                n_invalid += 1
                responses.append(tool_response(f"Error: {exc}"))
            except SandboxError:  # the machinery failed, not the call: never an observation
                raise
            except Exception as exc:  # a tool's own failure is an observation
                responses.append(tool_response(f"Error: {type(exc).__name__}: {exc}"))
        self.total_calls += n_calls
        self.total_invalid += n_invalid
        reward, terminated, extra = 0.0, False, {}
        if parsed.answer is not None:
            reward, extra = self.score_answer(parsed.answer)
            terminated = True
            extra["answered"] = True
        obs = "\n".join(responses) if responses else ("" if terminated else NO_ACTION)
        if cut:
            obs = (f"Note: the response was longer than {self.max_action_length} characters; "
                   f"only the first {self.max_action_length} were read.\n{obs}").rstrip("\n")
        valid = bool(parsed.calls) or terminated
        truncated = not terminated and self.turns >= self.max_turns
        self.done = terminated or truncated
        obs = sanitize(obs, self.max_observation_length)
        self._last_obs = obs
        info = self._info(valid=valid and n_invalid == 0, calls=n_calls, invalid=n_invalid)
        info["action_truncated"] = cut
        info.update(extra)
        info["won"] = bool(terminated and reward >= 1.0)
        return obs, float(reward), terminated, truncated, info

    def _info(self, valid: bool, calls: int, invalid: int) -> dict[str, Any]:
        return {"valid_action": valid, "tool_calls": calls, "invalid_calls": invalid,
                "total_tool_calls": self.total_calls, "total_invalid_calls": self.total_invalid,
                "steps": self.turns, "won": False, **self.task_info()}
