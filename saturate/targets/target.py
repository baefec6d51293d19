"""Targets: per-target op costs, preserved ops and composite patterns, read from .target files."""

from __future__ import annotations

import functools
import math
import os
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from saturate.core.errors import SaturateError, SourceError
from saturate.core.inputs import read_regular
from saturate.core.ir import ValueInfo
from saturate.lang.ast import AttrVar, IntList, Loc, Num, OpTerm, Str, Term, Var
from saturate.ops import flops, nbytes, numel
from saturate.targets.composites import composite_cost, egraph_op
from saturate.targets.composites import rules as composite_rules

if TYPE_CHECKING:
    # lark is imported only for a file the plain reader below declines (saturate.targets.target._quick).
    from lark import Token
    from lark.exceptions import UnexpectedInput

# Package data, like the standard rules (saturate.lang.parser.RULES_DIR).
TARGETS_DIR = Path(str(resources.files("saturate") / "rules" / "targets")).resolve()
DEFAULT_TARGET = "cpu"

# A compiled cost formula: shape facts of one node in, cost out.
CostFn = Callable[["_Facts"], float]


@dataclass(frozen=True)
class Composite:
    """A pattern the target runs as one kernel; partitioning turns each match into a function."""

    name: str
    pattern: OpTerm
    loc: Loc


@dataclass
class Target:
    """What one target runs natively and at what cost. `costs[op]` None means unsupported."""

    name: str
    description: str = ""
    domain: str = ""
    costs: dict[str, CostFn | None] = field(default_factory=dict)
    default: CostFn | None = None
    preserve: tuple[str, ...] = ()
    composites: tuple[Composite, ...] = ()
    fold_preserved: bool = True
    file: str = "<string>"

    @property
    def composite_ops(self) -> dict[str, Composite]:
        """Each composite by the op name its e-nodes have in the e-graph (CompositeConvBiasRelu)."""
        # Asked once per e-node priced: built once per tuple of composites.
        held = self.__dict__.get("_composite_ops")
        if held is None or held[0] is not self.composites:
            held = self.__dict__["_composite_ops"] = (self.composites,
                                                      {egraph_op(c.name): c for c in self.composites})
        return held[1]

    def composite_rules(self) -> list:
        """The rules that introduce this target's composite e-nodes (saturate.targets.composites)."""
        return composite_rules(self.composites, f"target {self.name}")

    def supports(self, op: str) -> bool:
        """Whether the target can run `op` at all."""
        return (self.costs[op] if op in self.costs else self.default) is not None

    def node_cost(self, op: str, attrs: dict[str, Any], input_infos: Sequence[ValueInfo],
                  output_info: ValueInfo) -> float | None:
        """Cost of one node on this target; None when the target cannot run it. A composite
        e-node is priced from its pattern (saturate.targets.composites.composite_cost)."""
        comp = self.composite_ops.get(op) if self.composites else None
        if comp is not None:
            c = composite_cost(self, comp.pattern, attrs or {}, list(input_infos), output_info)
            return None if c is None else max(0.0, float(c))
        return self.op_cost(op, attrs, input_infos, output_info)

    def op_cost(self, op: str, attrs: dict[str, Any], input_infos: Sequence[ValueInfo],
                output_info: ValueInfo) -> float | None:
        """Cost of one ONNX op on this target, by its formula; None when it cannot run it."""
        fn = self.costs[op] if op in self.costs else self.default
        if fn is None:
            return None
        return max(0.0, float(fn(_Facts(op, attrs or {}, list(input_infos), output_info))))


# ---- shape facts ---------------------------------------------------------------------------

class _Facts:
    """The shape facts a cost formula may read, computed on demand."""

    __slots__ = ("op", "attrs", "inputs", "out")

    def __init__(self, op: str, attrs: dict[str, Any], inputs: list[ValueInfo], out: ValueInfo):
        self.op, self.attrs, self.inputs, self.out = op, attrs, inputs, out

    def value(self, ref: str) -> ValueInfo | None:
        if ref == "out":
            return self.out
        k = int(ref[2:])
        return self.inputs[k] if k < len(self.inputs) else None


