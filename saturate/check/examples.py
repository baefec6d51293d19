"""Rule checking, drawing stage: examples that match a rule's pattern and satisfy its guards."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from saturate.check.planner import Planner
from saturate.check.strategies import constants
from saturate.core.errors import SaturateError
from saturate.lang import builtins
from saturate.lang.ast import AttrVar, Call, IntList, Num, OpTerm, Rule, Str, Term, Var

# ---- inputs satisfying a rule ---------------------------------------------------------------

@dataclass
class Example:
    """One drawn match of a rule's pattern: a value per variable, a value per captured attribute,
    and the full attributes of every pattern op (keyed by its path of argument indices)."""

    values: dict[str, np.ndarray]
    consts: frozenset[str]
    attrs: dict[str, Any]
    node_attrs: dict[tuple[int, ...], dict[str, Any]]
    node_ops: dict[tuple[int, ...], str] = dataclasses.field(default_factory=dict)
    dtype: str = "float32"  # of the drawn tensors (int64 for some integer-safe patterns)


def rule_examples(rule: Rule, *, reverse: bool = False) -> st.SearchStrategy[Example]:
    """Examples matching the rule's left-hand side (its right-hand side when `reverse`) whose
    guards all hold; raises SaturateError when the pattern uses an op with no shape rule."""
    pattern = rule.rhs if reverse else rule.lhs

    # Integer tensors flow through elementwise and shape ops too (shape arithmetic in real
    # models), where Div truncates: such patterns are sometimes drawn in int64.
    ops = _ops(pattern)
    integral = ops <= INTEGER_OPS

    @st.composite
    def draw(draw) -> Example:
        planner = Planner(draw, rule.guards)
        planner.plan(pattern)
        # Mod with fmod=0 (its default) is defined on integers only.
        dtype = np.int64 if integral and ("Mod" in ops or draw(st.integers(0, 3)) == 3) else np.float32
        values = {}
        for name, shape in planner.shapes.items():
            fill = planner.hints.get(name, {}).get("fill")
            if name in planner.forced:
                values[name] = planner.forced[name]
            elif fill is not None:
                values[name] = np.full(shape, fill, dtype)
            else:
                values[name] = _cast(draw(constants(shape, planner.sign_of(name)), label=name), dtype)
        example = Example(values, frozenset(planner.consts), dict(planner.attrs), planner.node_attrs,
                          planner.node_ops, np.dtype(dtype).name)
        assume(guards_hold(rule, example))
        return example

    return draw()


INTEGER_OPS = frozenset({"Add", "Sub", "Mul", "Div", "Mod", "Neg", "Abs", "Relu", "Max", "Min", "Identity",
                         "Reshape", "Transpose", "Flatten"})


def _ops(term: Term) -> set[str]:
    if isinstance(term, OpTerm):
        return {term.op}.union(*(_ops(a) for a in term.args))
    return set()


def _cast(values: np.ndarray, dtype: Any) -> np.ndarray:
    """Float32 draws as `dtype`; integers keep sign and stay nonzero where the draw was."""
    if np.dtype(dtype).kind != "i":
        return values.astype(dtype)
    whole = np.maximum(np.floor(np.abs(values)), values != 0)
    return np.asarray(np.sign(values) * whole).astype(dtype)


def guards_hold(rule: Rule, example: Example) -> bool:
    """Whether every guard of the rule holds on the example (evaluated with saturate.lang.builtins)."""
    return all(_guard(g.fn, g.args, example) for g in rule.guards)


def _guard(fn: str, args: tuple[Term, ...], ex: Example) -> bool:
    spec = builtins.GUARDS.get(fn)
    if spec is None:
        raise SaturateError(f"unknown guard '{fn}'")
    try:
        return bool(spec.impl(*(argument(a, kind, ex) for a, kind in zip(args, spec.params))))
    except (ValueError, TypeError, IndexError):
        return False


def argument(term: Term, kind: str, ex: Example) -> Any:
    """The value a builtin of parameter `kind` receives for `term` under the example's bindings."""
    if isinstance(term, Var):
        value = ex.values[term.name]
        if kind == "type":
            return value.dtype.name
        if kind == "isconst":
            return term.name in ex.consts
        return tuple(value.shape) if kind == "value" else value
    if isinstance(term, AttrVar):
        value = ex.attrs[term.name]
        return tuple(value) if isinstance(value, list) else value
    if isinstance(term, Num):
        return term.value
    if isinstance(term, IntList):
        return tuple(term.values)
    if isinstance(term, Str):
        return term.value
    if isinstance(term, Call):
        value = evaluate_call(term, ex)
        if kind == "int":
            return int(np.asarray(value).reshape(()))
        return tuple(np.shape(value)) if kind == "value" else value
    raise SaturateError(f"an op term cannot be an argument of a guard or constant function")


def evaluate_call(call: Call, ex: Example) -> Any:
    """Evaluate a constant expression or int query on the example's values (numpy, saturate.lang.builtins)."""
    spec = builtins.CONST_FUNCS.get(call.fn) or builtins.QUERIES.get(call.fn)
    if spec is None:
        raise SaturateError(f"unknown function '{call.fn}'")
    return spec.impl(*(argument(a, kind, ex) for a, kind in zip(call.args, spec.params)))


def literal(value: Any, ex: Example) -> Any:
    """An attribute value written in a rule, resolved under the example's captures."""
    if isinstance(value, (Num, Str)):
        return value.value
    if isinstance(value, IntList):
        return list(value.values)
    if isinstance(value, AttrVar):
        return ex.attrs[value.name]
    if isinstance(value, Call):
        result = evaluate_call(value, ex)
        return list(result) if isinstance(result, tuple) else result
    raise SaturateError(f"cannot use {value!r} as an attribute value")


def is_pattern(term: Term) -> bool:
    """A term built of ops, variables and literals only (no constant expression): it can be drawn."""
    if isinstance(term, OpTerm):
        return all(is_pattern(a) for a in term.args)
    return not isinstance(term, Call)
