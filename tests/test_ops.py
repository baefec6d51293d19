"""Tests for the op facts (saturate.ops.schema) and window geometry (saturate.core.geometry)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator

from saturate.core import geometry
from saturate.ops.schema import op_table, spec
from saturate.lang.parser import parse_rules


def test_arity_and_defaults_come_from_the_schema_of_the_opset():
    assert spec("Softmax", 11).attrs["axis"] == 1
    assert spec("Softmax", 13).attrs["axis"] == -1
    assert (spec("Unsqueeze", 11).min_inputs, spec("Unsqueeze", 13).min_inputs) == (1, 2)
    assert spec("BatchNormalization", 15).attrs["epsilon"] == 1e-5
    assert spec("Conv").attrs["kernel_shape"] is None
    assert spec("NoSuchOp") is None and spec("Relu", domain="com.example") is None


def test_the_rule_table_merges_every_version():
    unsqueeze = op_table()["Unsqueeze"]
    assert (unsqueeze.min_inputs, unsqueeze.max_inputs) == (1, 2)
    assert "axes" in unsqueeze.attrs  # the pre-13 attribute form stays matchable
    assert op_table()["Concat"].max_inputs > 1000


def test_rules_may_name_any_onnx_op_without_declaring_it():
    sets = parse_rules("ruleset t level 1\nrule hs HardSwish(Identity(x)) => HardSwish(x)\n", "t.rules")
    assert sets[0].rules[0].name == "hs"


def _onnx_conv_shape(x, w, **attrs):
    node = helper.make_node("Conv", ["x", "w"], ["y"], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x),
                                            helper.make_tensor_value_info("w", onnx.TensorProto.FLOAT, w)],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    xs = np.zeros(x, np.float32)
    return ReferenceEvaluator(model).run(None, {"x": xs, "w": np.zeros(w, np.float32)})[0].shape


@pytest.mark.parametrize("x,w,attrs", [
    ((1, 2, 7, 9), (3, 2, 3, 3), {"strides": [2, 2], "pads": [1, 0, 1, 2]}),
    ((1, 2, 8, 5), (3, 2, 3, 2), {"auto_pad": "SAME_UPPER", "strides": [3, 2]}),
    ((1, 2, 8, 5), (3, 2, 3, 2), {"auto_pad": "SAME_LOWER", "dilations": [2, 1]}),
    ((1, 2, 8, 5), (3, 2, 3, 2), {"auto_pad": "VALID", "strides": [2, 1]}),
    ((2, 4, 11), (4, 1, 5), {"group": 4, "dilations": [2], "pads": [3, 1]}),
    ((1, 1, 5, 6, 7), (2, 1, 2, 3, 2), {"strides": [1, 2, 3]}),
])
def test_conv_output_shape_agrees_with_onnx_reference(x, w, attrs):
    assert geometry.conv_output_shape(attrs, x, w) == _onnx_conv_shape(x, w, **attrs)


def test_symbolic_spatial_dims_stay_unknown_and_bad_attributes_give_none():
    assert geometry.conv_output_shape({}, ("N", 3, "H", 8), (4, 3, 3, 3)) == ("N", 4, None, 6)
    assert geometry.conv_output_shape({"pads": [0, 0]}, (1, 3, 8, 8), (4, 3, 3, 3)) is None


def test_ceil_mode_drops_a_window_that_starts_in_the_end_padding():
    win = geometry.window({"strides": [2], "pads": [1, 1]}, [4], [2], ceil_mode=True)
    assert win.out == (3,)
    with pytest.raises(geometry.GeometryError):
        geometry.window({"pads": [-1, 0]}, [4], [2])


def test_input_side_inverts_the_output_size():
    for out, k, s, d, pads in [(3, 3, 2, 1, (1, 1)), (5, 2, 1, 2, (0, 1)), (1, 3, 3, 1, (0, 0))]:
        side = geometry.input_side(out, k, s, d, pads)
        assert geometry.window({"strides": [s], "dilations": [d], "pads": list(pads)}, [side], [k]).out == (out,)


def _onnx_output_shapes(op, x_shape, consts, n_outputs=1, **attrs):
    """Output shapes of one `op` node as ONNX's reference implementation runs it."""
    names = ["x"] + [n if v is not None else "" for n, v in consts]
    node = helper.make_node(op, names, [f"y{k}" for k in range(n_outputs)], **attrs)
    inits = [onnx.numpy_helper.from_array(np.asarray(v, np.int64), n) for n, v in consts if v is not None]
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info(f"y{k}", onnx.TensorProto.FLOAT, None)
                               for k in range(n_outputs)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    return [y.shape for y in ReferenceEvaluator(model).run(None, {"x": np.zeros(x_shape, np.float32)})]