_SCALAR_FACTS: dict[str, Callable[[_Facts], float]] = {
    "flops": lambda f: flops(f.op, f.attrs, f.inputs, f.out),
    "bytes": lambda f: sum(nbytes(i) for i in f.inputs if i is not None) + nbytes(f.out),
    "in_bytes": lambda f: sum(nbytes(i) for i in f.inputs if i is not None),
    "out_bytes": lambda f: nbytes(f.out),
    "numel": lambda f: numel(f.out),
    "inputs": lambda f: len(f.inputs),
}
_VALUE_CALLS = {"numel": lambda v: numel(v), "bytes": lambda v: nbytes(v),
                "rank": lambda v: 0 if v is None or v.shape is None else len(v.shape)}


def _is_value_ref(name: str) -> bool:
    return name == "out" or (name.startswith("in") and name[2:].isdigit())


# ---- parsing -------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _lark_parser() -> Any:
    from lark import Lark

    # Without cache=True, as saturate.lang.parser says why (a pickle in the shared temp directory).
    return Lark.open_from_package("saturate.targets", "targets.lark", parser="lalr", propagate_positions=True)


class _Build:
    """Turns the parse tree into statements: (kind, loc, payload) tuples and compiled costs. The
    reader of plain files (_quick) calls the same methods with the same items lark would."""

    def __init__(self, file: str, text: str):
        super().__init__()
        self.file, self.lines = file, text.splitlines()

    def error(self, tok: Any, message: str) -> SourceError:
        line, col = getattr(tok, "line", 1) or 1, getattr(tok, "column", 1) or 1
        src = self.lines[line - 1] if 0 < line <= len(self.lines) else None
        return SourceError(self.file, line, col, message, src)

    def loc(self, tok: Token) -> Loc:
        return Loc(self.file, tok.line, tok.column)

    # statements
    def start(self, items):
        return list(items)

    def target_decl(self, items):
        return ("target", items[0], (str(items[0]), self._text(items[1]) if len(items) > 1 else ""))

    def _text(self, tok) -> str:
        """A quoted string's text; `saturate targets` prints a description as it is, so a terminal
        escape or carriage return in one is refused."""
        if not str(tok)[1:-1].isprintable():
            raise self.error(tok, "a string here may not hold control characters")
        return str(tok)[1:-1]

    def domain_decl(self, items):
        return ("domain", items[0], ".".join(str(t) for t in items))

    def default_decl(self, items):
        return ("default", None, self._cost(items[0]))

    def _cost(self, item) -> CostFn | None:
        if getattr(item, "type", None) == "UNSUPPORTED":
            return None
        fn, line = self._need(item), item[1].line
        # The formula as written: what follows `=` (an op's cost) or `default` on its line.
        text = self.lines[line - 1].split("#", 1)[0]
        text = text.split("=", 1)[1] if "=" in text else text.strip()[len("default"):]
        where = f"{self.file}:{line}: cost formula '{text.strip()}'"

        def cost(f: _Facts) -> float:
            try:
                # Facts are Python ints: a product of many can pass what a float holds.
                value = float(fn(f))
            except ZeroDivisionError:
                raise SaturateError(f"{where} divides by zero for {_node_text(f)}") from None
            except OverflowError:
                value = math.inf
            if not math.isfinite(value):
                # Extraction would read infinity as a node the target cannot run, NaN as anything.
                raise SaturateError(f"{where} gives {value} for {_node_text(f)}, not a finite cost")
            return value
        return cost

    def preserve_decl(self, items):
        return ("preserve", items[0], tuple(str(t) for t in items))

    def fold_decl(self, items):
        return ("fold", items[0], str(items[0]) == "yes")

    def op_decl(self, items):
        *names, cost = items
        return ("op", names[0], ([(str(n), n) for n in names], self._cost(cost)))

    def composite_decl(self, items):
        name, term = items
        if not isinstance(term, OpTerm):
            raise self.error(name, f"composite '{name}' must be an op pattern, not a bare variable")
        return ("composite", name, Composite(str(name), term, self.loc(name)))

    # cost formulas compile to closures; each node is (fn, token-for-errors)
    def num(self, items):
        v = float(items[0])
        return (lambda f: v), items[0]

    def fact(self, items):
        name = str(items[0])
        if _is_value_ref(name):
            return None, items[0]  # only meaningful as a call argument; _need() rejects it elsewhere
        if name not in _SCALAR_FACTS:
            known = ", ".join(sorted(_SCALAR_FACTS))
            raise self.error(items[0], f"unknown shape fact '{name}' (known: {known}; "
                                       f"or numel(v), bytes(v), rank(v), dim(v, k), max, min)")
        return _SCALAR_FACTS[name], items[0]

    def call(self, items):
        name, args = items[0], [a for a in items[1:] if a is not None]
        fn = str(name)
        if fn in ("max", "min") and args:
            parts = [self._need(a) for a in args]
            pick = max if fn == "max" else min
            return (lambda f: pick(p(f) for p in parts)), name
        refs = [a[1] for a in args]
        if fn in _VALUE_CALLS and len(args) == 1 and _is_value_ref(str(refs[0])):
            ref, get = str(refs[0]), _VALUE_CALLS[fn]
            return (lambda f: get(f.value(ref))), name
        if fn == "dim" and len(args) == 2 and _is_value_ref(str(refs[0])) and refs[1].type == "NUMBER":
            ref, axis = str(refs[0]), float(refs[1])
            if not axis.is_integer():
                raise self.error(refs[1], f"dim's axis must be a whole number, not {refs[1]}")
            k = int(axis)
            return (lambda f: _dim(f.value(ref), k)), name
        raise self.error(name, f"bad call '{fn}(...)': use numel(v), bytes(v), rank(v), dim(v, k), "
                               f"max(a, ...) or min(a, ...) where v is out, in0, in1, ...")

    def _need(self, item) -> CostFn:
        fn, tok = item
        if fn is None:
            raise self.error(tok, f"'{tok}' names a value, not a number: write numel({tok}) or bytes({tok})")
        return fn

    def _binary(self, items, op):
        a, b, tok = self._need(items[0]), self._need(items[1]), items[0][1]
        return (lambda f: op(a(f), b(f))), tok

    def add(self, items):
        return self._binary(items, lambda x, y: x + y)

    def sub(self, items):
        return self._binary(items, lambda x, y: x - y)

    def mul(self, items):
        return self._binary(items, lambda x, y: x * y)

    def div(self, items):
        return self._binary(items, lambda x, y: x / y)     # by zero: _cost names the formula

    def neg(self, items):
        a, tok = self._need(items[0]), items[0][1]
        return (lambda f: -a(f)), tok

    # patterns build rule_ast terms
    def op_term(self, items):
        name, *rest = items
        attrs = ()
        if rest and isinstance(rest[-1], tuple) and rest[-1][:1] == ("attrs",):
            attrs = rest.pop()[1]
        args = tuple(a for a in rest if a is not None)
        return OpTerm(str(name), args, attrs, self.loc(name))

    def const_var(self, items):
        return Var(str(items[0]), const=True, loc=self.loc(items[0]))

    def var(self, items):
        return Var(str(items[0]), loc=self.loc(items[0]))

    def attrs(self, items):
        return ("attrs", tuple(a for a in items if a is not None))

    def attr_num(self, items):
        text = str(items[1])
        return str(items[0]), Num(float(text) if any(c in text for c in ".eE") else int(text))

    def attr_str(self, items):
        return str(items[0]), Str(self._text(items[1]))

    def attr_ints(self, items):
        return str(items[0]), IntList(tuple(int(t) for t in items[1:] if t is not None))


