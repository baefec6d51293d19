"""Encode stage, rules: each DSL rule becomes egglog rules; guards go through a Python check.

A rule with no guard and right-hand attributes known at compile time is one egglog rule. Its
attribute tests (`Concat(a:const, b:const){axis=axis}`) are relations egglog joins like any other
table: `AttrOk_i_k(set, captured...)` holds a row for every attribute set that op k of rule i
accepts, with the values the pattern captures from it (saturate.engine.guards.attr_rows decides
them, the same way it decides a candidate's). So a chain of constant Concats and Casts folds
inside egglog, with no Python round between two links. Any other rule becomes two: a match rule
that records candidate bindings in a `Cand_i` relation, and an apply rule that fires on the
`Ok_i` rows the saturation loop inserts after checking the guards on concrete constant values
and shapes (saturate.engine.saturation).
"""

from __future__ import annotations

import functools
from typing import Any

from saturate.lang.builtins import CONST_FUNCS
from saturate.lang.guard_builtins import GUARDS
from saturate.lang.query_builtins import QUERIES
from saturate.engine import fold_any
from saturate.engine.compiled_rule import AttrTest, CompiledRule, RhsOp, input_counts
from saturate.engine.encode import Encoding, k_ctor, op_ctor
from saturate.core.errors import SaturateError
from saturate.lang import fold
from saturate.lang.ast import AttrVar, Call, IntList, Num, OpTerm, Rule, Spread, Str, Term, Var
from saturate.lang.variadic import MAX_INPUTS, instances

QUERY_FNS = tuple(QUERIES)


class _Compiler:
    def __init__(self, enc: Encoding, cr: CompiledRule):
        self.enc, self.cr = enc, cr
        self.atoms: list[str] = []
        self.fresh = 0
        self.const_vars: set[str] = set()
        self.attr_terms: list[tuple[int, OpTerm]] = []   # pattern ops that test attributes
        self.python = False      # whether a match needs Python beyond its attribute tests

    def pattern(self, term: Term, target: str) -> None:
        """Query atoms that bind `target` to an instance of `term`."""
        cr = self.cr
        if not isinstance(term, OpTerm):
            raise SaturateError(f"{cr.rule.loc}: rule '{cr.rule.name}': a pattern must be an op, not {term}")
        args = []
        for a in term.args:
            if isinstance(a, Var):
                if a.name not in cr.vars:
                    cr.vars.append(a.name)
                if a.const and a.name not in self.const_vars:
                    self.const_vars.add(a.name)
                    self.atoms.append(f"(IsConst v_{a.name})")
                args.append(f"v_{a.name}")
            elif isinstance(a, OpTerm):
                self.fresh += 1
                sub = f"t_{self.fresh}"
                args.append(sub)
                self.pattern(a, sub)
            else:
                raise SaturateError(f"{cr.rule.loc}: rule '{cr.rule.name}': literal {a} inside a "
                                    "pattern is not supported; capture it and add a guard")
        k = len(cr.lhs_ops)
        cr.lhs_ops.append(term)
        if term.attrs:
            self.attr_terms.append((k, term))
        ctor = op_ctor(term.op, len(args))
        self.enc.declare(ctor, len(args))
        self.atoms.append(f"(= {target} ({ctor} a_{k} {' '.join(args)}))")

    def rhs(self, term: Term) -> str:
        """egglog expression building `term`."""
        cr, enc = self.cr, self.enc
        if isinstance(term, Var):
            if term.name not in cr.vars:
                raise SaturateError(f"{cr.rule.loc}: rule '{cr.rule.name}': "
                                    f"right-hand variable '{term.name}' is not bound on the left")
            return f"v_{term.name}"
        if isinstance(term, OpTerm):
            args = [self.rhs(a) for a in typed_literals(term)]
            ctor = op_ctor(term.op, len(args))
            enc.declare(ctor, len(args))
            return f"({ctor} {self.rhs_attrs(term)} {' '.join(args)})"
        if isinstance(term, Call):
            if term.fn in QUERY_FNS or term.fn == fold.SPEC:
                return self.extra(term)
            args = [self.rhs(a) for a in term.args]
            ctor = k_ctor(term.fn, len(args))
            enc.declare(ctor, len(args), first_i64=False)
            enc.wrote(len(args), cr.rule, term)
            return f"({ctor} {' '.join(args)})"
        if isinstance(term, (Num, Str, IntList)):
            value = term.value if not isinstance(term, IntList) else tuple(term.values)
            return f"(Lit {enc.lit_id(value)})"
        if isinstance(term, AttrVar):
            return self.extra(term)
        raise SaturateError(f"{cr.rule.loc}: rule '{cr.rule.name}': cannot build {term}")

    def extra(self, term: Term) -> str:
        """A value the Python check computes per match (query, captured attribute)."""
        self.python |= not isinstance(term, AttrVar)
        col = f"x_{len(self.cr.extras)}"
        self.cr.extras.append((col, term))
        return col

    def rhs_attrs(self, term: OpTerm) -> str:
        cr = self.cr
        src = inherited_from(cr.lhs_ops, term)
        entry = RhsOp(term.op)
        cr.rhs_ops.append(entry)
        literal = all(isinstance(v, (Num, Str, IntList)) for _, v in term.attrs)
        if src is not None and not term.attrs:
            entry.inherit = src
            return f"a_{src}"
        if src is None and literal:
            entry.fixed = self.enc.attr_id(term.op, {k: _lit(v) for k, v in term.attrs})
            return str(entry.fixed)
        entry.inherit, entry.overrides = src, tuple(term.attrs)
        entry.column = f"r_{len(cr.rhs_ops) - 1}"
        self.python = True
        return entry.column


