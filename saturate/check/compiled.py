"""Rule checking, the engine's view of a rule: its compiled form, its match decision, its right side.

A rule is checked as the engine runs it. `compile_rules` turns it into egglog text whose rewriting
action is `(union root BODY)`; the engine decides a match with `guards.decide` (attribute tests,
guards, the attribute sets and values the right side is built with) and the fold stage evaluates
BODY's constant expressions with `facts.evaluate_fn`. Here the same three pieces run on a drawn
example: the guards through `decide`, the right side by reading BODY back, so a difference
between how the checker and the engine read a rule cannot arise.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from saturate.core.errors import SaturateError
from saturate.core.ir import Graph, Node
from saturate.engine.compile_rules import compile_rules
from saturate.engine.compiled_rule import CompiledRule
from saturate.engine.encode import Encoding
from saturate.engine.facts import FAILED, evaluate_fn
from saturate.engine.guards import decide
from saturate.lang.ast import OpTerm, Rule, Term
from saturate.ops.registry import domain_of

# Attribute defaults are read at the opset the checker's graphs carry.
OPSET = Graph().opset


@dataclass
class CompiledSide:
    """One direction of a rule as the engine compiled it."""

    cr: CompiledRule
    enc: Encoding
    body: Any                               # the rewriting action's term, as nested lists
    lhs_paths: list[tuple[int, ...]]        # path in the pattern of each of cr.lhs_ops


def directions(rule: Rule) -> list[bool]:
    """The directions the engine compiles the rule in (False: forward, True: right to left)."""
    return [cr.direction == "reverse" for cr in _compile(rule)[0]]


@lru_cache(maxsize=1024)
def compiled(rule: Rule, reverse: bool = False) -> CompiledSide:
    """The compiled form of one direction of `rule` (one object per rule and direction)."""
    crs, enc = _compile(rule)
    want = "reverse" if reverse else "forward"
    for cr in crs:
        if cr.direction == want:
            paths = {id(t): p for p, t in _op_paths(cr.lhs, ())}
            return CompiledSide(cr, enc, _body(cr), [paths[id(t)] for t in cr.lhs_ops])
    raise SaturateError(f"rule '{rule.name}' is not compiled {want}")


@lru_cache(maxsize=1024)
def _compile(rule: Rule) -> tuple[list[CompiledRule], Encoding]:
    enc = Encoding(graph=Graph())
    return compile_rules([rule], enc), enc


def _op_paths(t: Term, path: tuple[int, ...]) -> list[tuple[tuple[int, ...], OpTerm]]:
    if not isinstance(t, OpTerm):
        return []
    found = [x for k, a in enumerate(t.args) for x in _op_paths(a, path + (k,))]
    return found + [(path, t)]


def _body(cr: CompiledRule) -> Any:
    """The term the rewriting rule unions with the match's root."""
    text = (cr.apply_text or cr.text)[-1]
    start = text.index("(union root ") + len("(union root ")
    term, _ = _parse(text, start)
    return term


def _parse(text: str, i: int) -> tuple[Any, int]:
    """One s-expression of egglog text from position i: a list, or an atom as a string."""
    while text[i] == " ":
        i += 1
    if text[i] == "(":
        items, i = [], i + 1
        while True:
            while text[i] == " ":
                i += 1
            if text[i] == ")":
                return items, i + 1
            item, i = _parse(text, i)
            items.append(item)
    j = i
    while text[j] not in " ()":
        j += 1
    return text[i:j], j


# ---- deciding a drawn match ------------------------------------------------------------------

class ExampleBindings:
    """A drawn example's variables as the engine's facts would report them: constants have
    values, every variable its static shape and dtype."""

    def __init__(self, values: dict[str, np.ndarray], consts: frozenset[str]):
        self.values, self.consts = values, consts

    def value(self, var: str) -> Any:
        return self.values[var] if var in self.consts else None

    def shape(self, var: str) -> tuple | None:
        return tuple(self.values[var].shape)

    def dtype(self, var: str) -> str | None:
        return self.values[var].dtype.name

    def is_const(self, var: str) -> bool:
        return var in self.consts

    def stored(self, var: str) -> bool:
        return var in self.consts

    def dims(self, var: str) -> tuple | None:
        return self.shape(var)

    def data(self, var: str) -> tuple | None:
        a = self.values[var]
        if not np.issubdtype(a.dtype, np.integer) or a.ndim > 1:
            return None
        return tuple(int(x) for x in a.ravel())


