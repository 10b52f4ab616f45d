"""``turngym/ToolMath-v0``: arithmetic word problems solved with a calculator and a
sandboxed Python tool; reward 1 when the ``<answer>`` equals the gold number
(relative tolerance 1e-6).  Problems are generated offline from templates with
seeded numbers, so ``reset(seed=i)`` always poses problem i.

The ``python`` tool runs every call in a fresh bubblewrap sandbox (``sandbox.py``,
``docs/sandbox.md``).  ``sandbox=`` takes :class:`SandboxConfig` fields as a dict; the
env checks at construction that the isolation can run here and raises
:class:`SandboxUnavailableError` (naming the opt-in) if not, e.g. on macOS, where only
``sandbox={"isolation": "unsafe-inprocess"}`` (an explicit downgrade) runs.

:meth:`ToolMathEnv.prepare_steps` (the rollout's :class:`~turngym.envs.base.BatchedSteps`
hook) runs the python calls of one turn of many envs concurrently, each still in its own
fresh sandbox; ``step`` then uses those results instead of running the code again."""

from __future__ import annotations

import os
import random
import re
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from .base import ToolEnv
from .calculator import CalculatorError, evaluate
from .calls import ToolCall, parse_tool_calls
from .sandbox import SandboxConfig, SandboxLimits, check_sandbox, run_python
from .schema import ToolArgumentError, ToolSet, tool

_TEMPLATES = [
    ("A shop sells {a} pens at {p:.2f} each and {b} notebooks at {q:.2f} each. "
     "What is the total cost?", lambda a, b, p, q: a * p + b * q),
    ("A tank holds {a} litres and is filled at {p:.2f} litres per minute after losing {b} "
     "litres. How many minutes does refilling the lost water take?", lambda a, b, p, q: b / p),
    ("{a} workers each pack {b} boxes per hour for {q:.2f} hours. How many boxes is that?",
     lambda a, b, p, q: a * b * q),
    ("A price of {p:.2f} rises by {a} percent and then falls by {b} percent. What is the "
     "final price?", lambda a, b, p, q: p * (1 + a / 100) * (1 - b / 100)),
    ("What is the sum of the squares of the integers from 1 to {a}, minus {b}?",
     lambda a, b, p, q: sum(i * i for i in range(1, a + 1)) - b),
]

_NUM = re.compile(r"-?\d+(?:\.\d+)?(?:e-?\d+)?")


@tool
def calculator(expression: str) -> str:
    """Evaluates an arithmetic expression (+ - * / // % ** and sqrt, log, exp, round, ...).

    Args:
        expression: e.g. "12 * 3.5 + sqrt(16)"
    """
    try:
        return str(evaluate(expression))
    except CalculatorError as exc:
        return f"Error: {exc}"


def make_tools(sandbox: SandboxConfig | dict | None = None,
               prefetched: Callable[[str], str | None] | None = None) -> ToolSet:
    """``calculator`` and a ``python`` tool bound to one sandbox config; ``prefetched``
    may hold the result of a call that already ran (see ``prepare_steps``)."""
    config = SandboxConfig.coerce(sandbox)

    @tool
    def python(code: str) -> str:
        """Runs Python code in a sandbox (no network, no files outside its folder, 5 s) and
        returns what it printed.

        Args:
            code: a Python program; print the values you need
        """
        done = prefetched(code) if prefetched is not None else None
        return done if done is not None else run_python(code, SandboxLimits(), config).render()

    return ToolSet([calculator, python])


def make_problem(index: int) -> tuple[str, float]:
    rng = random.Random(index * 7919 + 17)
    text, f = _TEMPLATES[index % len(_TEMPLATES)]
    a, b = rng.randint(2, 60), rng.randint(1, 40)
    p, q = round(rng.uniform(0.5, 20), 2), round(rng.uniform(0.5, 9), 2)
    return text.format(a=a, b=b, p=p, q=q), float(f(a, b, p, q))


def held_out(text: str) -> bool:
    """Whether a problem belongs to the test split: a fixed fifth of all problem texts, so
    no test problem is ever a training problem (one template has only 2,360 distinct ones,
    which a run's training draws would otherwise repeat)."""
    return zlib.crc32(text.encode()) % 5 == 0


_STRIDE = 10 << 32  # a multiple of 5 (the template) beyond any seed


def split_problem(split: str, index: int) -> tuple[int, str, float]:
    """(problem number, text, answer) of the split's ``index``-th task: the first of the
    numbers k = 2 index (+1 for test), k + STRIDE, k + 2 STRIDE, ... whose text is in the
    split (the stride keeps the template, k mod 5, and is beyond any seed, so two indices
    never try the same number)."""
    k = 2 * index + (1 if split == "test" else 0)
    while True:
        text, gold = make_problem(k)
        if held_out(text) == (split == "test"):
            return k, text, gold
        k += _STRIDE


