"""Rule DSL load-time checks: ops and arities, bindings, argument kinds, guard and function names."""

from __future__ import annotations

import difflib
from typing import Any, Callable, NoReturn

from saturate.lang import fold
from saturate.lang.builtins import ATTRIBUTE_KINDS, CONST_FUNCS, INFIX, LIST_FUNCS
from saturate.lang.guard_builtins import GUARDS
from saturate.lang.query_builtins import QUERIES
from saturate.ops.schema import attribute_type, is_rewritable_op, op_table
from saturate.lang.ast import (AttrVar, Call, Guard, IntList, Loc, Num, OpTerm, Rule, Spread, Str,
                               Term, Var)

Fail = Callable[[Loc, str], Exception]
_ARITH = frozenset({"add", "sub", "mul", "neg", "min", "max"})
# Per op: (min inputs, max inputs, known attribute names or None when any attribute is allowed).
OpTable = dict[str, tuple[int, int, frozenset[str] | None]]


def declared_ops(decls: list[Any], fail: Fail) -> OpTable:
    """The op table of one load: every ONNX op (saturate.ops.schema) plus the file's `op Name/N` declarations."""
    known = op_table()
    table: OpTable = {n: (s.min_inputs, s.max_inputs, frozenset(s.attrs)) for n, s in known.items()}
    declared: dict[str, Any] = {}
    for d in decls:
        if d.op in known:
            raise fail(d.loc, f"op '{d.op}' is already known; declare only ops saturate does not know")
        if d.min_inputs > d.max_inputs:
            raise fail(d.loc, f"op '{d.op}': {d.min_inputs}..{d.max_inputs} is an empty range")
        prev = declared.setdefault(d.op, d)
        if (prev.min_inputs, prev.max_inputs) != (d.min_inputs, d.max_inputs):
            raise fail(d.loc, f"op '{d.op}' is declared with another arity at {prev.loc}")
        table[d.op] = (d.min_inputs, d.max_inputs, None)
    return table


def _suggest(name: str, known: list[str]) -> str:
    # Among ~200 ONNX ops the nearest spelling is often a rare op ('Ad' -> 'And'): the ops the
    # engine works on are tried first.
    common = [k for k in known if is_rewritable_op(k)]
    close = difflib.get_close_matches(name, common, n=1) or difflib.get_close_matches(name, known, n=1)
    return f"; did you mean '{close[0]}'?" if close else ""


def _plural(n: int) -> str:
    return f"{n} input" if n == 1 else f"{n} inputs"


