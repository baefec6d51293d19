"""Run stage, guards: check candidate matches on concrete constants and shapes, emit `Ok` rows."""

from __future__ import annotations

from typing import Any

import numpy as np

from saturate.lang.builtins import CONST_FUNCS, GUARDS, QUERIES
from saturate.engine.egraph import EGraphView, ENode
from saturate.engine.encode import Encoding, egg_str, k_ctor, op_ctor, opaque_ctor
from saturate.engine.compile_rules import CompiledRule
from saturate.engine.facts import FAILED, Facts, evaluate_fn
from saturate.core.ops import spec
from saturate.lang.ast import AttrVar, Call, IntList, Num, OpTerm, Str, Term, Var


class _Undecided(Exception):
    """A guard argument is unknown (symbolic shape, value not computable): the rule does not fire."""


class Checker:
    """Decides candidate matches once each and names the e-classes an `Ok` row refers to."""

    def __init__(self, eg: Any, enc: Encoding):
        self.eg, self.enc = eg, enc
        self.seen: set = set()

    def check(self, rules: list[CompiledRule], view: EGraphView, facts: Facts) -> list[str]:
        """egglog commands inserting an `Ok` row for every new candidate whose guards hold."""
        self.view, self.facts = view, facts
        self.names = {cls: name for name, cls in view.lets.items()}
        self.commands: list[str] = []
        to_i64 = self.eg.value_to_i64
        for cr in rules:
            nv, na = len(cr.vars), len(cr.lhs_ops)
            for row in view.relations.get(f"Cand_{cr.index}", ()):
                key = (cr.index, row)
                if key in self.seen:
                    continue
                self.seen.add(key)
                env = dict(zip(cr.vars, row[1:1 + nv]))
                attr_ids = [to_i64(v) for v in row[1 + nv:1 + nv + na]]
                cols = self._decide(cr, env, attr_ids)
                if cols is None:
                    continue
                refs = [self.name(c) for c in row[:1 + nv]]
                if None in refs:
                    self.seen.discard(key)   # no spelling yet (cycles only): try next iteration
                    continue
                ints = [str(a) for a in attr_ids] + cols
                self.commands.append(f"(Ok_{cr.index} {' '.join(refs + ints)})")
        return self.commands

    # ---- deciding one match -------------------------------------------------------------
    def _decide(self, cr: CompiledRule, env: dict, attr_ids: list[int]) -> list[str] | None:
        attrs = [self.enc.attr_sets[a][1] for a in attr_ids]
        captured: dict[str, Any] = {}
        try:
            for term, a in zip(cr.lhs_ops, attrs):
                if not self._attrs_match(term, a, captured):
                    return None
            for g in cr.rule.guards:
                fn = GUARDS[g.fn]
                args = [self._arg(t, kind, env, captured) for t, kind in zip(g.args, fn.params)]
                if not fn.impl(*args):
                    return None
            cols = []
            for r in cr.rhs_ops:
                if r.column:
                    base = dict(attrs[r.inherit]) if r.inherit is not None else {}
                    for k, v in r.overrides:
                        val = self._eval(v, env, captured)
                        if val is None:
                            base.pop(k, None)      # an omitted attribute stays omitted
                        else:
                            base[k] = list(val) if isinstance(val, tuple) else val
                    cols.append(str(self.enc.attr_id(r.op, base)))
            for _, term in cr.extras:
                val = self._eval(term, env, captured)
                cols.append(f"(Lit {self.enc.lit_id(val)})")
            return cols
        except _Undecided:
            return None

    def _attrs_match(self, term: OpTerm, attrs: dict, captured: dict) -> bool:
        s = spec(term.op, self.enc.graph.opset)
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

    def _arg(self, term: Term, kind: str, env: dict, captured: dict) -> Any:
        if kind == "value":
            return self._shape(term, env, captured)
        if kind == "isconst":
            if not isinstance(term, Var):
                raise _Undecided
            return env[term.name] in self.view.consts
        if kind == "type":
            if not isinstance(term, Var):
                raise _Undecided
            dtype = self.facts.info(env[term.name]).dtype
            if dtype is None:
                raise _Undecided
            return dtype
        val = self._eval(term, env, captured)
        if kind == "int":
            return int(np.asarray(val).reshape(())) if val is not None else None
        if kind == "ints":
            return None if val is None else tuple(int(x) for x in np.asarray(val).ravel())
        return val

    def _shape(self, term: Term, env: dict, captured: dict) -> tuple:
        if isinstance(term, Var):
            shape = self.facts.shape(env[term.name])
        else:
            shape = np.shape(self._eval(term, env, captured))
        if shape is None:
            raise _Undecided
        return tuple(shape)

    def _eval(self, term: Term, env: dict, captured: dict) -> Any:
        """Python value of a guard or right-hand term: constants, literals, attributes, queries."""
        if isinstance(term, Var):
            val = self.facts.value(env[term.name])
            if val is None:
                raise _Undecided
            return val
        if isinstance(term, (Num, Str, IntList)):
            return _plain(_literal(term))
        if isinstance(term, AttrVar):
            return captured.get(term.name)
        if isinstance(term, Call) and term.fn in QUERIES:
            q = QUERIES[term.fn]
            args = [self._arg(t, k, env, captured) for t, k in zip(term.args, q.params)]
            out = q.impl(*args)
            if out is None:
                raise _Undecided
            return out
        if isinstance(term, Call) and term.fn in CONST_FUNCS:
            out = evaluate_fn(term.fn, [self._eval(t, env, captured) for t in term.args])
            if out is FAILED:
                raise _Undecided
            return out
        raise _Undecided

    # ---- naming e-classes ---------------------------------------------------------------
    def name(self, cls: Any, visiting: frozenset = frozenset()) -> str | None:
        """egglog text for `cls`: its `(Ref k)` handle, or a term over one of its e-nodes.

        New e-classes are spelled inline (one command per Ok row costs far less than one per
        class); a long spelling gets a handle of its own so text stays short.
        """
        got = self.names.get(cls)
        if got is not None:
            return got
        for node in sorted(self.view.classes.get(cls, ()), key=lambda n: len(n.children)):
            if any(c in visiting or c == cls for c in node.children):
                continue
            kids = [self.name(c, visiting | {cls}) for c in node.children]
            if any(k is None for k in kids):
                continue
            text = _term(node, kids)
            if len(text) > 300:
                ref = self.enc.new_ref()
                self.commands.append(f"(union {ref} {text})")
                text = ref
            self.names[cls] = text
            return text
        return None


def _term(node: ENode, kids: list[str]) -> str:
    """egglog text of one e-node over its children's texts."""
    if node.kind == "inp":
        return f"(Inp {egg_str(node.key)})"
    if node.kind == "const":
        return f"(Const {egg_str(node.key)})"
    if node.kind == "lit":
        return f"(Lit {node.key})"
    if node.kind == "absent":
        return "(Absent)"
    if node.kind == "out":
        return f"(Out {node.key} {kids[0]})"
    if node.kind == "opq":
        return f"({opaque_ctor(len(kids))} {node.key} {' '.join(kids)})"
    if node.kind == "k":
        return f"({k_ctor(node.head, len(kids))} {' '.join(kids)})"
    return f"({op_ctor(node.head, len(kids))} {node.key} {' '.join(kids)})"


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
