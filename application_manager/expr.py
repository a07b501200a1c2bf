"""A small expression grammar for manifest and SLO constraints; parsed, never evaluated by Python.

The HARNESS original passed `GlobalConstraints` such as `%master_ram > 1024 * %master_cores`
and SLO constraints such as `%cost <= 0.30` to `eval()` (thesis appendix A, §4.2.2). Here
they are parsed by a recursive-descent parser into a tree that only knows numbers,
`%variables`, arithmetic, comparisons and boolean connectives:

    expr    := or
    or      := and (("or" | "||") and)*
    and     := not (("and" | "&&") not)*
    not     := ("not" | "!") not | compare
    compare := sum (("<" | "<=" | ">" | ">=" | "==" | "!=") sum)?
    sum     := product (("+" | "-") product)*
    product := unary (("*" | "/" | "%") unary)*     -- "%" followed by a space is modulo
    unary   := "-" unary | atom
    atom    := NUMBER | %NAME | "(" expr ")" | "true" | "false"

Errors carry the character position so a caller can say where the text is wrong.

Expressions are bounded (MAX_LENGTH characters, MAX_NESTING open parentheses and prefix
operators, trees MAX_DEPTH operators deep): the parser and the walkers below recurse, and
the text comes from users, so an oversized expression must be a parse error rather than a
RecursionError. Arithmetic that has no value (0 / 0, a modulo of infinity) is NaN, and a
NaN is false wherever truth is asked for, so such a constraint is simply not satisfied.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Union

MAX_LENGTH = 1000
MAX_NESTING = 40
MAX_DEPTH = 100


class ExprError(ValueError):
    def __init__(self, message: str, position: int) -> None:
        super().__init__(f"{message} (at character {position + 1})")
        self.position = position


@dataclass(frozen=True)
class Num:
    value: float


@dataclass(frozen=True)
class Var:
    name: str  # with the leading '%'


@dataclass(frozen=True)
class Unary:
    op: str
    operand: Node


@dataclass(frozen=True)
class Binary:
    op: str
    left: Node
    right: Node


Node = Union[Num, Var, Unary, Binary]  # noqa: UP007 - a runtime alias used in isinstance-free code

COMPARISONS = ("<=", ">=", "==", "!=", "<", ">")
_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<num>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<var>%[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op><=|>=|==|!=|&&|\|\||[<>+\-*/()!%])
  | (?P<word>[A-Za-z_]+)
""", re.VERBOSE)
_WORDS = {"and": "&&", "or": "||", "not": "!", "true": "true", "false": "false"}


@dataclass(frozen=True)
class _Tok:
    kind: str
    text: str
    pos: int


def _tokenize(text: str) -> list[_Tok]:
    out: list[_Tok] = []
    i = 0
    while i < len(text):
        m = _TOKEN.match(text, i)
        if not m:
            raise ExprError(f"unexpected character {text[i]!r}", i)
        kind = m.lastgroup or ""
        if kind == "word":
            word = m.group().lower()
            if word not in _WORDS:
                raise ExprError(f"unknown word {m.group()!r}; variables start with '%'", i)
            mapped = _WORDS[word]
            out.append(_Tok("const" if mapped in ("true", "false") else "op", mapped, i))
        elif kind != "ws":
            out.append(_Tok(kind, m.group(), i))
        i = m.end()
    out.append(_Tok("end", "", len(text)))
    return out