class _Checker:
    """Checks one rule; `fail(loc, message)` builds the SourceError to raise."""

    def __init__(self, rule: Rule, ops: OpTable, fail: Fail):
        self.rule, self.ops, self._fail = rule, ops, fail
        self.vars: dict[str, bool] = {}  # name -> bound as a constant
        self.attrs: set[str] = set()
        self.lists: dict[str, bool] = {}  # list variables (`xs...` on the left) -> of constants
        self.element: frozenset[str] = frozenset()  # lists whose name reads as one element here

    def fail(self, loc: Loc | None, message: str) -> NoReturn:
        raise self._fail(loc or self.rule.loc, message)

    # -- ops --------------------------------------------------------------------------------------

    def check_op(self, t: OpTerm, pattern: bool = False) -> None:
        if t.op not in self.ops:
            self.fail(t.loc, f"unknown op '{t.op}'{_suggest(t.op, list(self.ops))} "
                             f"(declare another with 'op {t.op}/N')")
        lo, hi, known = self.ops[t.op]
        spreads = [a for a in t.args if isinstance(a, Spread)]
        fixed = len(t.args) - len(spreads)
        want = _plural(lo) if lo == hi else f"{lo} to {_plural(hi)}"
        if pattern and len(spreads) > 1:
            self.fail(spreads[1].loc, f"{t.op} has more than one list of inputs ('...')")
        if spreads and fixed + 1 > hi:
            self.fail(t.loc, f"{t.op} takes {want}, not {fixed + 1} or more")
        if not spreads and not lo <= len(t.args) <= hi:
            self.fail(t.loc, f"{t.op} takes {want}, not {len(t.args)}")
        seen = set()
        for key, _ in t.attrs:
            if known is not None and key not in known:
                self.fail(t.loc, f"{t.op} has no attribute '{key}'{_suggest(key, sorted(known))}")
            if key in seen:
                self.fail(t.loc, f"attribute '{key}' given twice")
            seen.add(key)

    # -- left-hand sides: patterns ------------------------------------------------------------------

    def pattern(self, t: Term, loc: Loc | None) -> None:
        """Record the bindings of a pattern; patterns hold ops, variables and attribute captures."""
        if isinstance(t, Var):
            if t.name in self.attrs:
                self.fail(t.loc, f"'{t.name}' is already an attribute capture")
            if t.name in self.lists:
                self.fail(t.loc, f"'{t.name}' is already a list of inputs ({t.name}...)")
            self.vars[t.name] = self.vars.get(t.name, False) or t.const
        elif isinstance(t, Spread):
            v = t.term
            if not isinstance(v, Var):
                self.fail(t.loc, "on the left, '...' follows a variable: Concat(xs...) binds the list xs")
            if v.name in self.vars or v.name in self.attrs or v.name in self.lists:
                self.fail(v.loc, f"'{v.name}' is already bound; a list variable is bound once")
            self.lists[v.name] = v.const
        elif isinstance(t, OpTerm):
            self.check_op(t, pattern=True)
            for a in t.args:
                self.pattern(a, t.loc)
            for _, v in t.attrs:
                if isinstance(v, AttrVar):
                    if v.name in self.vars or v.name in self.lists:
                        self.fail(v.loc, f"'{v.name}' is already a value variable")
                    self.attrs.add(v.name)
                elif isinstance(v, Call):
                    self.fail(v.loc, "a computed attribute belongs on the right-hand side")
                elif not isinstance(v, (Num, Str, IntList)):
                    self.fail(getattr(v, "loc", None) or t.loc,
                              "an attribute pattern is a name that captures it or a literal")
        elif isinstance(t, Call):
            self.fail(t.loc, "a constant expression cannot be matched; capture the constant as c:const")
        else:
            self.fail(loc, "a literal cannot be matched as an op input; capture it as c:const and guard it")

    # -- right-hand sides and guards: resolve names, check kinds -------------------------------------

    def term(self, t: Term, want: str, where: str, loc: Loc | None) -> Term:
        """Resolve `t` used where a value of kind `want` (builtins' kinds, or "tensor") is needed."""
        if isinstance(t, Var):
            return self.name(t, want, where)
        if isinstance(t, AttrVar):
            if t.name not in self.attrs:
                self.fail(t.loc, f"attribute '{t.name}' is not captured on the left-hand side")
            return t
        if isinstance(t, OpTerm):
            if want != "tensor":
                self.fail(t.loc, f"an op cannot appear in {where}")
            self.check_op(t)
            args = tuple(self.spread(a, t) if isinstance(a, Spread) else
                         self.term(a, "tensor", f"an input of {t.op}", t.loc) for a in t.args)
            attrs = tuple((k, self.attr_value(k, v, t)) for k, v in t.attrs)
            return OpTerm(t.op, args, attrs, t.loc)
        if isinstance(t, Call) and t.fn in LIST_FUNCS:
            return self.list_call(t, want, where)
        if isinstance(t, Call):
            return self.call(t, want, where)
        kind = {Num: "num", Str: "str", IntList: "ints"}[type(t)]
        accepts = {"tensor": {"num"}, "const": {"num"}, "int": {"num"}, "ints": {"ints"},
                   "any": {"num", "str", "ints"}, "value": set()}[want]
        if kind not in accepts or (want == "int" and not isinstance(t.value, int)):
            self.fail(loc, f"a literal {kind_word(kind)} cannot be {where}")
        return t

    def name(self, v: Var, want: str, where: str) -> Term:
        if v.const:
            self.fail(v.loc, "':const' belongs on the left-hand side, where the variable is bound")
        if v.name in self.attrs:
            if want == "value":
                self.fail(v.loc, f"'{v.name}' is an attribute; {where} needs a value variable")
            return AttrVar(v.name, v.loc)
        if v.name in self.lists:
            if v.name not in self.element:
                self.fail(v.loc, f"'{v.name}' is a list of inputs: read it in an input 'term...', "
                                 f"in sum(...) or in count({v.name})")
            const = self.lists[v.name]
        elif v.name not in self.vars:
            self.fail(v.loc, f"variable '{v.name}' is not bound on the left-hand side")
        else:
            const = self.vars[v.name]
        if want in ("const", "ints") and not const:
            self.fail(v.loc, f"'{v.name}' is not a constant, so it cannot be {where}; "
                             f"capture it as {v.name}:const on the left")
        # A constant compares by its values (c == 0.5); any other value has only a shape to ask.
        if want == "int" or (want == "any" and not const):
            self.fail(v.loc, f"'{v.name}' is a value, but {where} needs an int or attribute "
                             f"(a query such as rank({v.name}))")
        return Var(v.name, const, v.loc)

    def is_const(self, name: str) -> bool:
        return self.vars.get(name, self.lists.get(name, True))

    # -- lists of inputs ---------------------------------------------------------------------------

    def free_lists(self, t: Any) -> set[str]:
        """The list variables `t` reads as one element (outside the terms that bind them: a
        spread input, a function over the list)."""
        if isinstance(t, Var):
            return {t.name} if t.name in self.lists else set()
        if isinstance(t, Spread) or (isinstance(t, Call) and t.fn in LIST_FUNCS):
            return set()
        found: set[str] = set()
        for a in getattr(t, "args", ()):
            found |= self.free_lists(a)
        if isinstance(t, OpTerm):
            for _, v in t.attrs:
                found |= self.free_lists(v)
        return found

    def over_elements(self, t: Any, loc: Loc | None, what: str) -> frozenset[str]:
        lists = self.free_lists(t)
        if not lists:
            self.fail(loc, f"{what} needs a term naming a list variable (bound as xs... on the left)")
        return frozenset(lists)

    def spread(self, s: Spread, op: OpTerm) -> Spread:
        """`term...` among a right-hand op's inputs: the term once per element of its lists."""
        lists = self.over_elements(s.term, s.loc, "'...'")
        outer, self.element = self.element, self.element | lists
        try:
            return Spread(self.term(s.term, "tensor", f"an input of {op.op}", s.loc), s.loc)
        finally:
            self.element = outer

    def list_call(self, c: Call, want: str, where: str) -> Call:
        if len(c.args) != 1:
            self.fail(c.loc, f"{c.fn} takes 1 argument, not {len(c.args)}")
        (arg,) = c.args
        if c.fn == "count":
            if not (isinstance(arg, Var) and arg.name in self.lists):
                self.fail(getattr(arg, "loc", None) or c.loc, "count(...) takes a list variable (xs of xs...)")
            if want not in ("int", "any", "const"):
                self.fail(c.loc, f"count(...) gives an int, but {where} needs {kind_word(want)}")
            return Call(c.fn, (Var(arg.name, self.lists[arg.name], arg.loc),), c.loc)
        if want in ("value", "ints"):
            self.fail(c.loc, f"{c.fn}(...) gives {kind_word('const')}, but {where} needs {kind_word(want)}")
        lists = self.over_elements(arg, c.loc, f"{c.fn}(...)")
        if c.fn == "sum_before" and not lists <= self.element:
            self.fail(c.loc, "sum_before(...) sums the elements before the current one: use it in an "
                             "input 'term...' or a guard on each element")
        outer, self.element = self.element, self.element | lists
        try:
            inner = self.term(arg, "const" if want == "tensor" else want, f"argument 1 of {c.fn}", c.loc)
        finally:
            self.element = outer
        return Call(c.fn, (inner,), c.loc)

    def call(self, c: Call, want: str, where: str) -> Call:
        self.no_spread(c)
        fn = CONST_FUNCS.get(c.fn) or QUERIES.get(c.fn)
        if fn is None:
            known = sorted({*CONST_FUNCS, *QUERIES})
            extra = " (it is a guard: put it after 'if')" if c.fn in GUARDS else _suggest(c.fn, known)
            self.fail(c.loc, f"unknown function '{c.fn}'{extra}")
        if len(c.args) != fn.arity:
            self.fail(c.loc, f"{c.fn} takes {fn.arity} argument{'s' * (fn.arity != 1)}, not {len(c.args)}")
        # An int is a one-element constant, and a constant compares by its values.
        fits = {"tensor": {"const"}, "const": {"const", "int"}, "int": {"int"}, "ints": {"ints", "const"},
                "any": {"int", "ints", "const"}, "value": set()}[want]
        # Arithmetic on ints (dim(a, 1) + dim(b, 1)) is an int, read from its one element.
        if want == "int" and c.fn in _ARITH and fn.returns == "const":
            fits = {"const"}
        if fn.returns not in fits:
            self.fail(c.loc, f"{c.fn}(...) gives {kind_word(fn.returns)}, but {where} needs {kind_word(want)}")
        # A "type" parameter (a value's dtype) takes a value variable, as a shape query does;
        # arithmetic giving an int takes ints.
        kinds = ["int"] * fn.arity if want == "int" and c.fn in _ARITH else fn.params
        args = tuple(self.term(a, "value" if k in ("type", "dims", "data") else k,
                               f"argument {i + 1} of {c.fn}", c.loc)
                     for i, (a, k) in enumerate(zip(c.args, kinds)))
        return Call(c.fn, args, c.loc)

    def attr_value(self, key: str, v: Any, op: OpTerm) -> Any:
        """A right-hand attribute: a literal, a captured attribute, or a value computed from
        captured attributes and constants, whose kind must fit the attribute's ONNX type."""
        where = f"attribute '{key}' of {op.op}"
        if isinstance(v, (Num, Str, IntList)) or (isinstance(v, AttrVar) and v.name in self.attrs):
            return v
        if isinstance(v, AttrVar) and (v.name in self.vars or v.name in self.lists):
            checked = self.name(Var(v.name, False, v.loc), "const", where)
            kind = "const"
        elif isinstance(v, AttrVar):
            self.fail(v.loc, f"attribute '{v.name}' is not captured on the left-hand side")
        elif isinstance(v, Call):
            checked = self.term(v, "any", where, op.loc)
            fn = CONST_FUNCS.get(checked.fn) or QUERIES.get(checked.fn)
            kind = fn.returns if fn else ("int" if checked.fn == "count" else "const")
        else:
            # An op, or a variable written with ':const', says why it cannot stand here.
            self.term(v, "any", where, op.loc)
            self.fail(getattr(v, "loc", None) or op.loc, f"{format_term(v)} cannot be {where}")
        allowed = ATTRIBUTE_KINDS.get(attribute_type(op.op, key) or "")
        if allowed is not None and kind not in allowed:
            self.fail(getattr(v, "loc", None) or op.loc,
                      f"{where} is {attribute_type(op.op, key)}, and {format_term(checked)} gives {kind_word(kind)}")
        return checked

    def no_spread(self, c: Call | Guard) -> None:
        spread = next((a for a in c.args if isinstance(a, Spread)), None)
        if spread is not None:
            self.fail(spread.loc or c.loc, f"'...' in the arguments of {c.fn}: only a rule of any op "
                                           "reads a list so, op(xs:const...) => evaluate(op, xs...)")

    def guard(self, g: Guard) -> Guard:
        self.no_spread(g)
        spec = GUARDS.get(g.fn)
        if spec is not None and set(spec.params) & {"op", "list"}:
            self.fail(g.loc, f"guard {g.fn} reads the node of a rule of any op, op(xs:const...)")
        if spec is None:
            extra = (f" ('{g.fn}' is a function: compare it, e.g. {g.fn}(...) == 1)"
                     if g.fn in CONST_FUNCS or g.fn in QUERIES else
                     _suggest(g.fn, [k for k in GUARDS if k.isidentifier()]))
            self.fail(g.loc, f"unknown guard '{g.fn}'{extra}")
        if len(g.args) != spec.arity:
            self.fail(g.loc, f"guard {g.fn} takes {spec.arity} argument{'s' * (spec.arity != 1)}, not {len(g.args)}")
        # A guard reading a list's name (outside sum, count and the like) holds for every element.
        outer, self.element = self.element, self.element | frozenset(self.free_lists(g))
        try:
            args = [self.guard_arg(g, i, a, kind) for i, (a, kind) in enumerate(zip(g.args, spec.params))]
        finally:
            self.element = outer
        return Guard(g.fn, tuple(args), g.loc)

    def guard_arg(self, g: Guard, i: int, a: Term, kind: str) -> Term:
        where = f"argument {i + 1} of {g.fn}" if g.fn.isidentifier() else f"a side of {g.fn}"
        if kind in ("value", "const") and isinstance(a, Call):
            # The shape of a constant expression (a part of a constant, say) is known too, and
            # a value guard reads an expression's values (positive(dim(a, 0) - i)).
            return self.term(a, "tensor" if kind == "value" else "const", where, g.loc)
        if kind in ("value", "dims", "data", "const", "isconst", "stored") and not isinstance(a, Var):
            self.fail(getattr(a, "loc", None) or g.loc, f"{where} must be a variable bound on the left")
        if kind == "const" and isinstance(a, Var) and not self.is_const(a.name):
            self.fail(a.loc, f"guard {g.fn} reads constant values: capture '{a.name}' as {a.name}:const")
        return self.term(a, "value" if kind in ("const", "isconst", "stored", "dims", "data") else kind, where, g.loc)

    def check(self) -> Rule:
        r = self.rule
        for lhs in (r.lhs, *r.more_lhs):
            if not isinstance(lhs, OpTerm):
                self.fail(getattr(lhs, "loc", None), "the left-hand side must be an op pattern such as Add(x, c:const)")
            self.pattern(lhs, r.loc)
        if r.more_lhs and self.lists:
            self.fail(r.loc, "a rule of several roots cannot match a list of inputs (xs...)")
        if r.bidirectional:
            left = (dict(self.vars), set(self.attrs), dict(self.lists))
            if not isinstance(r.rhs, OpTerm):
                self.fail(getattr(r.rhs, "loc", None), "both sides of <=> must be op patterns")
            self.vars, self.attrs, self.lists = {}, set(), {}
            self.pattern(r.rhs, r.loc)
            for name in sorted(set(left[0]) ^ set(self.vars) | left[1] ^ self.attrs | set(left[2]) ^ set(self.lists)):
                self.fail(r.loc, f"'{name}' appears on one side of <=> only")
            for name, const in left[0].items():
                self.vars[name] = const or self.vars[name]
            for name, const in left[2].items():
                self.lists[name] = const or self.lists[name]
            rhs = r.rhs
        else:
            rhs = self.term(r.rhs, "tensor", "the right-hand side", r.loc)
        more = tuple(self.term(t, "tensor", "the right-hand side", r.loc) for t in r.more_rhs)
        guards = tuple(self.guard(g) for g in r.guards)
        return Rule(r.name, r.lhs, rhs, guards, r.ruleset, r.level, r.loc, r.bidirectional, r.more_lhs, more)