@pytest.mark.parametrize("shape,starts,ends,axes,steps", [
    ((7, 5), [1, -2], [6, 100], None, None),
    ((7, 5), [-1], [-(2 ** 62)], [0], [-1]),
    ((7, 5), [100], [-100], [1], [-2]),
    ((7, 5, 3), [0, 4], [7, 0], [-3, 1], [3, -1]),
    ((4,), [-10], [2], None, [1]),
    ((6, 2), [2], [2], [0], None),
])
def test_slice_ranges_agree_with_onnx_reference(shape, starts, ends, axes, steps):
    consts = [("s", starts), ("e", ends), ("a", axes), ("t", steps)]
    want = _onnx_output_shapes("Slice", shape, consts)[0]
    assert tuple(c for _, _, c in geometry.slice_ranges(shape, starts, ends, axes, steps)) == want


def test_slice_of_a_symbolic_dim_is_unknown_only_where_it_cuts():
    assert [c for _, _, c in geometry.slice_ranges(("N", 8), [2], [6], [1])] == ["N", 4]
    assert [c for _, _, c in geometry.slice_ranges(("N", 8), [0], [1], [0])] == [None, 8]
    with pytest.raises(geometry.GeometryError):
        geometry.slice_ranges((3,), [0], [3], [0], [0])


@pytest.mark.parametrize("dim,outputs,split,num", [(10, 3, None, 3), (9, 3, None, None), (7, 2, [3, 4], None)])
def test_split_sizes_agree_with_onnx_reference(dim, outputs, split, num):
    attrs = {"axis": 1, **({"num_outputs": num} if num else {})}
    if split is None and num is None:
        attrs["num_outputs"] = outputs
    want = [s[1] for s in _onnx_output_shapes("Split", (2, dim), [("split", split)], outputs, **attrs)]
    assert geometry.split_sizes(dim, outputs, split, num) == want
    with pytest.raises(geometry.GeometryError):
        geometry.split_sizes(dim, outputs + 1, split or [dim])


def test_squeeze_unsqueeze_and_pad_shapes_agree_with_onnx_reference():
    assert geometry.squeeze_shape((1, 3, 1, 2), [0, -2]) == _onnx_output_shapes(
        "Squeeze", (1, 3, 1, 2), [("a", [0, -2])])[0]
    assert geometry.squeeze_shape((1, 3, 1, 2), []) == (3, 2)
    assert geometry.squeeze_shape(("N", 1, 4), [1]) == ("N", 4)
    with pytest.raises(geometry.GeometryError):
        geometry.squeeze_shape((2, 3), [0])
    assert geometry.unsqueeze_shape((3, 2), [0, -1]) == _onnx_output_shapes("Unsqueeze", (3, 2), [("a", [0, -1])])[0]
    begin, end = geometry.pad_amounts(3, [1, 2, 0, 3], [0, -1])
    padded = tuple(d + b + e for d, b, e in zip((2, 3, 4), begin, end))
    assert padded == _onnx_output_shapes("Pad", (2, 3, 4), [("p", [1, 2, 0, 3]), ("v", None), ("a", [0, -1])])[0]
