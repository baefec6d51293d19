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
from saturate.check.schema import BASE_OPSET, RANDOM_OPS, opset_for
from saturate.check.strategies import draw_constant, draw_strings
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
    dtype: str = "float32"  # of the pattern's output (each tensor has its own, drawn from its ops' types)
    opset: int = BASE_OPSET  # the graphs of both sides run at this opset
    # Variables whose values the planner chose (shapes, axes, pads), not drawn data.
    forced: frozenset[str] = frozenset()
    # Where the rule holds ops drawing random numbers: the seed its runs start from (checker.py).
    seed: int = 0
    # The engine's decision on the example as drawn, and the compiled side that made it.
    decision: Any = dataclasses.field(default=None, compare=False, repr=False)
    decided_by: Any = dataclasses.field(default=None, compare=False, repr=False)


def rule_examples(rule: Rule, *, reverse: bool = False) -> st.SearchStrategy[Example]:
    """Examples matching the rule's left-hand side (its right-hand side when `reverse`) whose
    guards all hold; raises SaturateError when the pattern uses an op the checker cannot draw."""
    pattern = rule.rhs if reverse else rule.lhs
    side = compiled(rule, reverse)
    opset = rule_opset(rule)
    random = bool((_ops(rule.lhs) | _ops(rule.rhs)) & set(RANDOM_OPS))

    @st.composite
    def draw(draw) -> Example:
        planner = Planner(draw, rule.guards, opset)
        planner.plan(pattern)
        values = {}
        for name, shape in planner.shapes.items():
            # Each variable in a dtype its ops' type constraints allow (Planner.assign_types).
            dtype = np.dtype(planner.dtypes.get(name, "float32"))
            fill = planner.hints.get(name, {}).get("fill")
            if name in planner.forced:
                values[name] = np.asarray(planner.forced[name]).astype(dtype)
            elif fill is not None:
                values[name] = np.full(shape, fill, dtype)
            elif dtype.kind == "O":
                values[name] = draw_strings(draw, shape, planner.hints.get(name, {}).get("numbers"))
            else:
                values[name] = draw_constant(draw, shape, planner.sign_of(name), dtype)
        example = Example(values, frozenset(planner.consts), dict(planner.attrs), planner.node_attrs,
                          planner.node_ops, planner.node_dtypes.get((), "float32"), opset,
                          frozenset(planner.forced), draw(st.integers(0, 2**20)) if random else 0)
        # Guards decided as the engine decides them (saturate.engine.guards.decide).
        example.decision = decide_example(side, example.values, example.consts, example.node_attrs)
        example.decided_by = side
        assume(example.decision is not None)
        return example

    return draw()


def rule_opset(rule: Rule) -> int:
    """The opset a rule's graphs run at: the checker's, or a newer one an op of the rule needs."""
    return opset_for(frozenset(_ops(rule.lhs) | _ops(rule.rhs)))


def _ops(term: Term) -> set[str]:
    if isinstance(term, OpTerm):
        return {term.op}.union(*(_ops(a) for a in term.args))
    return set()


def guards_hold(rule: Rule, example: Example, reverse: bool = False) -> bool:
    """Whether the engine would fire the rule on the example: the pattern's attribute tests and
    every guard hold (decided by saturate.engine.guards.decide, as in a run)."""
    side = compiled(rule, reverse)
    return decide_example(side, example.values, example.consts, example.node_attrs) is not None
