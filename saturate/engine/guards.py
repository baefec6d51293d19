"""Run stage, guards: check candidate matches on concrete constants and shapes, emit `Ok` rows."""

from __future__ import annotations

import time
from typing import Any, Protocol

import numpy as np

from saturate.lang.builtins import CONST_FUNCS, to_attribute
from saturate.lang.guard_builtins import GUARDS
from saturate.lang.query_builtins import QUERIES
from saturate.engine.egraph import EGraphView
from saturate.engine.encode import Encoding, Rows
from saturate.engine import fold_any
from saturate.engine.compiled_rule import CompiledRule
from saturate.engine.facts import FAILED, ConstantTooLarge, Facts, evaluate_fn
from saturate.core.errors import SaturateError
from saturate.lang import fold
from saturate.lang.ast import AttrVar, Call, IntList, Num, OpTerm, Str, Term, Var


class _Undecided(Exception):
    """A guard argument is unknown (symbolic shape, value not computable): the rule does not fire."""


class Checker:
    """Decides candidate matches once each and names the e-classes an `Ok` row refers to."""

    def __init__(self, eg: Any, enc: Encoding):
        self.eg, self.enc = eg, enc
        self.seen: set = set()
        self.undecided: dict[tuple, list] = {}   # candidate -> the reads it was left undecided on
        self.applying: set[int] = set()          # rules whose apply rule is declared
        self.cut = False

    def check(self, rules: list[CompiledRule], view: EGraphView, facts: Facts,
              deadline: float | None = None) -> Rows:
        """Rows inserting an `Ok` row for every new candidate whose guards hold (and a Ref for
        each e-class one names that had none).

        Past `deadline` (a time.perf_counter() value) it returns what it has decided: the
        candidates it did not reach stay undecided, for a later call, and `cut` says so."""
        self.view, self.facts = view, facts
        self.cut = False
        self.refs = dict(view.refs)
        self.rows = rows = Rows()
        to_i64 = self.eg.value_to_i64
        for cr in rules:
            nv, na = len(cr.vars), len(cr.lhs_ops)
            for row in view.relations.get(f"Cand_{cr.index}", ()):
                key = (cr.index, row)
                if key in self.seen:
                    continue
                if deadline is not None and time.perf_counter() > deadline:
                    self.cut = True
                    return rows
                env = dict(zip(cr.vars, row[1:1 + nv]))
                earlier = self.undecided.get(key)
                if earlier is not None and _FactsBindings(self.facts, self.view, env).reads_same(earlier):
                    continue            # nothing it read has changed: still undecided
                self.seen.add(key)
                attr_ids = [to_i64(v) for v in row[1 + nv:1 + nv + na]]
                bindings = _FactsBindings(self.facts, self.view, env)
                cols = self._decide(cr, bindings, attr_ids)
                if cols is None:
                    if bindings.partial:
                        # Decided on facts still growing (a shape with unknown dims, a value not
                        # yet computable): later iterations may know more, so ask again.
                        self.seen.discard(key)
                        self.undecided[key] = bindings.log
                    continue
                self.undecided.pop(key, None)
                refs = [self.ref(c) for c in row[:1 + nv]]
                if None in refs:
                    self.seen.discard(key)   # no spelling yet (cycles only): try next iteration
                    continue
                if cr.index not in self.applying:
                    self.applying.add(cr.index)
                    self.enc.declare_late(f"Ok_{cr.index}", "\n".join(cr.apply_text), rows.commands)
                rows.add_ints(f"Ok_{cr.index}", *refs, *attr_ids, *cols)
        return rows

    # ---- deciding one match -------------------------------------------------------------
    def _decide(self, cr: CompiledRule, bindings: _FactsBindings, attr_ids: list[int]) -> list[int] | None:
        node = None
        if cr.fold:
            node, attrs = fold_any.matched(cr, self.enc, attr_ids)
        else:
            attrs = [self.enc.attr_sets[a][1] for a in attr_ids]
        got = decide(cr, bindings, attrs, self.enc.graph.opset, node)
        if got is None:
            return None
        computed, extras = got
        columns = [r for r in cr.rhs_ops if r.column]
        return ([self.enc.attr_id(r.op, a) for r, a in zip(columns, computed)]
                + [self.enc.lit_id(v) for v in extras])

    # ---- naming e-classes ---------------------------------------------------------------
    def ref(self, cls: Any) -> int | None:
        """The k of a `(Ref k)` handle of `cls`; an e-class without one gets a new handle, by a
        row of `self.rows` that unites it with one of the class's e-nodes over its children's
        handles (named the same way, so a shared sub-term is named once)."""
        got = self.refs.get(cls)
        return got if got is not None else self._new_ref(cls, set())

    def _new_ref(self, cls: Any, visiting: set) -> int | None:
        # `visiting` holds the e-classes on the way down: an e-node reading one of them is a cycle.
        visiting.add(cls)
        refs = self.refs
        for node in sorted(self.view.classes.get(cls, ()), key=lambda n: len(n.children)):
            if any(c in visiting for c in node.children):
                continue
            kids = []
            for c in node.children:
                got = refs.get(c)
                if got is None and (got := self._new_ref(c, visiting)) is None:
                    break
                kids.append(got)
            else:
                visiting.discard(cls)
                got = refs[cls] = self.enc.new_ref()
                self.enc.node_row(self.rows, got, node.kind, node.head, node.key, kids)
                return got
        visiting.discard(cls)
        return None