def kind_word(kind: str) -> str:
    return {"const": "a constant", "int": "an int", "ints": "a list of ints", "num": "number",
            "str": "string", "tensor": "a value", "any": "an int or attribute",
            "value": "a variable"}.get(kind, kind)


def check_rule(rule: Rule, ops: OpTable, fail: Fail) -> Rule:
    """Check one parsed rule; the result names attributes as AttrVar and marks constant variables."""
    if fold.is_schema(rule):
        return check_schema(rule, fail)
    return _Checker(rule, ops, fail).check()


_SYMBOL = {fn: sym for sym, fn in INFIX.items()}
_PREC = {"add": 1, "sub": 1, "mul": 2, "div": 2}


def format_term(t: Any, pattern: bool = False) -> str:
    """A term, attribute value or guard in the DSL's syntax (`pattern`: show `:const` captures)."""
    def fmt(u: Any) -> str:
        return format_term(u, pattern)

    if isinstance(t, Var):
        return t.name + (":const" if t.const and pattern else "")
    if isinstance(t, AttrVar):
        return t.name
    if isinstance(t, Num):
        return repr(t.value)
    if isinstance(t, Str):
        return f'"{t.value}"'
    if isinstance(t, IntList):
        return "[" + ", ".join(map(str, t.values)) + "]"
    if isinstance(t, Spread):
        return fmt(t.term) + "..."
    if isinstance(t, OpTerm):
        attrs = "{" + ", ".join(f"{k}={fmt(v)}" for k, v in t.attrs) + "}" if t.attrs else ""
        return f"{t.op}({', '.join(map(fmt, t.args))}){attrs}"
    if isinstance(t, Call) and t.fn in _SYMBOL and len(t.args) == 2:
        parts = []
        for side, a in enumerate(t.args):
            text = fmt(a)
            inner = _PREC.get(a.fn) if isinstance(a, Call) and len(a.args) == 2 else None
            # Parenthesize a looser child, and an equal one on the right (the parser groups leftward).
            if inner is not None and (inner < _PREC[t.fn] or (side and inner == _PREC[t.fn])):
                text = f"({text})"
            parts.append(text)
        return f" {_SYMBOL[t.fn]} ".join(parts)
    if isinstance(t, Call) and t.fn == "neg" and len(t.args) == 1:
        inner = t.args[0]
        text = fmt(inner)
        return f"-({text})" if isinstance(inner, Call) and inner.fn in _PREC else f"-{text}"
    if isinstance(t, Guard) and not t.fn.isidentifier():
        return f" {t.fn} ".join(map(fmt, t.args))
    if isinstance(t, (Call, Guard)):
        return f"{t.fn}({', '.join(map(fmt, t.args))})"
    return str(t)


