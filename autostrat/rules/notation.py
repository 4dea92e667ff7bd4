"""Parser of the factor notation, einsum style.

    equation := operands "->" operands
    operands := operand ("," operand)*
    operand  := dim*                    (no dims: a scalar)
    dim      := NAME | "1" | "(" NAME NAME+ ")"

A NAME is a factor; ``1`` is a size-1 dim with no factor (broadcasting); a parenthesised group
is a compound dim made of several factors, major first (``"(a b) c -> a b c"`` for a reshape).

Example:
    >>> inputs, outputs = parse_equation("m k, k n -> m n")
    >>> inputs, outputs
    (((('m',), ('k',)), (('k',), ('n',))), ((('m',), ('n',)),))
    >>> parse_equation("(a b) 1 -> a b")[0]
    ((('a', 'b'), ()),)
"""

from __future__ import annotations

import functools
import re

from autostrat.errors import RuleError

Dim = tuple[str, ...]
Operand = tuple[Dim, ...]

_TOKEN = re.compile(r"\s*(?:(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<one>1)|(?P<punct>->|[(),]))")


def _tokens(equation: str) -> list[tuple[str, str, int]]:
    tokens, position = [], 0
    while position < len(equation):
        if equation[position:].strip() == "":
            break
        match = _TOKEN.match(equation, position)
        if not match:
            raise RuleError(f"unexpected character {equation[position:].lstrip()[0]!r} at column {position} in {equation!r}")
        kind = match.lastgroup
        tokens.append((kind, match.group(kind), match.start(kind)))
        position = match.end()
    return tokens


class _Parser:
    def __init__(self, equation: str):
        self.equation = equation
        self.tokens = _tokens(equation)
        self.index = 0

    def error(self, expected: str) -> RuleError:
        if self.index < len(self.tokens):
            _, text, column = self.tokens[self.index]
            return RuleError(f"expected {expected} at column {column} in {self.equation!r}, got {text!r}")
        return RuleError(f"expected {expected} at the end of {self.equation!r}")

    def peek(self) -> str | None:
        return self.tokens[self.index][1] if self.index < len(self.tokens) else None

    def take(self) -> tuple[str, str, int]:
        token = self.tokens[self.index]
        self.index += 1
        return token

    def operands(self, stop: str | None) -> tuple[Operand, ...]:
        operands = [self.operand()]
        while self.peek() == ",":
            self.take()
            operands.append(self.operand())
        if self.peek() != stop:
            raise self.error("',' or '->'" if stop == "->" else "',' or the end")
        return tuple(operands)

    def operand(self) -> Operand:
        dims = []
        while self.peek() not in (None, ",", "->", ")"):
            dims.append(self.dim())
        return tuple(dims)

    def dim(self) -> Dim:
        kind, text, _ = self.take()
        if kind == "name":
            return (text,)
        if kind == "one":
            return ()
        if text != "(":
            self.index -= 1
            raise self.error("a factor name, '1' or '('")
        names = []
        while self.peek() not in (None, ")"):
            kind, text, _ = self.take()
            if kind != "name":
                self.index -= 1
                raise self.error("a factor name inside '( )'")
            names.append(text)
        if self.peek() != ")":
            raise self.error("')'")
        self.take()
        if len(names) < 2:
            raise RuleError(f"a compound dim needs two or more factors, got ({' '.join(names)}) in {self.equation!r}")
        return tuple(names)


def parse_equation(equation: str) -> tuple[tuple[Operand, ...], tuple[Operand, ...]]:
    """Split an equation into (inputs, outputs); each operand is a tuple of dims, each dim a
    tuple of factor names (empty for a size-1 dim). Raises `RuleError` with the column."""
    if not isinstance(equation, str):
        raise RuleError(f"a factor equation is a string such as 'm k, k n -> m n', got {equation!r}")
    return _parsed(equation)


@functools.lru_cache(maxsize=4096)
def _parsed(equation: str) -> tuple[tuple[Operand, ...], tuple[Operand, ...]]:
    # Parsed once per equation text: the result is tuples (immutable), and a 126-layer model's
    # ops and bprops ask for the same few equations ~26 000 times (make_rule, 16 % of tracing).
    parser = _Parser(equation)
    inputs = parser.operands("->")
    parser.take()
    outputs = parser.operands(None)
    for operand in inputs + outputs:
        names = [name for dim in operand for name in dim]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise RuleError(f"factor {repeated[0]!r} appears twice in one operand of {equation!r}")
    return inputs, outputs


def format_operands(operands: tuple[Operand, ...]) -> str:
    """The canonical text of operands: ``m k, k n``."""
    def dim_text(dim: Dim) -> str:
        return "1" if not dim else dim[0] if len(dim) == 1 else "(" + " ".join(dim) + ")"

    return ", ".join(" ".join(dim_text(dim) for dim in operand) for operand in operands)
