"""``turngym/ToolMath-v0``: arithmetic word problems solved with a calculator and a
sandboxed Python tool; reward 1 when the ``<answer>`` equals the gold number
(relative tolerance 1e-6).  Problems are generated offline from templates with
seeded numbers, so ``reset(seed=i)`` always poses problem i."""

from __future__ import annotations

import random
import re

from .base import ToolEnv
from .calculator import CalculatorError, evaluate
from .sandbox import SandboxLimits, run_python
from .schema import ToolSet, tool

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


@tool
def python(code: str) -> str:
    """Runs Python code in a sandbox (no network, no files outside its folder, 5 s) and
    returns what it printed.

    Args:
        code: a Python program; print the values you need
    """
    return run_python(code, SandboxLimits()).render()


TOOLS = ToolSet([calculator, python])


def make_problem(index: int) -> tuple[str, float]:
    rng = random.Random(index * 7919 + 17)
    text, f = _TEMPLATES[index % len(_TEMPLATES)]
    a, b = rng.randint(2, 60), rng.randint(1, 40)
    p, q = round(rng.uniform(0.5, 20), 2), round(rng.uniform(0.5, 9), 2)
    return text.format(a=a, b=b, p=p, q=q), float(f(a, b, p, q))


class ToolMathEnv(ToolEnv):
    instructions = ("Solve the problem. Use the tools for arithmetic, then reply with the "
                    "final number as <answer> number </answer>.")

    def __init__(self, split: str = "train", max_turns: int = 6, **kw):
        super().__init__(max_turns=max_turns, **kw)
        if split not in ("train", "test"):
            raise ValueError("split must be 'train' or 'test'")
        self.split = split
        self.index, self.question, self.gold = 0, "", 0.0

    def setup(self, index: int) -> None:
        # train and test draw disjoint problem numbers
        self.index = 2 * index + (1 if self.split == "test" else 0)
        self.question, self.gold = make_problem(self.index)

    def toolset(self) -> ToolSet:
        return TOOLS

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


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.6g}"


def _expression(index: int) -> str:
    rng = random.Random(index * 7919 + 17)
    a, b = rng.randint(2, 60), rng.randint(1, 40)
    p, q = round(rng.uniform(0.5, 20), 2), round(rng.uniform(0.5, 9), 2)
    return [f"{a} * {p} + {b} * {q}", f"{b} / {p}", f"{a} * {b} * {q}",
            f"{p} * (1 + {a} / 100) * (1 - {b} / 100)",
            f"{a} * ({a} + 1) * (2 * {a} + 1) / 6 - {b}"][index % len(_TEMPLATES)]
