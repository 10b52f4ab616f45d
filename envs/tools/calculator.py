"""A safe calculator: arithmetic parsed with ``ast`` and evaluated node by node.

Only numbers, ``+ - * / // % **``, unary signs, parentheses, the constants
``pi``/``e`` and a few math functions are accepted; names, attributes, calls
of anything else, comprehensions and lambdas are refused before evaluation.
Exponents and results are bounded so ``9**9**9`` is an error, not a hang.
"""

from __future__ import annotations

import ast
import math
import operator
import re

_SPACED_DECIMAL = re.compile(r"(\d)\s*\.\s*(\d)")
MAX_EXPR_CHARS = 500
MAX_EXPONENT = 1000
MAX_ABS = 1e300

_BIN = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
        ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCS = {"sqrt": math.sqrt, "log": math.log, "log10": math.log10, "exp": math.exp,
          "sin": math.sin, "cos": math.cos, "tan": math.tan, "abs": abs, "round": round,
          "min": min, "max": max, "floor": math.floor, "ceil": math.ceil}
_CONSTS = {"pi": math.pi, "e": math.e}


class CalculatorError(ValueError):
    pass


def evaluate(expression: str) -> int | float:
    if not isinstance(expression, str) or not expression.strip():
        raise CalculatorError("empty expression")
    if len(expression) > MAX_EXPR_CHARS:
        raise CalculatorError(f"expression longer than {MAX_EXPR_CHARS} characters")
    # "15 . 4" (word-level detokenisers space out decimals) is the number 15.4
    expression = _SPACED_DECIMAL.sub(r"\1.\2", expression)
    try:
        tree = ast.parse(expression.strip().replace("^", "**"), mode="eval")
    except SyntaxError as exc:
        raise CalculatorError(f"not an arithmetic expression ({exc.msg})") from None
    value = _eval(tree.body)
    # constants and functions are not bounded node by node: 1e400 is inf, 1e400 - 1e400 nan
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError("the result is not a finite number")
    if abs(value) > MAX_ABS:
        raise CalculatorError("result too large")
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value


def _eval(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) \
            and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.Name) and node.id in _CONSTS:
        return _CONSTS[node.id]
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BIN:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise CalculatorError(f"exponent {right} is larger than {MAX_EXPONENT}")
        try:
            out = _BIN[type(node.op)](left, right)
        except ZeroDivisionError:
            raise CalculatorError("division by zero") from None
        except OverflowError:
            raise CalculatorError("result too large") from None
        if isinstance(out, complex):
            raise CalculatorError("complex result")
        if abs(out) > MAX_ABS:
            raise CalculatorError("result too large")
        return out
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
            and node.func.id in _FUNCS and not node.keywords:
        args = [_eval(a) for a in node.args]
        try:
            return _FUNCS[node.func.id](*args)
        except (ValueError, TypeError, OverflowError) as exc:
            raise CalculatorError(f"{node.func.id}: {exc}") from None
    raise CalculatorError(f"'{ast.unparse(node)}' is not allowed in a calculator expression")