def _node_text(f: _Facts) -> str:
    """The op and output shape a cost formula was priced at, for its errors."""
    shape = "x".join(map(str, f.out.shape)) if f.out is not None and f.out.shape is not None else "?"
    return f"{f.op} (output {shape})"


def _dim(info: ValueInfo | None, k: int) -> int:
    if info is None or info.shape is None or not -len(info.shape) <= k < len(info.shape):
        return 1
    d = info.shape[k]
    return d if isinstance(d, int) else 1


def parse_target(text: str, file: str = "<string>", name: str | None = None) -> Target:
    """Parse the text of a target file; errors name file:line:col with a caret."""
    lines = text.splitlines()
    stmts = _quick(text, file)
    if stmts is None:
        stmts = _lark_statements(text, file, lines)
    return _assemble(stmts, file, name, lines)


@functools.lru_cache(maxsize=None)
def _lark_build() -> type:
    from lark import Transformer

    class _LarkBuild(_Build, Transformer):
        pass

    return _LarkBuild


def _lark_statements(text: str, file: str, lines: list[str]) -> list:
    """The statements of any text by the grammar (targets.lark), or the error lark finds."""
    from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, VisitError

    try:
        tree = _lark_parser().parse(text if text.endswith("\n") else text + "\n")
    except UnexpectedInput as err:
        line, col = getattr(err, "line", 1), getattr(err, "column", 1)
        if isinstance(err, UnexpectedEOF) or line is None or line < 1:
            line, col = max(len(lines), 1), len(lines[-1]) + 1 if lines else 1
        what = f"unexpected character {err.char!r}" if isinstance(err, UnexpectedCharacters) \
            else f"unexpected {_describe(err)}"
        raise SourceError(file, line, col, f"syntax error: {what}",
                          lines[line - 1] if 0 < line <= len(lines) else None) from None
    _check_depth(tree, file, lines)
    try:
        return _lark_build()(file, text).transform(tree)
    except VisitError as err:
        if isinstance(err.orig_exc, SaturateError):
            raise err.orig_exc from None
        raise