def inherited_from(lhs_ops: list[OpTerm], term: OpTerm) -> int | None:
    """Which matched node of the left side a right-hand op takes its attributes from: one of the
    same op over the same inputs as written, else the first of the same op (an op the left side
    holds twice, as in `Add(Conv(x, w), Conv(x, v)) => Add(Conv(x, w), Conv(x, v))`, keeps each
    node's own attributes; a merge such as conv-add-conv keeps the first's); None when the left
    side has no such op."""
    same = [k for k, t in enumerate(lhs_ops) if t.op == term.op]
    exact = [k for k in same if _same_inputs(lhs_ops[k].args, term.args)]
    return exact[0] if exact else same[0] if same else None


def _same_inputs(left: tuple[Term, ...], right: tuple[Term, ...]) -> bool:
    """Whether two argument lists are the same as written (variables by name, ops by op and
    inputs), whatever the attributes and constant marks."""
    if len(left) != len(right):
        return False
    for a, b in zip(left, right):
        if isinstance(a, Var) and isinstance(b, Var):
            if a.name != b.name:
                return False
        elif isinstance(a, OpTerm) and isinstance(b, OpTerm):
            if a.op != b.op or not _same_inputs(a.args, b.args):
                return False
        elif a != b:
            return False
    return True


def typed_literals(term: OpTerm) -> tuple[Term, ...]:
    """The inputs of a right-hand op, each number that reads no tensor (a literal, an attribute,
    a constant expression of those) cast to the dtype of an input the op's schema gives the
    same type: `Sub(1, Sigmoid(x))` subtracts from a 1 of x's dtype, as a Python scalar takes
    an array's dtype in NumPy 2. A number with no such input keeps its own type."""
    types = _input_types(term.op, len(term.args))
    if types is None:
        return term.args
    out = list(term.args)
    for i, a in enumerate(term.args):
        if not _reads_no_tensor(a):
            continue
        for j, b in enumerate(term.args):
            source = _dtype_source(b) if j != i and types[j] == types[i] and not _reads_no_tensor(b) else None
            if source is not None:
                out[i] = Call("cast", (a, Call("elem_type", (source,), getattr(a, "loc", None))),
                              getattr(a, "loc", None))
                break
    return tuple(out)


def _reads_no_tensor(t: Term) -> bool:
    if isinstance(t, (Num, AttrVar)):
        return True
    return (isinstance(t, Call) and t.fn in CONST_FUNCS
            and all(_reads_no_tensor(a) or isinstance(a, (Str, IntList)) for a in t.args))


def _dtype_source(t: Term) -> Var | None:
    """A variable whose dtype a right-hand term has, as the ops' schemas tell (None: unknown)."""
    if isinstance(t, Var):
        return t
    if isinstance(t, OpTerm):
        types = _input_types(t.op, len(t.args))
        out = _output_type(t.op)
        for a, ty in zip(t.args, types or ()):
            if ty == out and (got := _dtype_source(a)) is not None:
                return got
        return None
    if isinstance(t, Call) and t.fn in CONST_FUNCS and CONST_FUNCS[t.fn].params[:1] == ("const",):
        return _dtype_source(t.args[0])
    return None


