"""Rule checking, drawing stage: examples that match a rule's pattern and satisfy its guards."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from saturate.check.compiled import compiled, decide_example
from saturate.check.planner import Planner
from saturate.check.strategies import draw_constant
from saturate.lang.ast import OpTerm, Rule, Term

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
    side = compiled(rule, reverse)

    @st.composite
    def draw(draw) -> Example:
        planner = Planner(draw, rule.guards)
        planner.plan(pattern)
        # Mod with fmod=0 (its default) is defined on integers only. Other integer-safe patterns
        # are drawn in int64 half the time, so a rule wrong only on integers (truncating Div)
        # fails within a few dozen examples.
        dtype = np.int64 if integral and ("Mod" in ops or draw(st.booleans())) else np.float32
        values = {}
        for name, shape in planner.shapes.items():
            fill = planner.hints.get(name, {}).get("fill")
            if name in planner.forced:
                values[name] = planner.forced[name]
            elif fill is not None:
                values[name] = np.full(shape, fill, dtype)
            else:
                values[name] = _cast(draw_constant(draw, shape, planner.sign_of(name)), dtype)
        example = Example(values, frozenset(planner.consts), dict(planner.attrs), planner.node_attrs,
                          planner.node_ops, np.dtype(dtype).name)
        # Guards decided as the engine decides them (saturate.engine.guards.decide).
        assume(decide_example(side, example.values, example.consts, example.node_attrs) is not None)
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


def guards_hold(rule: Rule, example: Example, reverse: bool = False) -> bool:
    """Whether the engine would fire the rule on the example: the pattern's attribute tests and
    every guard hold (decided by saturate.engine.guards.decide, as in a run)."""
    side = compiled(rule, reverse)
    return decide_example(side, example.values, example.consts, example.node_attrs) is not None