class ToolMathEnv(ToolEnv):
    instructions = ("Solve the problem. Use the tools for arithmetic, then reply with the "
                    "final number as <answer> number </answer>.")

    def __init__(self, split: str = "train", max_turns: int = 6,
                 sandbox: SandboxConfig | dict | None = None, **kw):
        super().__init__(max_turns=max_turns, **kw)
        if split not in ("train", "test"):
            raise ValueError("split must be 'train' or 'test'")
        self.split = split
        self.sandbox = SandboxConfig.coerce(sandbox)
        check_sandbox(self.sandbox)  # refuse now, not at the first python call
        self._prefetched: dict[str, list[str]] = {}
        self.tools = make_tools(self.sandbox, self._take_prefetched)
        self.index, self.question, self.gold = 0, "", 0.0

    # ---------------------------------------------------------------- batched python calls
    def _take_prefetched(self, code: str) -> str | None:
        done = self._prefetched.get(code)
        return done.pop(0) if done else None

    def step(self, action: str):
        try:
            return super().step(action)
        finally:
            self._prefetched = {}  # results belong to this one step

    @classmethod
    def prepare_steps(cls, envs: Sequence[ToolMathEnv], actions: Sequence[str]) -> None:
        """Runs the python calls of one turn of ``envs`` concurrently (as many at once as
        there are cores; each in its own fresh sandbox); their ``step`` uses the results."""
        jobs: list[tuple[ToolMathEnv, str]] = []
        for env, action in zip(envs, actions):
            env._prefetched = {}
            if env.done or not isinstance(action, str):
                continue
            calls = parse_tool_calls(action[: env.max_action_length], env.max_calls).calls
            for c in calls:
                if isinstance(c, ToolCall) and c.name == "python":
                    try:
                        jobs.append((env, env.tools.tools["python"].check(c.arguments)["code"]))
                    except ToolArgumentError:
                        continue
        if len(jobs) < 2:
            return
        with ThreadPoolExecutor(min(len(jobs), max(2, os.cpu_count() or 2))) as ex:
            outs = list(ex.map(lambda j: run_python(j[1], SandboxLimits(), j[0].sandbox).render(),
                               jobs))
        for (env, code), out in zip(jobs, outs):
            env._prefetched.setdefault(code, []).append(out)

    def setup(self, index: int) -> None:
        self._prefetched = {}
        self.index, self.question, self.gold = split_problem(self.split, index)

    def toolset(self) -> ToolSet:
        return self.tools

    def task_text(self) -> str:
        return f"Problem: {self.question}"

    def task_info(self) -> dict:
        return {"task_id": f"{self.split}/math-{self.index}", "gold_answer": [_fmt(self.gold)],
                "task_type": "math"}

    def score_answer(self, answer: str) -> tuple[float, dict]:
        m = _NUM.findall(re.sub(r"(\d)\s*\.\s*(\d)", r"\1.\2", answer.replace(",", "")))
        if not m:
            return 0.0, {"prediction": answer, "correct": False}
        val = float(m[-1])
        ok = abs(val - self.gold) <= 1e-6 * max(1.0, abs(self.gold)) or \
            abs(val - round(self.gold, 2)) < 5e-3
        return float(ok), {"prediction": answer, "correct": ok}

    def oracle_action(self, rng=None, epsilon: float = 0.0) -> str:
        """Computes with the calculator once, then answers with what it returned."""
        if self.total_calls == 0:
            expr = _expression(self.index)
            # spaces around the tags keep word-level tiny tokenizers from gluing '"}}' to them
            return f'<tool_call> {{"name": "calculator", "arguments": {{"expression": "{expr}"}}}} </tool_call>'
        return f"<answer> {_fmt(self.gold)} </answer>"

    def snapshot(self):
        return (self.index, self.question, self.gold, self.turns, self.done, self.total_calls,
                self.total_invalid)

    def restore(self, snap) -> None:
        (self.index, self.question, self.gold, self.turns, self.done, self.total_calls,
         self.total_invalid) = snap
        self._prefetched = {}


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.6g}"


def _expression(index: int) -> str:
    rng = random.Random(index * 7919 + 17)
    a, b = rng.randint(2, 60), rng.randint(1, 40)
    p, q = round(rng.uniform(0.5, 20), 2), round(rng.uniform(0.5, 9), 2)
    return [f"{a} * {p} + {b} * {q}", f"{b} / {p}", f"{a} * {b} * {q}",
            f"{p} * (1 + {a} / 100) * (1 - {b} / 100)",
            f"{a} * ({a} + 1) * (2 * {a} + 1) / 6 - {b}"][index % len(_TEMPLATES)]