# Formulas and patterns are built, and formulas evaluated, recursively: a statement nested deeper
# than this (each + - * / and call is a level, as each op of a pattern) is refused where it is
# written, not left to Python's recursion limit.
MAX_DEPTH = 200


def _check_depth(tree: Any, file: str, lines: list[str]) -> None:
    from lark import Tree

    stack = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            line, col = (node.meta.line, node.meta.column) if not node.meta.empty else (1, 1)
            raise SourceError(file, line, col, f"formula or pattern nested more than {MAX_DEPTH} levels deep",
                              lines[line - 1] if 0 < line <= len(lines) else None)
        stack.extend((child, depth + 1) for child in node.children if isinstance(child, Tree))


# ---- plain files without lark ----------------------------------------------------------------
#
# Importing lark and loading the grammar cost a command more than the rest of reading its target.
# The shipped targets, and most files, are plain: one statement a line in the grammar's words,
# ASCII names and numbers. _quick reads those into the very items lark would give _Build, and
# declines (None) anything else, an error included: lark then reads the text and words the message.

class _Tok(str):
    """A token as lark gives one: its text, with its terminal's name and 1-based line and column."""

    def __new__(cls, text: str, type_: str, line: int, column: int) -> "_Tok":
        tok = super().__new__(cls, text)
        tok.type, tok.line, tok.column = type_, line, column
        return tok


class _Decline(Exception):
    """Not a plain file: lark reads it."""


_TOKEN = re.compile(r'(?P<ws>[ \t]+)|(?P<comment>#.*)|(?P<STRING>"[^"\n]*")'
                    r'|(?P<NUMBER>(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)'
                    r'|(?P<NAME>[A-Za-z_][A-Za-z0-9_]*)|(?P<punct>[-=,()+*/:{}\[\].])')
# Words that are terminals of the grammar somewhere: where lark would read one as a keyword rather
# than a NAME is a question for lark, so a line with one as a NAME is declined.
_WORDS = {"target", "domain", "default", "preserve", "fold", "preserved", "op", "composite", "const",
          "unsupported", "yes", "no"}
# Line breaks of str.splitlines besides \n: lark counts lines by \n alone.
_OTHER_BREAKS = re.compile("[\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")