def lhs_attrs(side: CompiledSide, node_attrs: dict[tuple[int, ...], dict]) -> list[dict]:
    """The attribute sets of the matched nodes in `cr.lhs_ops` order, as a graph stores them
    (an omitted attribute is absent)."""
    return [{k: v for k, v in node_attrs.get(p, {}).items() if v is not None} for p in side.lhs_paths]


def decide_example(side: CompiledSide, values: dict[str, np.ndarray], consts: frozenset[str],
                   node_attrs: dict[tuple[int, ...], dict]) -> tuple[list[dict], list[Any]] | None:
    """The engine's decision on a drawn match (None: the rule does not fire on it)."""
    return decide(side.cr, ExampleBindings(values, consts), lhs_attrs(side, node_attrs), OPSET)


# ---- the right side ------------------------------------------------------------------------

class RightSideError(Exception):
    """The compiled right side cannot be built on this match (a constant expression numpy
    refuses); the engine would drop the rewrite, the checker reports the rule."""


def build_rhs(side: CompiledSide, decision: tuple[list[dict], list[Any]], values: dict[str, np.ndarray],
              consts: frozenset[str], node_attrs: dict[tuple[int, ...], dict], opset: int = OPSET) -> Graph:
    """The graph of the compiled right side on one match: `values` are the bound variables
    (widened as the checker runs them), `decision` what `decide_example` returned."""
    cr, enc = side.cr, side.enc
    computed, extras = decision
    matched = lhs_attrs(side, node_attrs)
    columns = dict(zip([r.column for r in cr.rhs_ops if r.column], computed))
    extra = dict(zip([c for c, _ in cr.extras], extras))
    g = Graph(name="rhs", opset=opset)
    counter = [0]

    def fresh(prefix: str) -> str:
        counter[0] += 1
        return f"{prefix}{counter[0]}"

    def constant(value: Any) -> str:
        arr = np.asarray(value)
        # ml_dtypes' types (float8_e5m2 claims kind "f") stay: widened they would be another type.
        if arr.dtype.kind in "fb" and arr.dtype.isbuiltin == 1:
            arr = arr.astype(np.float64)
        name = fresh("k")
        g.constants[name] = arr
        return name

    def attrs_of(atom: str) -> dict:
        if atom.startswith("a_"):
            return dict(matched[int(atom[2:])])
        if atom.startswith("r_"):
            return dict(columns[atom])
        return dict(enc.attr_sets[int(atom)][1])

    def value(t: Any) -> Any:
        """The value of a constant subterm (a constant variable, literal, extra or expression)."""
        if isinstance(t, str):
            if t.startswith("v_"):
                name = t[2:]
                if name not in consts:
                    raise SaturateError(f"'{name}' is not a constant but a constant expression reads it")
                return values[name]
            return extra[t]
        head = t[0]
        if head == "Lit":
            return enc.lits[int(t[1])]
        fn = head[2:].rsplit("_", 1)[0]
        out = evaluate_fn(fn, [value(a) for a in t[1:]])
        if out is FAILED:
            raise RightSideError(f"the constant expression {fn}(...) cannot be evaluated")
        return out

    def visit(t: Any) -> str:
        if isinstance(t, str) and t.startswith("v_"):
            name = t[2:]
            if name in consts:
                g.constants.setdefault(name, values[name])
            elif name not in g.inputs:
                g.inputs.append(name)
            return name
        if isinstance(t, list) and t[0].startswith("Op_"):
            op = t[0][3:].rsplit("_", 1)[0]
            inputs = [visit(a) for a in t[2:]]
            out = fresh("t")
            g.nodes.append(Node(op, inputs, [out], attrs_of(t[1]), name=f"{op}{counter[0]}", domain=domain_of(op)))
            return out
        v = value(t)
        return constant(np.asarray(v) if not isinstance(v, tuple) else np.asarray(v, np.int64))

    root = visit(side.body)
    g.outputs = [root] + [n.outputs[0] for n in g.nodes if n.outputs[0] != root]
    return g