class _Parser:
    def __init__(self, text: str) -> None:
        self.toks = _tokenize(text)
        self.i = 0
        self.nesting = 0
        self.depths: dict[int, int] = {}  # id(node) -> operators on its deepest path

    def enter(self, pos: int) -> None:
        self.nesting += 1
        if self.nesting > MAX_NESTING:
            raise ExprError(f"nested too deeply (at most {MAX_NESTING} parentheses, '-' or 'not' inside each "
                            "other); simplify the expression", pos)

    def made(self, node: Node, *children: Node) -> Node:
        depth = 1 + max((self.depths.get(id(c), 0) for c in children), default=0)
        if depth > MAX_DEPTH:
            raise ExprError(f"too many operators in a row (at most {MAX_DEPTH} deep); "
                            "split it into several constraints", self.peek().pos)
        self.depths[id(node)] = depth
        return node

    def peek(self) -> _Tok:
        return self.toks[self.i]

    def take(self) -> _Tok:
        t = self.toks[self.i]
        self.i += 1
        return t

    def accept(self, *ops: str) -> str | None:
        t = self.peek()
        if t.kind == "op" and t.text in ops:
            self.i += 1
            return t.text
        return None

    def parse(self) -> Node:
        if self.peek().kind == "end":
            raise ExprError("empty expression", 0)
        node = self.or_()
        t = self.peek()
        if t.kind != "end":
            raise ExprError(f"unexpected {t.text!r}", t.pos)
        return node

    def or_(self) -> Node:
        node = self.and_()
        while self.accept("||"):
            right = self.and_()
            node = self.made(Binary("or", node, right), node, right)
        return node

    def and_(self) -> Node:
        node = self.not_()
        while self.accept("&&"):
            right = self.not_()
            node = self.made(Binary("and", node, right), node, right)
        return node

    def not_(self) -> Node:
        pos = self.peek().pos
        if self.accept("!"):
            self.enter(pos)
            operand = self.not_()
            self.nesting -= 1
            return self.made(Unary("not", operand), operand)
        return self.compare()

    def compare(self) -> Node:
        node = self.sum_()
        op = self.accept(*COMPARISONS)
        if op:
            right = self.sum_()
            node = self.made(Binary(op, node, right), node, right)
            t = self.peek()
            if t.kind == "op" and t.text in COMPARISONS:
                raise ExprError("chained comparisons are not allowed; join them with 'and'", t.pos)
        return node

    def sum_(self) -> Node:
        node = self.product()
        while True:
            op = self.accept("+", "-")
            if not op:
                return node
            right = self.product()
            node = self.made(Binary(op, node, right), node, right)

    def product(self) -> Node:
        node = self.unary()
        while True:
            op = self.accept("*", "/", "%")
            if not op:
                return node
            right = self.unary()
            node = self.made(Binary(op, node, right), node, right)

    def unary(self) -> Node:
        pos = self.peek().pos
        if self.accept("-"):
            self.enter(pos)
            operand = self.unary()
            self.nesting -= 1
            return self.made(Unary("-", operand), operand)
        return self.atom()

    def atom(self) -> Node:
        t = self.take()
        if t.kind == "num":
            return Num(float(t.text))
        if t.kind == "var":
            return Var(t.text)
        if t.kind == "const":
            return Num(1.0 if t.text == "true" else 0.0)
        if t.kind == "op" and t.text == "(":
            self.enter(t.pos)
            node = self.or_()
            self.nesting -= 1
            close = self.take()
            if not (close.kind == "op" and close.text == ")"):
                raise ExprError("expected ')'", close.pos)
            return node
        if t.kind == "end":
            raise ExprError("unexpected end of expression", t.pos)
        raise ExprError(f"unexpected {t.text!r}", t.pos)


def parse(text: str) -> Node:
    if not isinstance(text, str):
        raise ExprError("expected a string", 0)
    if len(text) > MAX_LENGTH:
        raise ExprError(f"too long: {len(text)} characters, at most {MAX_LENGTH}", MAX_LENGTH)
    return _Parser(text).parse()


def variables(node: Node) -> set[str]:
    if isinstance(node, Var):
        return {node.name}
    if isinstance(node, Unary):
        return variables(node.operand)
    if isinstance(node, Binary):
        return variables(node.left) | variables(node.right)
    return set()


def is_boolean(node: Node) -> bool:
    """True if the expression's top is a comparison or a boolean connective."""
    if isinstance(node, Unary):
        return node.op == "not"
    return isinstance(node, Binary) and (node.op in COMPARISONS or node.op in ("and", "or"))


def evaluate(node: Node, env: dict[str, float]) -> float:
    """Value of the tree (booleans are 1.0 / 0.0). A missing variable is a KeyError."""
    if isinstance(node, Num):
        return node.value
    if isinstance(node, Var):
        return float(env[node.name])
    if isinstance(node, Unary):
        v = evaluate(node.operand, env)
        return -v if node.op == "-" else float(not _truth(v))
    a = evaluate(node.left, env)
    op = node.op
    if op == "and":
        return float(_truth(a) and _truth(evaluate(node.right, env)))
    if op == "or":
        return float(_truth(a) or _truth(evaluate(node.right, env)))
    b = evaluate(node.right, env)
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        return a / b if b else (math.inf if a > 0 else -math.inf if a < 0 else math.nan)
    if op == "%":
        # fmod raises on an infinite dividend; like 0 / 0, the remainder has no value.
        return math.fmod(a, b) if b and math.isfinite(a) and not math.isnan(b) else math.nan
    return float({"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b, "==": a == b, "!=": a != b}[op])


def _truth(x: float) -> bool:
    return x == x and x != 0  # NaN (which bool() calls true) is false


def holds(node: Node, env: dict[str, float]) -> bool:
    return _truth(evaluate(node, env))


def render(node: Node) -> str:
    if isinstance(node, Num):
        return f"{node.value:g}"
    if isinstance(node, Var):
        return node.name
    if isinstance(node, Unary):
        return f"-{render(node.operand)}" if node.op == "-" else f"not {render(node.operand)}"
    return f"({render(node.left)} {node.op} {render(node.right)})"