def _tokens(line: str, number: int) -> list[_Tok]:
    toks, pos = [], 0
    while pos < len(line):
        m = _TOKEN.match(line, pos)
        if m is None:
            raise _Decline()
        kind = m.lastgroup
        if kind == "comment":
            break
        if kind != "ws":
            toks.append(_Tok(m.group(), m.group() if kind == "punct" else kind, number, pos + 1))
        pos = m.end()
    return toks


class _Line:
    """One line's tokens, read left to right."""

    def __init__(self, toks: list[_Tok]):
        self.toks, self.at = toks, 0

    def peek(self, type_: str | None = None) -> _Tok | None:
        tok = self.toks[self.at] if self.at < len(self.toks) else None
        return tok if tok is not None and (type_ is None or tok.type == type_) else None

    def take(self, type_: str) -> _Tok:
        tok = self.peek(type_)
        if tok is None:
            raise _Decline()
        self.at += 1
        return tok

    def name(self) -> _Tok:
        tok = self.take("NAME")
        if tok in _WORDS:
            raise _Decline()
        return tok

    def names(self, sep: str) -> list[_Tok]:
        got = [self.name()]
        while self.peek(sep):
            self.take(sep)
            got.append(self.name())
        return got

    def signed(self, integer: bool) -> _Tok:
        """SIGNED_NUMBER or SIGNED_INT: one token in lark, so a sign touches its digits."""
        sign = self.peek("-") or self.peek("+")
        if sign is not None:
            self.take(sign.type)
        num = self.take("NUMBER")
        if sign is not None and num.column != sign.column + 1:
            raise _Decline()
        if integer and not num.isdigit():
            raise _Decline()
        first = sign or num
        return _Tok((sign or "") + num, "SIGNED_INT" if integer else "SIGNED_NUMBER", first.line, first.column)


def _quick(text: str, file: str) -> list | None:
    """The statements of a plain target text as lark and _Build would make them, or None."""
    if _OTHER_BREAKS.search(text):
        return None
    b = _Build(file, text)
    stmts = []
    try:
        for number, line in enumerate(text.split("\n"), 1):
            toks = _tokens(line, number)
            if len(toks) > MAX_DEPTH:
                return None     # may nest deeper than MAX_DEPTH: lark's reading says where
            if toks:
                stmts.append(_statement(b, _Line(toks)))
    except Exception:   # _Decline, or an error _Build raises: lark's reading raises it as it would
        return None
    return stmts


def _statement(b: _Build, ln: _Line) -> tuple:
    head = ln.take("NAME")
    if head == "fold":
        dash, word = ln.take("-"), ln.take("NAME")
        if word != "preserved" or dash.column != head.column + 4 or word.column != dash.column + 1:
            raise _Decline()
        value = ln.take("NAME")
        if value not in ("yes", "no"):
            raise _Decline()
        stmt = b.fold_decl([_Tok(value, "BOOL", value.line, value.column)])
    elif head == "target":
        items = [ln.name()]
        if ln.peek("STRING"):
            items.append(ln.take("STRING"))
        stmt = b.target_decl(items)
    elif head == "domain":
        stmt = b.domain_decl(ln.names("."))
    elif head == "default":
        stmt = b.default_decl([_cost(b, ln)])
    elif head == "preserve":
        stmt = b.preserve_decl(ln.names(","))
    elif head == "op":
        names = ln.names(",")
        ln.take("=")
        stmt = b.op_decl([*names, _cost(b, ln)])
    elif head == "composite":
        name = ln.name()
        ln.take("=")
        stmt = b.composite_decl([name, _term(b, ln)])
    else:
        raise _Decline()
    if ln.peek() is not None:
        raise _Decline()
    return stmt


def _cost(b: _Build, ln: _Line) -> Any:
    word = ln.peek("NAME")
    if word == "unsupported" and ln.at + 1 == len(ln.toks):
        ln.take("NAME")
        return _Tok(word, "UNSUPPORTED", word.line, word.column)
    return _expr(b, ln)


