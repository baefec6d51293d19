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
from saturate.check.schema import BASE_OPSET, EXOTIC_OPS, EXOTIC_OPSET, RANDOM_OPS, np_dtype, opset_for
from saturate.check.strategies import SeqShape, draw_constant, draw_sequence, draw_strings
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


# Values beyond the narrow types' ranges (float8e4m3fn's 448, e4m3fnuz's 240, float8e5m2's
# 57344, float4's 6, int4's -8..15), between their largest values and the next power of two, and
# below their subnormals; inf and NaN for a float target only (an integer one has no value for them).
_BEYOND = [1e6, -1e6, 500.0, -300.0, 60000.0, -7e4, 7.0, -6.5, 17.0, -9.0, 1e-9, -3e-6, 464.0]
_NONFINITE = [np.inf, -np.inf, np.nan]


def rule_examples(rule: Rule, *, reverse: bool = False) -> st.SearchStrategy[Example]:
    """Examples matching the rule's left-hand side (its right-hand side when `reverse`) whose
    guards all hold; raises SaturateError when the pattern uses an op the checker cannot draw."""
    pattern = rule.rhs if reverse else rule.lhs
    side = compiled(rule, reverse)
    opset = rule_opset(rule)
    ops = _ops(rule.lhs) | _ops(rule.rhs)
    random = bool(ops & set(RANDOM_OPS))
    # A rule made of casts, quantization and data movement alone runs now and then at the newest
    # opset, whose schemas allow float8, int4, float4 and float8e8m0 (schema.EXOTIC_WEIGHTS).
    opsets = [opset] + ([EXOTIC_OPSET] if ops and ops <= EXOTIC_OPS and opset < EXOTIC_OPSET else [])
    newer = 3 if ops & {"Cast", "CastLike"} else 1

    @st.composite
    def draw(draw) -> Example:
        # The newer opset three times in four for a rule over casts, else one in four (patterns of
        # quantization and movement ops cost more rejected draws there).
        opset = opsets[-1] if len(opsets) > 1 and draw(st.integers(0, 3)) >= 4 - newer else opsets[0]
        planner = Planner(draw, rule.guards, opset)
        planner.plan(pattern)
        values = {}
        for name, shape in planner.shapes.items():
            # Each variable in a dtype its ops' type constraints allow (Planner.assign_types).
            dtype = np_dtype(planner.dtypes.get(name, "float32"))
            fill = planner.hints.get(name, {}).get("fill")
            if isinstance(shape, SeqShape):   # a sequence variable: a list of tensors
                values[name] = draw_sequence(draw, shape, planner.sign_of(name), dtype)
            elif name in planner.forced:
                values[name] = np.asarray(planner.forced[name]).astype(dtype)
            elif fill is not None:
                values[name] = np.full(shape, fill, dtype)
            elif dtype.kind == "O":
                values[name] = draw_strings(draw, shape, planner.hints.get(name, {}).get("numbers"))
            else:
                values[name] = draw_constant(draw, shape, planner.sign_of(name), dtype)
                specials = planner.hints.get(name, {}).get("specials")
                if specials and dtype.kind == "f" and dtype.isbuiltin == 1 and values[name].size \
                        and draw(st.booleans()):
                    # One place out of the cast's target range (a cast's saturation table maps it).
                    at = draw(st.integers(0, values[name].size - 1))
                    pool = _BEYOND if specials == "int" else _BEYOND + _NONFINITE
                    with np.errstate(over="ignore"):   # 1e6 or 7e4 in a float16 is inf: a special too
                        values[name].reshape(-1)[at] = draw(st.sampled_from(pool))
        _order_for_precedes(draw, planner, values)
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
    """The opset a rule's graphs run at: the checker's, or a newer one an op of the rule needs, or
    that gives an op the attributes its pattern names (CastLike's `saturate`, from opset 19)."""
    import onnx

    opset = opset_for(frozenset(_ops(rule.lhs) | _ops(rule.rhs)))
    for op, names in _named_attrs(rule.lhs) + _named_attrs(rule.rhs):
        try:
            if names <= set(onnx.defs.get_schema(op, opset).attributes):
                continue
        except onnx.defs.SchemaError:
            continue
        for version in range(opset + 1, onnx.defs.onnx_opset_version() + 1):
            try:
                if names <= set(onnx.defs.get_schema(op, version).attributes):
                    opset = version
                    break
            except onnx.defs.SchemaError:
                break
    return opset


def _named_attrs(term: Term) -> list[tuple[str, set[str]]]:
    if not isinstance(term, OpTerm):
        return []
    return [(term.op, {k for k, _ in term.attrs})] + [x for a in term.args for x in _named_attrs(a)]


def _ops(term: Term) -> set[str]:
    if isinstance(term, OpTerm):
        return {term.op}.union(*(_ops(a) for a in term.args))
    return set()


def _order_for_precedes(draw: Any, planner: Planner, values: dict[str, Any]) -> None:
    """Weights merged in the order of their first rows (precedes(a, b)): three drawn apart were in
    order once in six draws. Mostly, b's first row is moved after a's (the draw of 0, hypothesis's
    simplest, moves it)."""
    for a, b in planner.precedes:
        va, vb = values.get(a), values.get(b)
        if not (isinstance(va, np.ndarray) and isinstance(vb, np.ndarray) and b not in planner.forced
                and va.ndim == 2 == vb.ndim and va.shape[0] == vb.shape[0] and va.size and vb.size
                and vb.dtype.kind in "fiu" and not tuple(va[0].tolist()) < tuple(vb[0].tolist())
                and draw(st.integers(0, 3)) < 3):
            continue
        first = va[0, 0]
        if vb.dtype.kind == "f":
            with np.errstate(over="ignore", invalid="ignore"):
                vb[0, 0] = first + abs(first) + 1
        elif first < np.iinfo(vb.dtype).max:
            vb[0, 0] = first + 1


def guards_hold(rule: Rule, example: Example, reverse: bool = False) -> bool:
    """Whether the engine would fire the rule on the example: the pattern's attribute tests and
    every guard hold (decided by saturate.engine.guards.decide, as in a run)."""
    side = compiled(rule, reverse)
    return decide_example(side, example.values, example.consts, example.node_attrs) is not None
