"""Shape computations as exporters write them: folded by rules, run the same afterwards."""

from __future__ import annotations

import numpy as np
from engine_util import Builder, assert_same, ops

from saturate.lang.parser import load_rules
from saturate.pipeline import optimize

RULES = {r.name: r for r in load_rules(None, level=3)}
I64 = np.int64


def test_a_dim_read_from_a_shape_folds_to_a_scalar_constant():
    # Gather with a scalar index gives a 0-d dim; Unsqueeze (not folded here) must still see 0-d.
    b = Builder(shape=(2, 3))
    dim = b.op("Gather", b.op("Shape", "x"), b.const(np.array(1, I64)), axis=0)
    shape = b.op("Concat", b.const(np.array([-1], I64)), b.op("Unsqueeze", dim, b.const(np.array([0], I64))), axis=0)
    before = b.build(b.op("Reshape", "x", shape))
    after, _ = optimize(before, [RULES["shape-gather"]])
    folded = [v for k, v in after.constants.items() if k.startswith("c_fold")]
    assert [v.shape for v in folded] == [()]
    assert_same(before, after, b.sample())


def test_integer_slice_bounds_computed_from_a_shape_fold_away():
    # ShuffleNet's channel split: x[:, :C/2] with C read from the shape, in int64 arithmetic.
    b = Builder(shape=(1, 8, 2, 2))
    c = b.op("Gather", b.op("Shape", "x"), b.const(np.array([1], I64)), axis=0)
    half = b.op("Div", c, b.const(np.array([2], I64)))
    end = b.op("Mul", b.op("Add", half, b.const(np.array([1], I64))), b.const(np.array([1], I64)))
    y = b.op("Slice", "x", b.op("Sub", end, b.const(np.array([1], I64))), b.op("Mul", half, b.const(np.array([2], I64))),
             b.const(np.array([1], I64)))
    before = b.build(b.op("Relu", y))
    after, _ = optimize(before)
    assert ops(after) == ["Slice", "Relu"]
    start, stop = (after.constants[i] for i in after.nodes[0].inputs[1:3])
    assert start.tolist() == [4] and stop.tolist() == [8]
    assert_same(before, after, b.sample())


def test_integer_division_truncates_toward_zero_when_folded():
    b = Builder(shape=(3, 2))
    q = b.op("Div", b.const(np.array([-7, 7], I64)), b.const(np.array([2, -2], I64)))
    before = b.build(b.op("Add", b.op("Cast", q, to=1), "x"))
    after, _ = optimize(before)
    assert ops(after) == ["Add"]
    folded = [v for v in after.constants.values() if v.dtype == np.float32 and v.shape == (2,)]
    assert [v.tolist() for v in folded] == [[-3.0, -3.0]]
    assert_same(before, after, b.sample())