class Bindings(Protocol):
    """What a match binds each pattern variable to, as the guards read it."""

    def value(self, var: str) -> Any:
        """The variable's constant value (None when it is not a known constant)."""

    def shape(self, var: str) -> tuple | None:
        """Its static shape (None when unknown)."""

    def dtype(self, var: str) -> str | None:
        """Its dtype name (None when unknown)."""

    def is_const(self, var: str) -> bool:
        """Whether it is a constant or a constant expression."""

    def stored(self, var: str) -> bool:
        """Whether it is a constant the model stores (not one a rule computed)."""

    def dims(self, var: str) -> tuple | None:
        """Its shape, unknown dims as symbols (see saturate.lang.builtins; None: rank unknown)."""

    def data(self, var: str) -> tuple | None:
        """The elements of a small integer value, unknown ones as dim symbols (None: unknown)."""


class _FactsBindings:
    """A candidate row's variables read through the e-graph's facts; every read is logged, so
    a candidate decided on partial facts is decided again only once one of them changed."""

    def __init__(self, facts: Facts, view: EGraphView, env: dict):
        self.facts, self.view, self.env = facts, view, env
        self.partial = False   # whether a fact read may still become known in a later iteration
        self.log: list[tuple[str, str, Any]] = []

    def _read(self, kind: str, var: str, got: Any, partial: bool) -> Any:
        """Log one read and whether it may still become known; returns what was read."""
        self.partial |= partial
        self.log.append((kind, var, got))
        return got

    def value(self, var: str) -> Any:
        got = self.facts.value(self.env[var])
        return self._read("value", var, got, got is None)

    def shape(self, var: str) -> tuple | None:
        got = self.facts.shape(self.env[var])
        return self._read("shape", var, got, not _all_known(got))

    def dtype(self, var: str) -> str | None:
        return self._read("dtype", var, self.facts.info(self.env[var]).dtype, False)

    def is_const(self, var: str) -> bool:
        return self._read("is_const", var, self.env[var] in self.view.consts, False)

    def stored(self, var: str) -> bool:
        stored = self.facts.enc.graph.constants
        return self._read("stored", var, any(n in stored for n in self.facts.names.get(self.env[var], ())), False)

    def absent(self, var: str) -> bool:
        """Whether the variable is an omitted optional input (an opaque node's)."""
        return self.env[var] in self.view.absent

    def dims(self, var: str) -> tuple | None:
        got = self.facts.dims(self.env[var])
        return self._read("dims", var, got, not _all_known(got))

    def data(self, var: str) -> tuple | None:
        got = self.facts.data(self.env[var])
        return self._read("data", var, got, not _all_known(got))

    def reads_same(self, log: list[tuple[str, str, Any]]) -> bool:
        """Whether every read of an earlier decision gives the same answer now. A value is the
        same object while its constant expression is (Facts caches values by structure)."""
        for method, var, was in log:
            now = getattr(self, method)(var)
            if not (now is was if method == "value" else now == was):
                return False
        return True