@functools.lru_cache(maxsize=None)
def _schema(op: str) -> Any:
    import onnx

    try:
        return onnx.defs.get_schema(op, "")
    except onnx.defs.SchemaError:
        return None


def _input_types(op: str, n: int) -> list[str] | None:
    """The type-constraint name of each of n inputs of `op` (the last formal input repeats)."""
    s = _schema(op)
    if s is None or not s.inputs:
        return None
    names = [p.type_str for p in s.inputs]
    return [names[min(k, len(names) - 1)] for k in range(n)]


def _output_type(op: str) -> str | None:
    s = _schema(op)
    return s.outputs[0].type_str if s is not None and s.outputs else None


def _lit(v: Num | Str | IntList) -> Any:
    return list(v.values) if isinstance(v, IntList) else v.value


def _is_pattern(term: Term) -> bool:
    if isinstance(term, Var):
        return True
    return isinstance(term, OpTerm) and all(_is_pattern(a) for a in term.args)


def rule_ops(rules: list[Rule]) -> set[str]:
    """Every op a rule names on either side."""
    found: set[str] = set()
    for r in rules:
        for lhs, rhs in r.roots:
            found |= _ops_of(lhs) | _ops_of(rhs)
    return found


def applicable_rules(rules: list[Rule], graph_ops: set[str]) -> list[Rule]:
    """The rules that can ever match a graph with these ops: those whose left side names only
    ops the graph has or an applicable rule's right side builds (a `<=>` rule from either side).
    The others would only cost egglog the time to compile them."""
    ops = set(graph_ops)
    sides = [(r, set().union(*(_ops_of(t) for t, _ in r.roots)), set().union(*(_ops_of(t) for _, t in r.roots)))
             for r in rules]
    live: set[int] = set()
    grew = True
    while grew:
        grew = False
        for k, (r, lhs, rhs) in enumerate(sides):
            if k not in live and (lhs <= ops or (r.bidirectional and rhs <= ops)):
                live.add(k)
                ops |= lhs | rhs
                grew = True
    return [r for k, (r, _, _) in enumerate(sides) if k in live]


def _ops_of(t: Term) -> set[str]:
    found = set()
    if isinstance(t, Spread):
        return _ops_of(t.term)
    if isinstance(t, OpTerm):
        found.add(t.op)
    for a in getattr(t, "args", ()):
        found |= _ops_of(a)
    return found


def plain_rules(rules: list[Rule], enc: Encoding) -> list[Rule]:
    """The rules with each variadic one (`Concat(xs...)`) replaced by its instances for the
    input counts its ops can have in this e-graph: those of the graph's nodes and of the ops a
    rule builds (an instance's right side included, up to MAX_INPUTS inputs)."""
    counts: dict[str, set[int]] = {}
    for node in enc.graph.nodes:
        counts.setdefault(node.op, set()).add(len(node.inputs))
    for r in rules:
        for t in (r.rhs, *r.more_rhs):
            input_counts(t, counts)
        if r.bidirectional:
            input_counts(r.lhs, counts)
    while True:
        out = [inst for r in rules for inst in instances(r, counts)]
        grown: dict[str, set[int]] = {}
        for r in out:
            for side in (r.lhs, r.rhs):
                input_counts(side, grown)
        new = {op: {n for n in ns if n <= MAX_INPUTS} - counts.get(op, set()) for op, ns in grown.items()}
        if not any(new.values()):
            return out
        for op, ns in new.items():
            counts.setdefault(op, set()).update(ns)


def compile_rules(rules: list[Rule], enc: Encoding) -> list[CompiledRule]:
    """Compile rules (both directions of `<=>` rules) to egglog text kept in each CompiledRule;
    a variadic rule compiles as its instances (plain_rules)."""
    out: list[CompiledRule] = []
    schemas = [r for r in rules if fold.is_schema(r)]
    rules = [r for r in rules if not fold.is_schema(r)]
    for i, rule in enumerate(plain_rules(rules, enc)):
        dirs = [("forward", rule.lhs, rule.rhs)]
        if rule.bidirectional and isinstance(rule.rhs, OpTerm) and _is_pattern(rule.rhs):
            dirs.append(("reverse", rule.rhs, rule.lhs))
        for direction, lhs, rhs in dirs:
            if direction == "reverse" and not isinstance(lhs, OpTerm):
                continue
            cr = CompiledRule(rule, len(out), f"r{len(out)}", direction, lhs, rhs)
            _compile_one(cr, enc)
            out.append(cr)
    if schemas:
        first = True
        for schema in schemas:
            for kind, rule in fold_any.instances_for(schema, enc, rules):
                cr = CompiledRule(rule, len(out), f"r{len(out)}", "forward", rule.lhs, rule.rhs, fold=kind)
                if kind == "opaque":
                    fold_any.compile_opaque(cr, enc, first)
                    first = False
                else:
                    _compile_one(cr, enc)
                out.append(cr)
    return out


