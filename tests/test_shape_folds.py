"""Shape computations as exporters write them: folded by rules, run the same afterwards."""

from __future__ import annotations

import numpy as np
from engine_util import Builder, assert_same, assert_same_ort, ops

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
    folded = [v for k, v in after.constants.items() if k not in before.constants]
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


# ---- symbolic batch: what ONNX's shape inference knows of a graph whose batch is a name ----------

def _with_symbolic_batch(g, name: str = "batch"):
    """`g` exported to ONNX with dim 0 of every input named, and imported again: the types are
    what shape inference derives, as for a model exported with a dynamic batch."""
    from saturate.frontend.onnx_io import export_model, import_model

    model = export_model(g)
    del model.graph.value_info[:]
    for vi in list(model.graph.input) + list(model.graph.output):
        dim = vi.type.tensor_type.shape.dim[0]
        dim.ClearField("dim_value")
        dim.dim_param = name
    return import_model(model)


def _batch_of(b: Builder, n: int) -> dict[str, np.ndarray]:
    return {k: np.concatenate([v] * n) for k, v in b.sample().items()}


def test_a_reshape_target_read_from_a_symbolic_batch_becomes_a_constant():
    # x.view(x.size(0), 6, 2, 4): the batch is read from the element count (-1), so the target
    # no longer depends on the input's shape, and the shape arithmetic goes.
    b = Builder(shape=(1, 6, 8))
    n = b.op("Unsqueeze", b.op("Gather", b.op("Shape", "x"), b.const(np.array(0, I64)), axis=0),
             b.const(np.array([0], I64)))
    shape = b.op("Concat", n, b.const(np.array([6], I64)), b.const(np.array([2, 4], I64)), axis=0)
    before = _with_symbolic_batch(b.build(b.op("Relu", b.op("Reshape", "x", shape))))
    after, _ = optimize(before)
    assert ops(after) == ["Reshape", "Relu"]
    assert after.constants[after.nodes[0].inputs[1]].tolist() == [-1, 6, 2, 4]
    assert_same_ort(before, after, _batch_of(b, 3))


def test_one_unknown_dim_of_a_reshape_target_becomes_minus_one():
    # The batch lands where the input has another dim: it cannot be copied, the count reads it.
    b = Builder(shape=(2, 6, 8))
    n = b.op("Unsqueeze", b.op("Gather", b.op("Shape", "x"), b.const(np.array(0, I64)), axis=0),
             b.const(np.array([0], I64)))
    shape = b.op("Concat", b.const(np.array([6], I64)), n, b.const(np.array([8], I64)), axis=0)
    before = _with_symbolic_batch(b.build(b.op("Reshape", "x", shape)))
    after, _ = optimize(before)
    assert "Shape" not in ops(after)
    reshape = next(n for n in after.nodes if n.op == "Reshape")
    assert after.constants[reshape.inputs[1]].tolist() == [6, -1, 8]
    assert_same_ort(before, after, _batch_of(b, 3))


def test_static_dims_sliced_from_a_shape_with_a_symbolic_batch_fold():
    # A ViT scales attention by 1/sqrt(head size), read as Shape(q)[-1:].
    b = Builder(shape=(1, 4, 16))
    d = b.op("Slice", b.op("Shape", "x"), b.const(np.array([-1], I64)), b.const(np.array([2**63 - 1], I64)))
    scale = b.op("Sqrt", b.op("Cast", d, to=1))
    before = _with_symbolic_batch(b.build(b.op("Div", "x", scale)))
    after, _ = optimize(before)
    assert ops(after) in (["Div"], ["Mul"])
    assert_same_ort(before, after, _batch_of(b, 2))


def test_a_slice_keeping_every_element_is_its_input():
    b = Builder(shape=(1, 4, 6, 6))
    y = b.op("Slice", "x", b.const(np.array([0, 0], I64)), b.const(np.array([6, 2**62], I64)),
             b.const(np.array([2, 3], I64)))
    z = b.op("Slice", "x", b.const(np.array([0], I64)), b.const(np.array([5], I64)), b.const(np.array([2], I64)))
    before = b.build(b.op("Relu", y), b.op("Relu", z))
    after, _ = optimize(before)
    assert sorted(ops(after)) == ["Relu", "Relu", "Slice"]    # the second one drops a row
    assert_same(before, after, b.sample())