def decide(cr: CompiledRule, bindings: Bindings, attrs: list[dict], opset: int,
           node: fold.Matched | None = None) -> tuple[list[dict], list[Any]] | None:
    """Whether a match of `cr`'s pattern fires, and what its right side is built with.

    `attrs` are the attribute sets of the matched nodes, in `cr.lhs_ops` order. None when an
    attribute the pattern writes differs, a guard fails, or one cannot be decided; otherwise the
    attribute set of every right-hand op with a computed column (`cr.rhs_ops` order) and the
    value of every extra column (`cr.extras` order). The engine and `saturate check` both decide
    matches here, so a rule is checked exactly as it fires. An instance of the rule of any op
    reads its matched `node` (saturate.engine.fold_any; by default the op of its pattern)."""
    ev = _Evaluator(bindings)
    try:
        if node is None and fold_any.is_instance(cr.rhs):
            node = fold.Matched(cr.lhs_ops[0].op, dict(attrs[0]), opset=opset)
        if node is not None:
            absent = getattr(bindings, "absent", None)
            node.inputs = [None if absent is not None and absent(v) else ev.eval(Var(v)) for v in cr.vars]
            ev.matched = node
        for term, a in zip(cr.lhs_ops, attrs):
            if not _attrs_match(term, a, ev.captured, opset):
                return None
        for g in cr.rule.guards:
            fn = GUARDS[g.fn]
            args = [ev.arg(t, kind) for t, kind in zip(g.args, fn.params)]
            try:
                held = fn.impl(*args)
            except (ValueError, TypeError, IndexError, ZeroDivisionError, OverflowError):
                # numpy refuses the values (scales that do not broadcast together, for
                # fine_accumulator): the guard does not hold, as a refused constant expression
                # leaves a rule unfired
                return None
            if not held:
                return None
        computed = []
        for r in cr.rhs_ops:
            if r.column:
                base = dict(attrs[r.inherit]) if r.inherit is not None else {}
                for k, v in r.overrides:
                    val = ev.eval(v)
                    if val is None:
                        base.pop(k, None)      # an omitted attribute stays omitted
                    elif isinstance(v, (Var, Call)):
                        base[k] = _computed_attribute(r.op, k, val)
                    else:
                        base[k] = list(val) if isinstance(val, tuple) else val
                computed.append(base)
        return computed, [ev.eval(term) for _, term in cr.extras]
    except _Undecided:
        return None
    except ConstantTooLarge:       # a value of the e-graph: it names the rules that build it
        raise
    except SaturateError as err:   # a guard's or an attribute's constant expression over --max-memory
        loc = cr.rule.loc
        raise SaturateError(f"{loc.file}:{loc.line}:{loc.col}: rule '{cr.rule.name}': {err}") from None


def _computed_attribute(op: str, key: str, value: Any) -> Any:
    """A value computed for an attribute, as the attribute's ONNX type holds it; a value it
    cannot hold (two elements for a FLOAT, 0.5 for an INT) leaves the rule unfired."""
    from saturate.ops.schema import attribute_type   # onnx: loaded where a run needs it

    try:
        return to_attribute(attribute_type(op, key), value)
    except ValueError:
        raise _Undecided from None


def _all_known(elements: tuple | None) -> bool:
    """Whether a shape or a value's elements are all numbers (no symbol, not unknown)."""
    return elements is not None and all(isinstance(d, int) for d in elements)


def attr_rows(enc: Encoding, rules: list[CompiledRule], start: int) -> list[str]:
    """egglog rows of the rules' attribute-test relations for the attribute sets from index
    `start` on: a row where the set passes the test, with what the pattern captures from it,
    decided by `_attrs_match` as a candidate's attributes are."""
    tests: dict[str, list] = {}
    for cr in rules:
        for t in cr.attr_tests:
            tests.setdefault(t.term.op, []).append(t)
    rows = []
    opset = enc.graph.opset
    for set_id in range(start, len(enc.attr_sets)):
        op, attrs = enc.attr_sets[set_id]
        for t in tests.get(op, ()):
            captured: dict[str, Any] = {}
            if _attrs_match(t.term, attrs, captured, opset):
                lits = [f"(Lit {enc.lit_id(captured[n])})" for n in t.captures]
                rows.append(f"({' '.join([t.relation, str(set_id)] + lits)})")
    return rows


