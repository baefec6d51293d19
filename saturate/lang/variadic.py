"""Variadic rules: a rule over `Op(xs...)` stands for one plain rule per number of inputs.

A checked rule keeps its lists (`Spread` inputs, `sum`, `count`...); the engine and the checker
instantiate it for the numbers of inputs they meet. An instance names the elements of list `xs`
`xs.0`, `xs.1`...: no rule can spell such a name, so they never meet a variable of the rule."""

from __future__ import annotations

import itertools
import math
from typing import Any, Iterable

from saturate.core.errors import SaturateError
from saturate.lang.ast import Call, Guard, Num, OpTerm, Rule, Spread, Term, Var
from saturate.lang.builtins import LIST_FUNCS
from saturate.lang.guard_builtins import COMPARISONS

# An instance's size grows with its inputs (sum_before spells every element before one), and a
# rule's instances multiply with its lists: past these, an op is left to the plain rules.
MAX_INPUTS = 64
MAX_INSTANCES = 256


def element(name: str, k: int) -> str:
    """The variable an instance binds to element k of list `name`."""
    return f"{name}.{k}"


def list_vars(rule: Rule) -> dict[str, tuple[str, int]]:
    """The list variables of a rule's left side (and a `<=>` rule's right): name -> (the op whose
    inputs it matches, how many fixed inputs that op has beside it)."""
    found: dict[str, tuple[str, int]] = {}

    def walk(t: Any) -> None:
        if isinstance(t, OpTerm):
            fixed = sum(not isinstance(a, Spread) for a in t.args)
            for a in t.args:
                if isinstance(a, Spread) and isinstance(a.term, Var):
                    found.setdefault(a.term.name, (t.op, fixed))
                else:
                    walk(a)

    walk(rule.lhs)
    if rule.bidirectional:
        walk(rule.rhs)
    return found


def is_variadic(rule: Rule) -> bool:
    return bool(list_vars(rule))


def instances(rule: Rule, arities: dict[str, Iterable[int]]) -> list[Rule]:
    """The plain rules `rule` stands for on ops of these input counts (op -> counts): one per
    choice of a length for each list, the lengths its left side can match (an op of more than
    MAX_INPUTS inputs matches none). A plain rule is its own one instance."""
    lists = list_vars(rule)
    if not lists:
        return [rule]
    choices = []
    for name, (op, fixed) in lists.items():
        choices.append(sorted({n - fixed for n in arities.get(op, ()) if 1 <= n - fixed and n <= MAX_INPUTS}))
    total = math.prod(len(c) for c in choices)
    if total > MAX_INSTANCES:
        raise SaturateError(f"{rule.loc}: rule '{rule.name}': its lists of inputs would make {total} plain "
                            f"rules for the input counts of this graph, more than {MAX_INSTANCES}")
    out = []
    for lengths in itertools.product(*choices):
        got = instantiate(rule, dict(zip(lists, lengths)))
        if got is not None:
            out.append(got)
    return out


def _literal(g: Guard) -> bool:
    return g.fn in COMPARISONS and all(isinstance(a, Num) for a in g.args)


def _holds(g: Guard) -> bool:
    return bool(COMPARISONS[g.fn].impl(*(a.value for a in g.args)))


class _Mismatch(Exception):
    """One term repeats over lists of different lengths: that instance cannot fire."""


def instantiate(rule: Rule, lengths: dict[str, int]) -> Rule | None:
    """The plain rule for lists of these lengths (None when a term repeats over two lists
    whose lengths differ)."""
    try:
        ex = _Expander(lengths)
        lhs = ex.term(rule.lhs, {})
        rhs = ex.term(rule.rhs, {})
        guards = tuple(g for guard in rule.guards for g in ex.guard(guard))
    except _Mismatch:
        return None
    # A comparison of numbers alone (`count(xs) >= 2` once xs has a length) is decided here: a
    # false one leaves no instance to compile or check, a true one no guard to decide per match.
    if any(not _holds(g) for g in guards if _literal(g)):
        return None
    guards = tuple(g for g in guards if not _literal(g))
    return Rule(rule.name, lhs, rhs, guards, rule.ruleset, rule.level, rule.loc, rule.bidirectional)


class _Expander:
    def __init__(self, lengths: dict[str, int]):
        self.lengths = lengths

    def free(self, t: Any) -> set[str]:
        """Lists `t` reads as one element (see checks._Checker.free_lists)."""
        if isinstance(t, Var):
            return {t.name} if t.name in self.lengths else set()
        if isinstance(t, Spread) or (isinstance(t, Call) and t.fn in LIST_FUNCS):
            return set()
        found: set[str] = set()
        for a in getattr(t, "args", ()):
            found |= self.free(a)
        if isinstance(t, OpTerm):
            for _, v in t.attrs:
                found |= self.free(v)
        return found

    def length(self, names: Iterable[str]) -> int:
        got = {self.lengths[n] for n in names}
        if len(got) != 1:
            raise _Mismatch
        return got.pop()

    def each(self, t: Any, env: dict[str, int]) -> list[tuple[dict[str, int], Any]]:
        """`t` once per element of the lists it reads freely (those not already fixed by env)."""
        lists = sorted(self.free(t) - set(env))
        if not lists:
            return [(env, t)]
        return [({**env, **{n: k for n in lists}}, t) for k in range(self.length(lists))]

    def term(self, t: Any, env: dict[str, int]) -> Any:
        if isinstance(t, Var) and t.name in self.lengths:
            return Var(element(t.name, env[t.name]), t.const, t.loc)
        if isinstance(t, OpTerm):
            args: list[Term] = []
            for a in t.args:
                if isinstance(a, Spread):
                    args.extend(self.term(a.term, e) for e, _ in self.each(a.term, env))
                else:
                    args.append(self.term(a, env))
            attrs = tuple((k, self.term(v, env)) for k, v in t.attrs)
            return OpTerm(t.op, tuple(args), attrs, t.loc)
        if isinstance(t, Call) and t.fn in LIST_FUNCS:
            return self.list_call(t, env)
        if isinstance(t, Call):
            return Call(t.fn, tuple(self.term(a, env) for a in t.args), t.loc)
        return t

    def list_call(self, c: Call, env: dict[str, int]) -> Term:
        (arg,) = c.args
        if c.fn == "count":
            return Num(self.lengths[arg.name])
        # The function binds every list its argument reads; sum_before stops at the element
        # the list's name reads as where it stands.
        lists = sorted(self.free(arg))
        n = self.length(lists)
        upto = n if c.fn == "sum" else env[lists[0]]
        parts = [self.term(arg, {**env, **{name: k for name in lists}}) for k in range(upto)]
        if not parts:
            return Num(0)
        # Summed pairwise, so the term is as deep as log2 of its parts (later stages recurse).
        while len(parts) > 1:
            parts = [Call("add", tuple(parts[i:i + 2]), c.loc) if i + 1 < len(parts) else parts[i]
                     for i in range(0, len(parts), 2)]
        return parts[0]

    def guard(self, g: Guard) -> list[Guard]:
        return [Guard(g.fn, tuple(self.term(a, env) for a in g.args), g.loc)
                for env, _ in self.each(Call(g.fn, g.args), {})]