def _expr(b: _Build, ln: _Line) -> Any:
    left = _product(b, ln)
    while ln.peek("+") or ln.peek("-"):
        op = ln.take(ln.peek().type)
        left = (b.add if op == "+" else b.sub)([left, _product(b, ln)])
    return left


def _product(b: _Build, ln: _Line) -> Any:
    left = _unary(b, ln)
    while ln.peek("*") or ln.peek("/"):
        op = ln.take(ln.peek().type)
        left = (b.mul if op == "*" else b.div)([left, _unary(b, ln)])
    return left


def _unary(b: _Build, ln: _Line) -> Any:
    if ln.peek("-"):
        ln.take("-")
        return b.neg([_unary(b, ln)])
    if ln.peek("NUMBER"):
        return b.num([ln.take("NUMBER")])
    if ln.peek("("):
        ln.take("(")
        inner = _expr(b, ln)
        ln.take(")")
        return inner
    name = ln.name()
    if not ln.peek("("):
        return b.fact([name])
    ln.take("(")
    args: list[Any] = [None]
    if not ln.peek(")"):
        args = [_expr(b, ln)]
        while ln.peek(","):
            ln.take(",")
            args.append(_expr(b, ln))
    ln.take(")")
    return b.call([name, *args])


def _term(b: _Build, ln: _Line) -> Any:
    name = ln.name()
    if ln.peek(":"):
        ln.take(":")
        if ln.take("NAME") != "const":
            raise _Decline()
        return b.const_var([name])
    if not ln.peek("("):
        return b.var([name])
    ln.take("(")
    args: list[Any] = [None]
    if not ln.peek(")"):
        args = [_term(b, ln)]
        while ln.peek(","):
            ln.take(",")
            args.append(_term(b, ln))
    ln.take(")")
    attrs = None
    if ln.peek("{"):
        ln.take("{")
        items: list[Any] = [None]
        if not ln.peek("}"):
            items = [_attr(b, ln)]
            while ln.peek(","):
                ln.take(",")
                items.append(_attr(b, ln))
        ln.take("}")
        attrs = b.attrs(items)
    return b.op_term([name, *args, attrs])


def _attr(b: _Build, ln: _Line) -> Any:
    key = ln.name()
    ln.take("=")
    if ln.peek("STRING"):
        return b.attr_str([key, ln.take("STRING")])
    if not ln.peek("["):
        return b.attr_num([key, ln.signed(integer=False)])
    ln.take("[")
    values: list[Any] = [None]
    if not ln.peek("]"):
        values = [ln.signed(integer=True)]
        while ln.peek(","):
            ln.take(",")
            values.append(ln.signed(integer=True))
    ln.take("]")
    return b.attr_ints([key, *values])


def _describe(err: UnexpectedInput) -> str:
    tok = getattr(err, "token", None)
    if tok is None or tok.type == "$END":
        return "end of file"
    return "end of line" if tok.type == "_NL" else repr(str(tok))


def _assemble(stmts: list, file: str, name: str | None, lines: list[str]) -> Target:
    def fail(tok: Any, message: str) -> SourceError:
        line, col = getattr(tok, "line", 1), getattr(tok, "column", 1)
        return SourceError(file, line, col, message, lines[line - 1] if 0 < line <= len(lines) else None)

    t = Target(name=name or Path(file).stem, file=file, default=_DEFAULT_COST)
    seen_ops: dict[str, Any] = {}
    composites: dict[str, Composite] = {}
    for kind, tok, payload in stmts:
        if kind == "target":
            if name is not None and payload[0] != name:
                raise fail(tok, f"file declares target '{payload[0]}' but is named '{name}'")
            t.name, t.description = payload
        elif kind == "domain":
            t.domain = payload
        elif kind == "default":
            t.default = payload
        elif kind == "preserve":
            t.preserve = tuple(dict.fromkeys(t.preserve + payload))
        elif kind == "fold":
            t.fold_preserved = payload
        elif kind == "op":
            names, cost = payload
            for op, op_tok in names:
                if op in seen_ops:
                    raise fail(op_tok, f"op '{op}' already has a cost (line {seen_ops[op].line})")
                seen_ops[op] = op_tok
                t.costs[op] = cost
        elif kind == "composite":
            if payload.name in composites:
                raise fail(tok, f"composite '{payload.name}' is defined twice")
            clash = next((c for c in composites.values() if egraph_op(c.name) == egraph_op(payload.name)), None)
            if clash is not None:
                raise fail(tok, f"composite '{payload.name}' and '{clash.name}' (line {clash.loc.line}) have "
                                f"one e-graph name, {egraph_op(payload.name)}: rename one")
            _check_pattern(payload, fail, tok)
            composites[payload.name] = payload
    t.domain = t.domain or t.name
    t.composites = tuple(composites.values())
    return t