def _compile_one(cr: CompiledRule, enc: Encoding) -> None:
    rule = cr.rule
    c = _Compiler(enc, cr)
    c.pattern(cr.lhs, "root")
    # Further roots bind variables of their own (`_root1`...), each a different e-class from the
    # roots before it: a root matched twice would only rewrite a node in terms of itself.
    more = []
    for k, lhs in enumerate(rule.more_lhs if cr.direction == "forward" else (), start=1):
        cr.vars.append(f"_root{k}")
        c.pattern(lhs, f"v__root{k}")
        c.atoms.extend(f"(!= {r} v__root{k})" for r in ["root"] + [f"v__root{j}" for j in range(1, k)])
        more.append(f"v__root{k}")
    for g in rule.guards:
        if g.fn not in GUARDS:
            raise SaturateError(f"{rule.loc}: rule '{rule.name}': unknown guard '{g.fn}'")
        c.python = True
    body = c.rhs(cr.rhs)
    unions = " ".join([f"(union root {body})"] + [f"(union {v} {c.rhs(t)})" for v, t in zip(more, rule.more_rhs)])
    declare = f"(ruleset {cr.group})\n"
    captures = [v.name for _, t in c.attr_terms for _, v in t.attrs if isinstance(v, AttrVar)]
    if len(captures) != len(set(captures)) or any(getattr(t, "name", None) not in captures for _, t in cr.extras):
        # A variable captured twice must be compared (`_attrs_match` reads its values as plain
        # Python), which a relation of literal ids would not do the same way; a right-hand value
        # other than a captured attribute is computed in Python.
        c.python = True
    cr.checked = c.python
    if not cr.checked and c.attr_terms:
        for k, term in c.attr_terms:
            names = tuple(v.name for _, v in term.attrs if isinstance(v, AttrVar))
            test = AttrTest(f"AttrOk_{cr.index}_{k}", k, term, names)
            cr.attr_tests.append(test)
            cr.text.append(f"(relation {test.relation} ({' '.join(['i64'] + ['T'] * len(names))}))")
            c.atoms.append(f"({' '.join([test.relation, f'a_{k}'] + [f'c_{n}' for n in names])})")
        for col, term in cr.extras:
            c.atoms.append(f"(= {col} c_{term.name})")
    query = " ".join(c.atoms)
    # The rule's own ruleset is declared in the same text as its matching rule.
    if not cr.checked:
        cr.text.append(f'{declare}(rule ({query}) ({unions}) :ruleset {cr.group} :name "{cr.name}")')
        return
    cand = " ".join(cr.cand_columns())
    sorts = ["T"] * (1 + len(cr.vars)) + ["i64"] * len(cr.lhs_ops)
    cr.text.append(f"(relation Cand_{cr.index} ({' '.join(sorts)}))")
    # Ok rows are integers, read in bulk from a file (saturate.engine.encode.Rows): the Ref of
    # each matched e-class, attribute-set ids, and literal ids for the values Python computed.
    ok = cr.ok_columns()
    cr.apply_text.append(f"(relation Ok_{cr.index} ({' '.join(['i64'] * len(ok))}))")
    cr.text.append(f'{declare}(rule ({query}) ((Cand_{cr.index} {cand})) :ruleset {cr.group} :name "m{cr.name}")')
    classes = 1 + len(cr.vars)
    bind = [f"(let {c} (Ref k_{c}))" for c in ok[:classes]] + [f"(let {c} (Lit k_{c}))" for c, _ in cr.extras]
    heads = [f"k_{c}" for c in ok[:classes]] + ok[classes:len(ok) - len(cr.extras)] + [f"k_{c}" for c, _ in cr.extras]
    cr.apply_text.append(f'(rule ((Ok_{cr.index} {" ".join(heads)})) ({" ".join(bind)} {unions}) '
                         f':ruleset apply :name "{cr.name}")')