def test_padding_computed_from_shapes_folds_and_the_shapes_after_it_are_known():
    # Swin pads each stage to a multiple of its window with pads computed from the shape; once
    # they fold to zeros the Pad goes, and shape reads after it fold as well.
    b = Builder(shape=(1, 8, 8, 4))
    h = b.op("Gather", b.op("Shape", "x"), b.const(np.array(1, I64)), axis=0)
    extra = b.op("Mod", b.op("Sub", b.const(np.array(4, I64)), b.op("Mod", h, b.const(np.array(4, I64)))),
                 b.const(np.array(4, I64)))
    row = b.op("Concat", b.const(np.array([0, 0, 0], I64)), b.op("Unsqueeze", extra, b.const(np.array([0], I64))),
               b.const(np.array([0, 0, 0, 0], I64)), axis=0)
    pads = b.op("Reshape", b.op("Transpose", b.op("Reshape", row, b.const(np.array([2, 4], I64))), perm=[1, 0]),
                b.const(np.array([-1], I64)))
    padded = b.op("Pad", "x", pads)
    windows = b.op("Reshape", padded, b.op("Concat", b.const(np.array([-1], I64)),
                                           b.op("Slice", b.op("Shape", padded), b.const(np.array([2], I64)),
                                                b.const(np.array([4], I64))), axis=0))
    before = b.build(b.op("Relu", windows))
    after, _ = optimize(before)
    assert ops(after) == ["Reshape", "Relu"]
    assert after.constants[after.nodes[0].inputs[1]].tolist() == [-1, 8, 4]
    assert_same(before, after, b.sample())


def test_a_rank3_linear_between_reshapes_becomes_one_gemm():
    # Swin's window attention: Reshape -> MatMul + bias -> Reshape. Over the rows it is a Gemm,
    # and the Reshapes on either side absorb the ones that flatten and restore the rows.
    b = Builder(shape=(2, 4, 4, 8))
    rows = b.op("Reshape", "x", b.const(np.array([8, 4, 8], I64)))
    y = b.op("Add", b.op("MatMul", rows, b.rand(8, 6)), b.rand(6))
    before = b.build(b.op("Reshape", y, b.const(np.array([2, 16, 6], I64))))
    after, _ = optimize(before)
    assert ops(after) == ["Reshape", "Gemm", "Reshape"]
    assert_same(before, after, b.sample())


def test_unsqueeze_squeeze_and_a_transpose_of_unit_dims_merge_into_one_reshape():
    b = Builder(shape=(1, 6, 8))
    t = b.op("Transpose", "x", perm=[1, 0, 2])                       # moves only the 1
    u = b.op("Unsqueeze", b.op("Reshape", t, b.const(np.array([48], I64))), b.const(np.array([0], I64)))
    before = b.build(b.op("Relu", b.op("Squeeze", b.op("Unsqueeze", u, b.const(np.array([2], I64))),
                                       b.const(np.array([0], I64)))))
    after, _ = optimize(before)
    assert ops(after) == ["Reshape", "Relu"]
    assert_same(before, after, b.sample())


def test_a_value_of_unknown_rank_leaves_dim_rules_undecided():
    # Guards over dims (reshape-same) read nothing of a value whose rank is unknown.
    import onnx
    from onnx import TensorProto, helper

    from saturate.frontend.onnx_io import import_model

    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "s"], ["y"]), helper.make_node("Relu", ["y"], ["z"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(np.array([-1], I64), "s")])
    before = import_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    after, _ = optimize(before)
    assert ops(after) == ["Reshape", "Relu"]
    assert_same(before, after, {"x": np.arange(6, dtype=np.float32).reshape(2, 3)})