def _check_pattern(comp: Composite, fail, tok) -> None:
    """A variable bound twice must mean the same value; a const var stays const everywhere."""
    kinds: dict[str, bool] = {}

    def walk(term: Term) -> None:
        if isinstance(term, Var):
            if kinds.setdefault(term.name, term.const) != term.const:
                raise fail(tok, f"composite '{comp.name}': variable '{term.name}' is both const and not")
        elif isinstance(term, OpTerm):
            for _, v in term.attrs:
                if isinstance(v, AttrVar):
                    raise fail(tok, f"composite '{comp.name}': attribute captures are not allowed")
            for a in term.args:
                walk(a)

    walk(comp.pattern)


# Ops a file leaves unlisted cost FLOPs + bytes unless it says `default ...`.
_DEFAULT_COST: CostFn = lambda f: _SCALAR_FACTS["flops"](f) + _SCALAR_FACTS["bytes"](f)


# ---- finding targets -----------------------------------------------------------------------

def target_files() -> dict[str, Path]:
    """Every shipped target by name: rules/targets/*.target, found by glob."""
    return {p.stem: p for p in sorted(TARGETS_DIR.glob("*.target"))}


def load_target(name_or_path: "str | Target | None" = None) -> Target:
    """A shipped target by name (default `cpu`), or a .target file by path."""
    if isinstance(name_or_path, Target):
        return name_or_path
    spec = name_or_path or DEFAULT_TARGET
    path = Path(spec)
    if spec.endswith(".target") or (os.path.exists(path) and not path.is_dir()):
        if not os.path.exists(path):
            raise SaturateError(f"target file '{spec}' does not exist")
        return _parsed(_read_target(path), str(path), None)
    files = target_files()
    if spec not in files:
        raise SaturateError(f"unknown target '{spec}' (available: {', '.join(files) or 'none'})")
    return _parsed(_read_target(files[spec]), str(files[spec]), spec)


# A target file larger than this is refused before it is read (the shipped ones take a few KiB).
MAX_TARGET_BYTES = 4 << 20


def _read_target(path: Path) -> str:
    """The text of a target file: a regular file of at most MAX_TARGET_BYTES, in UTF-8."""
    try:
        return read_regular(path, MAX_TARGET_BYTES, "target file").decode("utf-8")
    except UnicodeDecodeError:
        raise SaturateError(f"target file '{path}': not UTF-8 text") from None


@functools.lru_cache(maxsize=64)
def _parsed(text: str, file: str, name: str | None) -> Target:
    # optimize resolves its target on every call, and parsing the shipped cpu target took
    # 2.5 ms, a twentieth of optimizing a small model. Keyed by the text, so an edited file is
    # parsed again; nothing changes a Target once parse_target has built it.
    if file.endswith(".target"):
        return parse_target(text, file, name)
    # --target can name any file (/etc/passwd): an error quotes nothing of one not named .target.
    try:
        return parse_target(text, file, name)
    except SourceError as err:
        raise SourceError(err.file, err.line, err.col, "not a valid target file (the text of a file whose "
                                                        "name does not end in .target is not shown)") from None


def list_targets() -> list[Target]:
    """All shipped targets, sorted by name."""
    return [load_target(n) for n in target_files()]