def _attrs_match(term: OpTerm, attrs: dict, captured: dict, opset: int) -> bool:
    from saturate.ops.schema import spec   # onnx: loaded where a run needs it

    s = spec(term.op, opset)
    defaults = s.attrs if s else {}
    for key, want in term.attrs:
        raw = attrs.get(key, defaults.get(key))
        have = _plain(raw)
        if isinstance(want, AttrVar):
            if want.name in captured:
                if _plain(captured[want.name]) != have:
                    return False
            else:
                # A tensor attribute (ConstantOfShape's value) keeps its dtype for the
                # functions it is passed to; comparisons read it as plain values.
                captured[want.name] = raw if isinstance(raw, np.ndarray) else have
        elif have != _plain(_literal(want)):
            return False
    return True


class _Evaluator:
    """Guard arguments and right-hand values of one match."""

    def __init__(self, bindings: Bindings):
        self.b = bindings
        self.captured: dict[str, Any] = {}
        self.matched: fold.Matched | None = None     # the node an instance of fold-any matched

    def arg(self, term: Term, kind: str) -> Any:
        if kind in ("op", "list"):
            if self.matched is None:
                raise _Undecided
            return self.matched if kind == "op" else self.matched.inputs
        if kind == "value":
            return self.shape(term)
        if kind in ("dims", "data"):
            if not isinstance(term, Var):
                raise _Undecided
            got = self.b.dims(term.name) if kind == "dims" else self.b.data(term.name)
            if got is None:
                raise _Undecided
            return got
        if kind == "isconst":
            if not isinstance(term, Var):
                raise _Undecided
            return self.b.is_const(term.name)
        if kind == "stored":
            if not isinstance(term, Var):
                raise _Undecided
            return self.b.stored(term.name)
        if kind == "type":
            if not isinstance(term, Var):
                raise _Undecided
            dtype = self.b.dtype(term.name)
            if dtype is None:
                raise _Undecided
            return dtype
        val = self.eval(term)
        if kind == "int":
            return int(np.asarray(val).reshape(())) if val is not None else None
        if kind == "ints":
            return None if val is None else tuple(int(x) for x in np.asarray(val).ravel())
        return val

    def shape(self, term: Term) -> tuple:
        if isinstance(term, Var):
            shape = self.b.shape(term.name)
        else:
            shape = np.shape(self.eval(term))
        if shape is None:
            raise _Undecided
        return tuple(shape)

    def eval(self, term: Term) -> Any:
        """Python value of a guard or right-hand term: constants, literals, attributes, queries."""
        if isinstance(term, Var):
            val = self.b.value(term.name)
            if val is None:
                raise _Undecided
            return val
        if isinstance(term, (Num, Str, IntList)):
            return _plain(_literal(term))
        if isinstance(term, AttrVar):
            return self.captured.get(term.name)
        if isinstance(term, Call) and term.fn == fold.SPEC and self.matched is not None:
            return self.matched.spec
        if isinstance(term, Call) and term.fn in QUERIES:
            q = QUERIES[term.fn]
            out = q.impl(*[self.arg(t, k) for t, k in zip(term.args, q.params)])
            if out is None:
                raise _Undecided
            return out
        if isinstance(term, Call) and term.fn in CONST_FUNCS:
            out = evaluate_fn(term.fn, [self.eval(t) for t in term.args])
            if out is FAILED:
                raise _Undecided
            return out
        raise _Undecided


def _literal(v: Any) -> Any:
    return tuple(v.values) if isinstance(v, IntList) else v.value


def _plain(v: Any) -> Any:
    """Attribute values compared as plain Python: lists as tuples, bytes as str."""
    if isinstance(v, (list, tuple, np.ndarray)):
        return tuple(_plain(x) for x in (v.tolist() if isinstance(v, np.ndarray) else v))
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, np.generic):
        return v.item()
    return v
