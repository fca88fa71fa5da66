"""A safe arithmetic evaluator: parse with `ast`, allow only numbers, + - * / ** (small), unary minus, parens.

Used to verify Countdown equations and as the calculator tool of `tool_calc`. Exact `Fraction` arithmetic,
so `7/2*2 == 7` and no float surprises; never `eval`, so a completion cannot run code through it.
"""

from __future__ import annotations

import ast
import math
from fractions import Fraction

MAX_EXPR_CHARS = 200
MAX_ABS = 10**12


class CalcError(ValueError):
    """The expression is not plain arithmetic, or its value is out of bounds (message says which)."""


_BINOPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
}


def _eval(node: ast.AST, numbers: list[Fraction]) -> Fraction:
    if isinstance(node, ast.Expression):
        return _eval(node.body, numbers)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        if isinstance(node.value, float) and not math.isfinite(node.value):
            raise CalcError(f"value out of range: {node.value}")
        v = Fraction(str(node.value))
        if abs(v) > MAX_ABS:
            raise CalcError(f"value out of range (|x| > {MAX_ABS})")
        numbers.append(v)
        return v
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _eval(node.operand, numbers)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        a, b = _eval(node.left, numbers), _eval(node.right, numbers)
        if isinstance(node.op, ast.Div) and b == 0:
            raise CalcError("division by zero")
        v = _BINOPS[type(node.op)](a, b)
        if abs(v) > MAX_ABS:
            raise CalcError(f"value out of range (|x| > {MAX_ABS})")
        return v
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        a, b = _eval(node.left, numbers), _eval(node.right, numbers)
        if b.denominator != 1 or abs(b) > 32 or (a == 0 and b < 0):
            raise CalcError("exponent must be a small integer")
        v = a**b.numerator
        if abs(v) > MAX_ABS:
            raise CalcError(f"value out of range (|x| > {MAX_ABS})")
        return Fraction(v)
    raise CalcError(f"not allowed in arithmetic: {type(node).__name__}")


def evaluate(expr: str) -> tuple[Fraction, list[Fraction]]:
    """Value of `expr` and the numbers it used, in order. Raises CalcError with a one-line reason."""
    if not isinstance(expr, str):
        raise CalcError(f"expression must be a string, got {type(expr).__name__}")
    text = expr.strip().replace("×", "*").replace("÷", "/").replace("^", "**")
    if not text:
        raise CalcError("empty expression")
    if len(text) > MAX_EXPR_CHARS:
        raise CalcError(f"expression longer than {MAX_EXPR_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise CalcError(f"not an arithmetic expression: {expr[:60]!r}") from None
    numbers: list[Fraction] = []
    return _eval(tree, numbers), numbers


def format_number(v: Fraction) -> str:
    """An integer as an integer, otherwise a short decimal (tool output the policy can read)."""
    if v.denominator == 1:
        return str(v.numerator)
    return f"{float(v):.6g}"