def format_rule(r: Rule) -> str:
    """`lhs => rhs if guards` of a rule, on one line."""
    lhs = " & ".join(format_term(t, True) for t, _ in r.roots)
    rhs = " & ".join(format_term(t, r.bidirectional) for _, t in r.roots)
    text = f"{lhs} {'<=>' if r.bidirectional else '=>'} {rhs}"
    if r.guards:
        text += " if " + ", ".join(format_term(g) for g in r.guards)
    return text


# ---- load-time checks of a rule of any op (saturate.lang.fold) ----------------------------------

def check_schema(rule: Rule, fail: Callable[[Any, str], Exception]) -> Rule:
    """Check a rule of any op: `op(xs:const...) => evaluate(op, xs...)`, guards reading only the op
    and the list. Returns the rule with its guards' arguments as plain variables."""
    def error(loc: Any, message: str) -> NoReturn:
        raise fail(loc or rule.loc, message)

    lhs = rule.lhs
    args = lhs.args
    spread = args[0] if len(args) == 1 and isinstance(args[0], Spread) else None
    if spread is None or not isinstance(spread.term, Var):
        if lhs.fn in CONST_FUNCS:
            error(lhs.loc, "a constant expression cannot be matched; capture the constant as c:const")
        error(lhs.loc, f"a pattern over any op is written {lhs.fn}(xs:const...): one list of constant inputs")
    xs = spread.term
    if not xs.const:
        error(xs.loc, f"a pattern over any op folds constants: write {lhs.fn}({xs.name}:const...)")
    if xs.name == lhs.fn:
        error(xs.loc, f"'{xs.name}' names both the op and its inputs")
    if rule.bidirectional or getattr(rule, "more_lhs", ()):
        error(rule.loc, "a rule of any op is written with => and one root")
    rhs = rule.rhs
    want = f"{fold.EVALUATE}({lhs.fn}, {xs.name}...)"
    if not (isinstance(rhs, Call) and rhs.fn == fold.EVALUATE and len(rhs.args) == 2
            and isinstance(rhs.args[0], Var) and rhs.args[0].name == lhs.fn and not rhs.args[0].const
            and isinstance(rhs.args[1], Spread) and isinstance(rhs.args[1].term, Var)
            and rhs.args[1].term.name == xs.name):
        error(getattr(rhs, "loc", None), f"a rule of any op has the right side {want}")
    guards = []
    for g in rule.guards:
        spec = GUARDS.get(g.fn)
        if spec is None or not set(spec.params) <= {"op", "list"}:
            error(g.loc, f"a rule of any op takes the guards {', '.join(schema_guards())}, not '{g.fn}'")
        if len(g.args) != spec.arity:
            error(g.loc, f"guard {g.fn} takes {spec.arity} argument{'s' * (spec.arity != 1)}, not {len(g.args)}")
        out = []
        for a, kind in zip(g.args, spec.params):
            name = lhs.fn if kind == "op" else xs.name
            if not (isinstance(a, Var) and a.name == name and not a.const):
                error(getattr(a, "loc", None) or g.loc, f"{g.fn} reads the {'op' if kind == 'op' else 'list'} '{name}' here")
            out.append(Var(name, kind == "list", a.loc))
        guards.append(Guard(g.fn, tuple(out), g.loc))
    return Rule(rule.name, Call(lhs.fn, (Spread(Var(xs.name, True, xs.loc), spread.loc),), lhs.loc),
                Call(fold.EVALUATE, (Var(lhs.fn, False, rhs.args[0].loc), Spread(Var(xs.name, True, xs.loc), rhs.args[1].loc)),
                     rhs.loc), tuple(guards), rule.ruleset, rule.level, rule.loc)


def schema_guards() -> list[str]:
    return sorted(k for k, g in GUARDS.items() if set(g.params) <= {"op", "list"} and g.params)
