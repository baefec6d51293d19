"""Reference interpreter vs ONNX Runtime: hypothesis single-op cases, error paths, freeing."""

import weakref

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper

from saturate.frontend.onnx_io import export_model, import_model
from saturate.core.errors import SaturateError
from saturate.interp.interpreter import eval_node, run_graph
from saturate.core.ir import Graph, Node, ValueInfo
from saturate.ops import OpDef, registered

CASES = settings(max_examples=25, deadline=None)
OPSET = 19  # AveragePool dilations need 19; every other op here has opset-13+ semantics


def rel_error(got: np.ndarray, want: np.ndarray) -> float:
    """Norm-relative error: max|a-b| / max(1, max|b|)."""
    if want.size == 0:
        return 0.0
    diff = np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))
    return float(diff / max(1.0, float(np.max(np.abs(want.astype(np.float64))))))


def run_ort(op, inputs, attrs, n_out=1):
    """Run a one-node ONNX model in ONNX Runtime; inputs maps name ('' = omitted) -> array."""
    names = list(inputs)
    outs = [f"y{k}" for k in range(n_out)]
    vis = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
           for n, a in inputs.items() if n]
    node = helper.make_node(op, names, outs, **attrs)
    graph = helper.make_graph([node], "one", vis, [onnx.ValueInfoProto(name=o) for o in outs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=9)
    # Output types come from ONNX shape inference (dtype only: ORT checks the rest itself).
    inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(model).graph.value_info}
    for out in model.graph.output:
        out.type.tensor_type.elem_type = inferred[out.name].type.tensor_type.elem_type
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return model, sess.run(None, {n: a for n, a in inputs.items() if n})


def run_ours(op, inputs, attrs, n_out=1):
    """The same one-node model as an IR graph, through run_graph."""
    g = Graph(inputs=[n for n in inputs if n], outputs=[f"y{k}" for k in range(n_out)], opset=OPSET)
    for n, a in inputs.items():
        if n:
            g.values[n] = ValueInfo(a.dtype.name, tuple(a.shape))
    g.nodes = [Node(op, list(inputs), list(g.outputs), dict(attrs), name="n0")]
    res = run_graph(g, {n: a for n, a in inputs.items() if n})
    return [res[o] for o in g.outputs]


def check(op, inputs, attrs=None, n_out=1, tol=1e-5):
    """Our result equals ONNX Runtime's, both for the IR built here and for the imported model."""
    attrs = attrs or {}
    model, want = run_ort(op, inputs, attrs, n_out)
    imported = import_model(model)
    feeds = {n: a for n, a in inputs.items() if n}
    via_import = run_graph(imported, feeds)
    for got in (run_ours(op, inputs, attrs, n_out), [via_import[o] for o in imported.outputs]):
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape, (op, attrs, g.shape, w.shape)
            assert g.dtype == w.dtype, (op, attrs, g.dtype, w.dtype)
            assert rel_error(g, w) <= tol, (op, attrs, rel_error(g, w))


def arr(rng, shape, low=-2.0, high=2.0, dtype=np.float32):
    return np.asarray(rng.uniform(low, high, size=shape), dtype=dtype)


seeds = st.integers(0, 2**31 - 1)


# ---- Conv -------------------------------------------------------------------------------------

@CASES
@given(seed=seeds, nsp=st.sampled_from([1, 2, 2, 3]), data=st.data())
def test_conv(seed, nsp, data):
    rng = np.random.default_rng(seed)
    depthwise = data.draw(st.booleans())
    group = data.draw(st.integers(1, 4 if depthwise else 3))
    cg = 1 if depthwise else data.draw(st.integers(1, 3))
    mg = data.draw(st.integers(1, 2 if depthwise else 3))
    kernel = [data.draw(st.integers(1, 3)) for _ in range(nsp)]
    strides = [data.draw(st.integers(1, 3)) for _ in range(nsp)]
    auto = data.draw(st.sampled_from(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    # ONNX Runtime rejects dilations with SAME padding (the spec allows them).
    dil = [1 if auto.startswith("SAME") else data.draw(st.integers(1, 2)) for _ in range(nsp)]
    size = [(k - 1) * d + 1 + data.draw(st.integers(0, 5 if nsp < 3 else 2)) for k, d in zip(kernel, dil)]
    attrs = {"group": group, "strides": strides, "dilations": dil, "auto_pad": auto}
    if auto == "NOTSET":
        attrs["pads"] = [data.draw(st.integers(0, 2)) for _ in range(2 * nsp)]
    if data.draw(st.booleans()):
        attrs["kernel_shape"] = kernel
    n = data.draw(st.integers(1, 2))
    inputs = {"x": arr(rng, [n, cg * group] + size), "w": arr(rng, [mg * group, cg] + kernel)}
    if data.draw(st.booleans()):
        inputs["b"] = arr(rng, [mg * group])
    check("Conv", inputs, attrs)


# ---- pools ------------------------------------------------------------------------------------

def _pool_case(data, rng, nsp, with_dilation):
    kernel = [data.draw(st.integers(1, 3)) for _ in range(nsp)]
    auto = data.draw(st.sampled_from(["NOTSET", "NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    # ONNX Runtime sizes SAME pools without the dilation and fails when a stride exceeds the
    # kernel (negative pads; the spec clamps them at 0): compare only what it supports.
    strides = [data.draw(st.integers(1, k if auto.startswith("SAME") else 3)) for k in kernel]
    with_dilation = with_dilation and not auto.startswith("SAME")
    dil = [data.draw(st.integers(1, 2)) if with_dilation else 1 for _ in range(nsp)]
    attrs = {"kernel_shape": kernel, "strides": strides, "auto_pad": auto}
    if with_dilation:
        attrs["dilations"] = dil
    if auto == "NOTSET":
        # ONNX Runtime requires each pad to be smaller than the kernel.
        attrs["pads"] = [data.draw(st.integers(0, k - 1)) for k in kernel * 2]
        attrs["ceil_mode"] = data.draw(st.integers(0, 1))
    size = [(k - 1) * d + 1 + data.draw(st.integers(0, 5)) for k, d in zip(kernel, dil)]
    shape = [data.draw(st.integers(1, 2)), data.draw(st.integers(1, 3))] + size
    return arr(rng, shape), attrs


@CASES
@given(seed=seeds, nsp=st.sampled_from([1, 2, 2, 3]), data=st.data())
def test_max_pool(seed, nsp, data):
    rng = np.random.default_rng(seed)
    x, attrs = _pool_case(data, rng, nsp, with_dilation=True)
    check("MaxPool", {"x": x}, attrs)


@CASES
@given(seed=seeds, data=st.data())
def test_max_pool_indices(seed, data):
    rng = np.random.default_rng(seed)
    x, attrs = _pool_case(data, rng, 2, with_dilation=True)
    check("MaxPool", {"x": x}, attrs, n_out=2)


@CASES
@given(seed=seeds, nsp=st.sampled_from([1, 2, 2, 3]), data=st.data())
def test_average_pool(seed, nsp, data):
    rng = np.random.default_rng(seed)
    x, attrs = _pool_case(data, rng, nsp, with_dilation=data.draw(st.booleans()))
    attrs["count_include_pad"] = data.draw(st.integers(0, 1))
    check("AveragePool", {"x": x}, attrs)


@CASES
@given(seed=seeds, shape=st.lists(st.integers(1, 5), min_size=3, max_size=5))
def test_global_average_pool(seed, shape):
    check("GlobalAveragePool", {"x": arr(np.random.default_rng(seed), shape)})



@CASES
@given(seed=seeds, shape=st.lists(st.integers(1, 5), min_size=3, max_size=5), p=st.integers(1, 4))
def test_global_lp_pool(seed, shape, p):
    check("GlobalLpPool", {"x": arr(np.random.default_rng(seed), shape)}, {"p": p})


@CASES
@given(seed=seeds, data=st.data())
def test_max_roi_pool(seed, data):
    # Boxes anywhere around the image, reversed, and on half-pixels (where C's rounding and
    # numpy's differ), scaled down as a feature map's stride does.
    rng = np.random.default_rng(seed)
    n, h, w = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 9)), data.draw(st.integers(1, 9))
    boxes = data.draw(st.integers(1, 4))
    rois = np.zeros((boxes, 5), np.float32)
    rois[:, 0] = rng.integers(0, n, boxes)
    corners = rng.uniform(-3, max(h, w) * 1.5, (boxes, 4)).round(1)
    halves = rng.integers(0, max(h, w), (boxes, 4)) + 0.5
    rois[:, 1:] = np.where(rng.random((boxes, 4)) < 0.3, halves, corners)
    attrs = {"pooled_shape": [data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))],
             "spatial_scale": data.draw(st.sampled_from([1.0, 0.5, 0.25]))}
    check("MaxRoiPool", {"x": arr(rng, (n, 3, h, w)), "rois": rois}, attrs)


def test_max_roi_pool_refuses_a_box_of_another_batch():
    node = Node("MaxRoiPool", ["x", "rois"], ["y"], {"pooled_shape": [2, 2]}, name="roi")
    rois = np.array([[3, 0, 0, 2, 2]], np.float32)
    with pytest.raises(SaturateError, match=r"^node 'roi' \(MaxRoiPool\): roi 0 names batch 3, outside 0..0$"):
        eval_node(node, [np.zeros((1, 1, 4, 4), np.float32), rois])

# ---- elementwise ------------------------------------------------------------------------------

@st.composite
def broadcast_pair(draw):
    """Two shapes that broadcast together, of possibly different ranks."""
    full = draw(st.lists(st.integers(1, 4), min_size=0, max_size=4))
    a = [d if draw(st.booleans()) else 1 for d in full]
    b = [d if draw(st.booleans()) else 1 for d in full]
    a = a[draw(st.integers(0, len(a))):]
    b = b[draw(st.integers(0, len(b))):]
    return a, b


@CASES
@given(seed=seeds, op=st.sampled_from(["Add", "Sub", "Mul", "Div", "Pow", "Max", "Min"]),
       shapes=broadcast_pair())
def test_binary_broadcast(seed, op, shapes):
    rng = np.random.default_rng(seed)
    a, b = arr(rng, shapes[0], 0.5, 2.0), arr(rng, shapes[1], 0.5, 2.0)
    if op in ("Sub", "Mul", "Add", "Max", "Min"):
        a = np.asarray(a - 1.25)  # mix signs where the op allows it
    check(op, {"a": a, "b": b})


@pytest.mark.parametrize("attrs", [{"value_floats": [1.5, -2.0]}, {"value_int": 7}, {"value_ints": [3, 4]},
                                   {"value_float": 0.25}])
def test_constant(attrs):
    check("Constant", {}, attrs)


def test_clip_bounds_as_attributes_before_opset_11():
    node = Node("Clip", ["x"], ["y"], {"min": -0.5, "max": 0.5}, name="clip6")
    (y,) = eval_node(node, [np.array([-2.0, 0.25, 2.0], np.float32)])
    assert y.dtype == np.float32 and y.tolist() == [-0.5, 0.25, 0.5]


def test_integer_div_truncates_like_onnx():
    a = np.array([7, -7, 7, -7, 0], np.int64)
    b = np.array([2, 2, -2, -2, 3], np.int64)
    check("Div", {"a": a, "b": b})


UNARY = {
    "Relu": (-2, 2), "Sigmoid": (-8, 8), "Tanh": (-3, 3), "Erf": (-3, 3), "Neg": (-2, 2),
    "Sqrt": (0.01, 4), "Reciprocal": (0.25, 4), "Exp": (-3, 3), "Log": (0.01, 4), "Abs": (-2, 2),
    "Identity": (-2, 2), "Softmax": (-4, 4), "Dropout": (-2, 2),
}


@CASES
@given(seed=seeds, op=st.sampled_from(sorted(UNARY)),
       shape=st.lists(st.integers(1, 4), min_size=1, max_size=4), data=st.data())
def test_unary(seed, op, shape, data):
    attrs = {}
    if op == "Softmax" and data.draw(st.booleans()):
        attrs["axis"] = data.draw(st.integers(-len(shape), len(shape) - 1))
    check(op, {"x": arr(np.random.default_rng(seed), shape, *UNARY[op])}, attrs)


@CASES
@given(seed=seeds, shape=st.lists(st.integers(1, 4), max_size=4), alpha=st.floats(0.0, 1.0))
def test_leaky_relu(seed, shape, alpha):
    check("LeakyRelu", {"x": arr(np.random.default_rng(seed), shape)}, {"alpha": alpha})


@CASES
@given(seed=seeds, shape=st.lists(st.integers(1, 4), max_size=4),
       lo=st.one_of(st.none(), st.floats(-1, 0.5)), hi=st.one_of(st.none(), st.floats(-0.5, 1)))
def test_clip(seed, shape, lo, hi):
    inputs = {"x": arr(np.random.default_rng(seed), shape)}
    inputs["" if lo is None else "lo"] = np.array(lo if lo is not None else 0, np.float32)
    if hi is not None:
        inputs["hi"] = np.array(hi, np.float32)
    if lo is None and hi is None:
        del inputs[""]
    check("Clip", inputs)


@CASES
@given(seed=seeds, shape=st.lists(st.integers(1, 4), min_size=2, max_size=5), eps=st.floats(1e-6, 1e-2))
def test_batch_norm(seed, shape, eps):
    rng = np.random.default_rng(seed)
    c = shape[1]
    inputs = {"x": arr(rng, shape), "s": arr(rng, [c]), "b": arr(rng, [c]), "m": arr(rng, [c]),
              "v": arr(rng, [c], 0.1, 2.0)}
    check("BatchNormalization", inputs, {"epsilon": eps})


# ---- linear algebra ---------------------------------------------------------------------------

@CASES
@given(seed=seeds, m=st.integers(1, 5), k=st.integers(1, 5), n=st.integers(1, 5),
       ta=st.integers(0, 1), tb=st.integers(0, 1), alpha=st.floats(-2, 2), beta=st.floats(-2, 2),
       c=st.sampled_from(["none", "scalar", "row", "col", "full", "1n"]))
def test_gemm(seed, m, k, n, ta, tb, alpha, beta, c):
    rng = np.random.default_rng(seed)
    inputs = {"a": arr(rng, [k, m] if ta else [m, k]), "b": arr(rng, [n, k] if tb else [k, n])}
    shapes = {"scalar": [], "row": [n], "col": [m, 1], "full": [m, n], "1n": [1, n]}
    if c != "none":
        inputs["c"] = arr(rng, shapes[c])
    check("Gemm", inputs, {"transA": ta, "transB": tb, "alpha": alpha, "beta": beta})


@CASES
@given(seed=seeds, batch=broadcast_pair(), m=st.integers(1, 4), k=st.integers(1, 4), n=st.integers(1, 4),
       vec_a=st.booleans(), vec_b=st.booleans())
def test_matmul(seed, batch, m, k, n, vec_a, vec_b):
    rng = np.random.default_rng(seed)
    a = [k] if vec_a else batch[0] + [m, k]
    b = [k] if vec_b else batch[1] + [k, n]
    check("MatMul", {"a": arr(rng, a), "b": arr(rng, b)})


# ---- shapes -----------------------------------------------------------------------------------

@CASES
@given(seed=seeds, shape=st.lists(st.integers(1, 4), min_size=1, max_size=4), data=st.data())
def test_reshape(seed, shape, data):
    x = arr(np.random.default_rng(seed), shape)
    # A target shape: the input's dims permuted and partly merged.
    dims = list(data.draw(st.permutations(shape)))
    while len(dims) > 1 and data.draw(st.booleans()):
        dims[0:2] = [dims[0] * dims[1]]
    target = list(dims)
    for i, d in enumerate(dims):
        if i < len(shape) and shape[i] == d and data.draw(st.booleans()):
            target[i] = 0
    if data.draw(st.booleans()):
        target[data.draw(st.integers(0, len(target) - 1))] = -1
    allowzero = 1 if 0 not in target and data.draw(st.booleans()) else 0
    check("Reshape", {"x": x, "s": np.array(target, np.int64)}, {"allowzero": allowzero})


def test_reshape_allowzero_keeps_literal_zero():
    check("Reshape", {"x": np.zeros((0, 3), np.float32), "s": np.array([3, 0], np.int64)}, {"allowzero": 1})


@CASES
@given(seed=seeds, shape=st.lists(st.integers(1, 4), min_size=1, max_size=4), data=st.data())
def test_flatten_transpose_squeeze(seed, shape, data):
    x = arr(np.random.default_rng(seed), shape)
    check("Flatten", {"x": x}, {"axis": data.draw(st.integers(-len(shape), len(shape)))})
    check("Transpose", {"x": x}, {"perm": data.draw(st.permutations(range(len(shape))))})
    check("Transpose", {"x": x})
    ones = [i for i, d in enumerate(shape) if d == 1]
    check("Squeeze", {"x": x, "axes": np.array(ones, np.int64)} if ones else {"x": x})
    axes = sorted(data.draw(st.sets(st.integers(0, len(shape)), min_size=1, max_size=2)))
    check("Unsqueeze", {"x": x, "axes": np.array(axes, np.int64)})
    check("Shape", {"x": x})
    check("Cast", {"x": x}, {"to": onnx.TensorProto.DOUBLE})


@CASES
@given(seed=seeds, shape=st.lists(st.integers(1, 4), min_size=1, max_size=4), data=st.data())
def test_concat(seed, shape, data):
    rng = np.random.default_rng(seed)
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    parts = {}
    for k in range(data.draw(st.integers(1, 3))):
        part = list(shape)
        part[axis] = data.draw(st.integers(1, 3))
        parts[f"x{k}"] = arr(rng, part)
    check("Concat", parts, {"axis": axis})


# ---- graphs, errors, memory -------------------------------------------------------------------

def small_graph() -> Graph:
    g = Graph(inputs=["x"], outputs=["y"])
    g.values["x"] = ValueInfo("float32", ("N", 3, 8, 8))
    g.constants["w"] = np.ones((4, 3, 3, 3), np.float32)
    g.constants["s"] = np.array([1, -1], np.int64)
    g.nodes = [Node("Conv", ["x", "w"], ["c"], {"pads": [1, 1, 1, 1]}, name="conv1"),
               Node("Relu", ["c"], ["r"], name="relu1"),
               Node("Reshape", ["r", "s"], ["y"], name="flat")]
    return g


def test_graph_matches_ort_and_leaves_constants_alone():
    g = small_graph()
    x = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)
    y = run_graph(g, {"x": x})["y"]
    c = run_ort("Conv", {"x": x, "w": g.constants["w"]}, {"pads": [1, 1, 1, 1]})[1][0]
    assert rel_error(y, np.maximum(c, 0).reshape(1, -1)) <= 1e-5
    y[:] = 7  # results are the caller's to write to
    assert np.all(g.constants["w"] == 1)


def test_identity_output_of_input_is_a_copy():
    g = Graph(inputs=["x"], outputs=["y", "x"], nodes=[Node("Identity", ["x"], ["y"], name="id")])
    x = np.zeros(3, np.float32)
    out = run_graph(g, {"x": x})
    out["y"][0] = 1
    out["x"][1] = 1
    assert not x.any()


@pytest.mark.parametrize("inputs, message", [
    ({}, "missing graph input 'x'"),
    ({"x": np.zeros((1, 3, 8, 8), np.float32), "z": np.zeros(1)}, "'z' is not an input of the graph"),
    ({"x": np.zeros((1, 3, 8, 8), np.float64)}, "input 'x' has dtype float64, the graph expects float32"),
    ({"x": np.zeros((1, 3, 8), np.float32)}, "input 'x' has shape [1, 3, 8], the graph expects [N, 3, 8, 8]"),
    ({"x": np.zeros((1, 2, 8, 8), np.float32)}, "input 'x' has shape [1, 2, 8, 8]"),
])
def test_bad_inputs(inputs, message):
    with pytest.raises(SaturateError, match=None) as err:
        run_graph(small_graph(), inputs)
    assert message in str(err.value)


def test_errors_name_node_and_op():
    g = small_graph()
    g.constants["w"] = np.ones((4, 2, 3, 3), np.float32)
    with pytest.raises(SaturateError, match=r"^node 'conv1' \(Conv\): input has 3 channels"):
        run_graph(g, {"x": np.zeros((1, 3, 8, 8), np.float32)})
    g = small_graph()
    g.constants["s"] = np.array([5, -1], np.int64)
    with pytest.raises(SaturateError, match=r"^node 'flat' \(Reshape\): cannot reshape"):
        run_graph(g, {"x": np.zeros((1, 3, 8, 8), np.float32)})
    g = small_graph()
    g.nodes[1] = Node("Foo", ["c"], ["r"], name="weird")
    with pytest.raises(SaturateError, match=r"^no reference implementation for op 'Foo' \(node 'weird'\)$"):
        run_graph(g, {"x": np.zeros((1, 3, 8, 8), np.float32)})
    add = Node("Add", ["a", "b"], ["c"], name="add1")
    with pytest.raises(SaturateError, match=r"node 'add1' \(Add\): inputs have different dtypes"):
        eval_node(add, [np.zeros(2, np.float32), np.zeros(2, np.float64)])
    with pytest.raises(SaturateError, match=r"node 'add1' \(Add\): operands could not be broadcast"):
        eval_node(add, [np.zeros(2, np.float32), np.zeros(3, np.float32)])
    with pytest.raises(SaturateError, match=r"node 'add1' \(Add\): missing required input 1"):
        eval_node(add, [np.zeros(2, np.float32), None])
    with pytest.raises(SaturateError, match=r"node 'add1' \(Add\): takes at most 2 inputs"):
        eval_node(add, [np.zeros(2, np.float32)] * 3)


def test_eval_node_folds_a_constant_expression():
    node = Node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], {"epsilon": 0.0}, name="bn")
    one = np.ones(2, np.float32)
    (y,) = eval_node(node, [np.full((1, 2, 1, 1), 3, np.float32), 2 * one, one, one, 4 * one])
    assert np.array_equal(y, np.full((1, 2, 1, 1), 3, np.float32))


def test_intermediates_are_freed_after_last_use():
    seen: dict[str, weakref.ref] = {}

    def remember(node, x):
        seen["a"] = weakref.ref(x)
        return x + 1

    def probe(node, x):
        # When the probe runs, 'a' (read only by the node before) must already be released.
        seen["alive"] = seen["a"]() is not None
        return x.copy()

    with registered(OpDef("TestRemember", evaluate=remember, arity=(1, 1)),
                    OpDef("TestProbe", evaluate=probe, arity=(1, 1))):
        g = Graph(inputs=["x"], outputs=["y"], nodes=[
            Node("Relu", ["x"], ["a"], name="r"),
            Node("TestRemember", ["a"], ["b"], name="k"),
            Node("TestProbe", ["b"], ["y"], name="p")])
        run_graph(g, {"x": np.ones(4, np.float32)})
    assert seen["alive"] is False


# ---- ops without a numpy kernel: onnx.reference at the graph's opset -----------------------

def one_node(op, inputs, attrs, opset, n_out=1, name="n0"):
    g = Graph(inputs=list(inputs), outputs=[f"y{k}" for k in range(n_out)], opset=opset)
    g.nodes = [Node(op, list(inputs), list(g.outputs), dict(attrs), name=name)]
    return g


@pytest.mark.parametrize("opset", [13, 18])
def test_reduce_mean_follows_the_graph_opset(opset):
    # Axes moved from an attribute to an input at opset 18; each graph uses its own form.
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    if opset < 18:
        g = one_node("ReduceMean", ["x"], {"axes": [1]}, opset)
        feed = {"x": x}
    else:
        g = one_node("ReduceMean", ["x", "axes"], {}, opset)
        feed = {"x": x, "axes": np.array([1], np.int64)}
    (y,) = run_graph(g, feed).values()
    assert np.allclose(y, x.mean(axis=1, keepdims=True), rtol=1e-6)


def test_split_runs_on_the_reference_with_several_outputs():
    x = np.arange(10, dtype=np.float32)
    g = one_node("Split", ["x"], {"num_outputs": 2, "axis": 0}, 18, n_out=2)
    y = run_graph(g, {"x": x})
    assert np.array_equal(y["y0"], x[:5]) and np.array_equal(y["y1"], x[5:])


def test_reference_ops_are_built_once_per_signature(monkeypatch):
    from saturate.interp import reference
    built = []
    real = reference._build
    monkeypatch.setattr(reference, "_build", lambda *a: built.append(a[0].op) or real(*a))
    g = one_node("HardSigmoid", ["x"], {"alpha": 0.3}, 17)
    for _ in range(3):
        run_graph(g, {"x": np.ones(3, np.float32)})
    g.nodes[0].attrs["alpha"] = 0.25  # edited in place: a new op, not the stale one
    (y,) = run_graph(g, {"x": np.ones(3, np.float32)}).values()
    assert built == ["HardSigmoid", "HardSigmoid"] and np.allclose(y, 0.75)


def test_reference_errors_are_one_line_naming_node_and_op():
    g = one_node("Expand", ["x", "s"], {}, 18, name="ex")
    with pytest.raises(SaturateError, match=r"^node 'ex' \(Expand\): [^\n]+$"):
        run_graph(g, {"x": np.zeros(3, np.float32), "s": np.array([2], np.int64)})
    g = one_node("Loop", ["n", "c"], {}, 21, name="loop1")
    with pytest.raises(SaturateError, match=r"^node 'loop1' \(Loop\): attribute 'body' \(a graph\) is missing$"):
        run_graph(g, {"n": np.array(1, np.int64), "c": np.array(True)})
    g = one_node("OptionalGetElement", [], {}, 21, name="opt")
    with pytest.raises(SaturateError, match=r"^node 'opt' \(OptionalGetElement\): the optional is empty$"):
        run_graph(g, {})


def test_supported_ops_tell_the_truth():
    from saturate.interp.interpreter import supported_ops
    ops = set(supported_ops(18))
    assert {"Conv", "ReduceMean", "Split", "Resize", "Einsum", "LayerNormalization"} <= ops
    assert {"Loop", "If", "Scan", "SequenceMap"} <= ops      # control flow runs its subgraphs here
    assert {"Multinomial", "Scatter"} <= set(supported_ops(10))    # on kernels of the interpreter's own
    assert {"SequenceAt", "ConcatFromSequence", "SplitToSequence", "SequenceEmpty", "Optional"} <= ops
    assert "Gelu" not in supported_ops(19) and "Gelu" in supported_ops(20)


def test_kernels_leave_rare_forms_to_the_reference():
    # Training-mode batch-norm and float8 casts are not what the numpy kernels compute.
    x = np.array([1e6, 0.4, -3.0], np.float32)
    g = one_node("Cast", ["x"], {"to": onnx.TensorProto.FLOAT8E5M2}, 21)
    (y,) = run_graph(g, {"x": x}).values()
    assert float(y[0].astype(np.float32)) == 57344.0  # saturates to the largest finite value
    bn = one_node("BatchNormalization", ["x", "s", "b", "m", "v"], {"training_mode": 1}, 15, n_out=3)
    one = np.ones(2, np.float32)
    x4 = np.arange(8, dtype=np.float32).reshape(2, 2, 2, 1)
    out = run_graph(bn, {"x": x4, "s": one, "b": 0 * one, "m": 0 * one, "v": one})
    assert np.allclose(out["y0"].mean(axis=(0, 2, 3)), 0, atol=1e-6)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("shape,scales,sizes", [((1, 1, 3, 4), [1, 1, 0.5, 2.0], None),
                                                ((1, 1, 3, 4), [1, 1, 1.5, 0.3], None),
                                                ((1, 1, 49, 3), None, [1, 1, 1, 5]),
                                                ((1, 1, 49, 3), None, [1, 1, 4, 1])])
def test_resize_to_length_one_reads_the_first_element_as_onnx_runtime_does(mode, shape, scales, sizes):
    """pytorch_half_pixel reads source 0 for an output of length 1 (ONNX's spec); onnx.reference
    tests length * scale as a float (3 * 0.5 = 1.5, 49 * (1 / 49) below 1) and reads another element,
    so the interpreter cuts such an axis to its first element before calling it."""
    consts = {"sc": np.array(scales, np.float32)} if scales else {"sz": np.array(sizes, np.int64)}
    inputs = ["x", "", "sc"] if scales else ["x", "", "", "sz"]
    g = Graph(nodes=[Node("Resize", inputs, ["y"], {"mode": mode, "coordinate_transformation_mode":
                                                    "pytorch_half_pixel"}, "resize")],
              inputs=["x"], outputs=["y"], constants=consts, values={"x": ValueInfo("float32", shape)},
              name="g", opset=13)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    session = ort.InferenceSession(export_model(g).SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, {"x": x})[0]
    got = run_graph(g, {"x": x})["y"]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# ---- sizes: an output over --max-memory is refused before the kernel allocates it -------------

MiB = 1 << 20
I64 = np.int64


def _f32(*shape):
    return np.zeros(shape, np.float32)


# (op, inputs, attrs, size of the output the node would make): each output is 4-16 MiB from
# inputs of at most a few KiB, so only a check made before the kernel runs can refuse it.
GROWING_OPS = {
    "ConstantOfShape": ("ConstantOfShape", [np.array([1024, 1024], I64)], {}, "4.0 MiB"),
    "Expand": ("Expand", [_f32(1, 1), np.array([1024, 1024], I64)], {}, "4.0 MiB"),
    "Tile": ("Tile", [_f32(2, 2), np.array([512, 512], I64)], {}, "4.0 MiB"),
    "Range": ("Range", [np.array(0, I64), np.array(1 << 20, I64), np.array(1, I64)], {}, "8.0 MiB"),
    "Add-outer": ("Add", [_f32(1024, 1), _f32(1, 1024)], {}, "4.0 MiB"),
    "Equal-outer": ("Equal", [_f32(2048, 1), _f32(1, 2048)], {}, "4.0 MiB"),
    "Where-outer": ("Where", [np.ones((1024, 1), bool), _f32(1, 1024), _f32(1)], {}, "4.0 MiB"),
    "MatMul-outer": ("MatMul", [_f32(1024, 1), _f32(1, 1024)], {}, "4.0 MiB"),
    "Gemm-outer": ("Gemm", [_f32(1024, 1), _f32(1, 1024)], {}, "4.0 MiB"),
    "Gather": ("Gather", [_f32(1, 1024), np.zeros(1024, I64)], {}, "4.0 MiB"),
    "OneHot": ("OneHot", [np.zeros(1024, I64), np.array(1024, I64), np.array([0, 1], np.float32)], {}, "4.0 MiB"),
    "Pad": ("Pad", [_f32(1, 1), np.array([0, 0, 1023, 1023], I64)], {}, "4.0 MiB"),
    "Resize": ("Resize", [_f32(1, 1, 2, 2), None, np.array([1, 1, 512, 512], np.float32)], {}, "4.0 MiB"),
    "Conv-pads": ("Conv", [_f32(1, 1, 1, 1), _f32(1, 1, 1, 1)], {"pads": [0, 0, 1023, 1023]}, "4.0 MiB"),
    "ConvTranspose-strides": ("ConvTranspose", [_f32(1, 1, 2, 2), _f32(1, 1, 1, 1)],
                              {"strides": [1024, 1024]}, "4.0 MiB"),
    "MaxPool-pads": ("MaxPool", [_f32(1, 1, 1, 1)], {"kernel_shape": [1, 1], "pads": [0, 0, 1023, 1023]}, "4.0 MiB"),
}


@pytest.mark.parametrize("case", sorted(GROWING_OPS))
def test_an_output_over_the_memory_limit_is_refused_before_it_is_made(case, monkeypatch):
    op, args, attrs, size = GROWING_OPS[case]
    monkeypatch.setenv("SATURATE_MAX_MEMORY", "1M")
    node = Node(op, [f"x{k}" if a is not None else "" for k, a in enumerate(args)], ["y"], dict(attrs), name="big")
    with pytest.raises(SaturateError) as err:
        eval_node(node, args, OPSET)
    assert f"node 'big' ({op}): output 'y'" in str(err.value)
    assert f"would take {size}, over the memory limit of 1.0 MiB" in str(err.value)
    # Under a limit it fits, the same node runs.
    monkeypatch.setenv("SATURATE_MAX_MEMORY", "64M")
    assert eval_node(node, args, OPSET)[0].nbytes <= 16 * MiB


def test_a_declared_output_over_the_limit_is_refused_before_its_node_runs(monkeypatch):
    """Any op: an output the graph types with a static shape is sized from that type."""
    g = Graph(inputs=["x"], outputs=["y"], opset=OPSET)
    g.values["x"] = ValueInfo("float32", (4,))
    g.values["y"] = ValueInfo("float32", (1 << 20, 1 << 20))
    g.nodes.append(Node("Relu", ["x"], ["y"], name="relu"))
    with pytest.raises(SaturateError, match=r"node 'relu' \(Relu\): output 'y' float32\[1048576, 1048576\] "
                                            r"would take 4.0 TiB"):
        run_graph(g, {"x": np.zeros(4, np.float32)})


# (op, inputs, attrs, opset, output type): outputs sized by an input's values or by inputs' shapes together,
# which no sizer covers; a graph that leaves the output untyped gets them from ONNX's inference
# of the node on its actual inputs.
INFERRED_OPS = {
    "HannWindow": ("HannWindow", [np.array(1 << 20, I64)], {}, 17, "float32[1048576]"),
    "DFT": ("DFT", [_f32(1, 4, 1), np.array(1 << 19, I64)], {}, 17, "float32[1, 524288, 2]"),
    "Col2Im": ("Col2Im", [_f32(1, 1, 1), np.array([1024, 1024], I64), np.array([1, 1], I64)], {"strides": [1024, 1024]},
               18, "float32[1, 1, 1024, 1024]"),
    "CenterCropPad": ("CenterCropPad", [_f32(2, 2), np.array([1024, 1024], I64)], {}, 18, "float32[1024, 1024]"),
    "Einsum-outer": ("Einsum", [_f32(1024), _f32(1024)], {"equation": "i,j->ij"}, 17, "float32[1024, 1024]"),
    "GatherND-outer": ("GatherND", [_f32(1, 1024), np.zeros((1024, 1), I64)], {}, 17, "float32[1024, 1024]"),
}


@pytest.mark.parametrize("case", sorted(INFERRED_OPS))
def test_an_untyped_output_over_the_limit_is_sized_by_inference_before_its_node_runs(case, monkeypatch):
    op, args, attrs, opset, typed = INFERRED_OPS[case]
    names = [f"x{k}" for k in range(len(args))]
    g = Graph(inputs=names, outputs=["y"], opset=opset)
    g.values.update((n, ValueInfo(str(a.dtype), a.shape)) for n, a in zip(names, args))
    g.nodes.append(Node(op, names, ["y"], dict(attrs), name="big"))
    feeds = dict(zip(names, args))
    monkeypatch.setenv("SATURATE_MAX_MEMORY", "1M")
    with pytest.raises(SaturateError) as err:
        run_graph(g, feeds)
    # The type in the message is inference's: the kernel never ran (its output would be refused
    # after the fact, by its array's shape alone).
    assert f"node 'big' ({op}): output 'y' {typed} would take 4.0 MiB, over the memory limit of 1.0 MiB" \
        in str(err.value)
    monkeypatch.setenv("SATURATE_MAX_MEMORY", "64M")
    assert run_graph(g, feeds)["y"].nbytes <= 16 * MiB


@pytest.mark.parametrize("data_shape, idx_shape, axis", [((1, 512), (1, 16), 1), ((3, 200, 4), (2, 7, 4), 1),
                                                         ((70, 3), (5, 2), 0), ((4, 5), (4, 5), -1)])
def test_gather_elements_matches_ort_past_64_choices(data_shape, idx_shape, axis):
    # onnx.reference's GatherElements (np.choose) fails past 64 choices along the axis: BERT's
    # token-type table.
    rng = np.random.default_rng(0)
    data = rng.standard_normal(data_shape).astype(np.float32)
    n = data_shape[axis]
    idx = rng.integers(-n, n, idx_shape).astype(np.int64)
    node = helper.make_node("GatherElements", ["d", "i"], ["y"], axis=axis)
    model = helper.make_model(helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("d", onnx.TensorProto.FLOAT, data_shape),
                      helper.make_tensor_value_info("i", onnx.TensorProto.INT64, idx_shape)],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)]), opset_imports=[helper.make_opsetid("", 17)])
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"d": data, "i": idx})[0]
    got = run_graph(import_model(model), {"d": data, "i": idx})["y"]
    np.testing.assert_array_equal(got, want)


def test_gather_elements_index_out_of_range_is_one_line():
    node = Node("GatherElements", ["d", "i"], ["y"], {"axis": 0}, name="ge")
    with pytest.raises(SaturateError, match="ge.*out of range"):
        eval_node(node, [np.zeros((3, 2), np.float32), np.array([[3, 0]], np.int64)])


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.int8])
def test_integer_div_truncates_at_the_most_negative_integer(dtype):
    info = np.iinfo(dtype)
    a = np.array([info.min, info.min, -7, 7, -7, info.max], dtype)
    b = np.array([2, 3, 2, -2, -2, -3], dtype)
    node = helper.make_node("Div", ["a", "b"], ["y"])
    model = helper.make_model(helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), [6])
                      for n in "ab"],
        [helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), [6])]),
        opset_imports=[helper.make_opsetid("", 17)])
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"a": a, "b": b})[0]
    np.testing.assert_array_equal(run_graph(import_model(model), {"a": a, "b": b})["y"], want)


# ---- Multinomial and Scatter (which onnx.reference lacks) -------------------------------------------

def _multinomial_model(attrs, dtype=onnx.TensorProto.INT32):
    node = helper.make_node("Multinomial", ["x"], ["y"], **attrs)
    return helper.make_model(helper.make_graph(
        [node], "draws", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [None, None])],
        [helper.make_tensor_value_info("y", dtype, None)]), opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


@pytest.mark.parametrize("dtype", [onnx.TensorProto.INT32, onnx.TensorProto.INT64])
def test_multinomial_draws_classes_as_often_as_onnx_runtime(dtype):
    # Rows spread over their classes, with classes never drawn (-inf), and held by one class:
    # each class's frequency over 20,000 draws, ours and ONNX Runtime's, within 0.015 of each other
    # and of its probability (a binomial's sd here is 0.0035 at most).
    with np.errstate(divide="ignore"):
        x = np.log(np.array([[0.1, 0.2, 0.3, 0.4], [1.0, 0.0, 2.0, 0.0], [1.0, 3e-4, 3e-4, 0.0]], np.float32))
    probs = np.exp(x.astype(np.float64))
    probs /= probs.sum(axis=1, keepdims=True)
    samples = 20_000
    model = _multinomial_model({"sample_size": samples, "seed": 7.0, "dtype": dtype}, dtype)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = run_graph(import_model(model), {"x": x})["y"]
    assert got.shape == want.shape == (3, samples) and got.dtype == want.dtype
    for row in range(3):
        ours, theirs = (np.bincount(d[row], minlength=4) / samples for d in (got, want))
        assert np.abs(ours - theirs).max() < 0.015 and np.abs(ours - probs[row]).max() < 0.015, (row, ours, theirs)
        assert (ours[probs[row] == 0] == 0).all() and (theirs[probs[row] == 0] == 0).all()


def test_multinomial_draws_alike_for_a_seed():
    x = np.zeros((2, 5), np.float32)
    node = lambda **attrs: Node("Multinomial", ["x"], ["y"], {"sample_size": 50, **attrs}, name="m")
    first, again, other = (eval_node(node(seed=s), [x])[0] for s in (3.0, 3.0, 4.0))
    assert np.array_equal(first, again) and not np.array_equal(first, other)
    assert not np.array_equal(eval_node(node(), [x])[0], eval_node(node(), [x])[0])   # unseeded: fresh draws


@pytest.mark.parametrize("x, attrs, message", [
    (np.zeros(3, np.float32), {}, "input must be [batch_size, class_size], got rank 1"),
    (np.zeros((2, 3), np.float32), {"sample_size": 0}, "sample_size must be at least 1, got 0"),
    (np.zeros((2, 3), np.float32), {"dtype": onnx.TensorProto.FLOAT}, "dtype must be int32 (6) or int64 (7), got 1"),
    (np.array([[0.0, 1.0], [-np.inf, -np.inf]], np.float32), {}, "row 1 has no class with a finite log-probability"),
    (np.zeros((2, 0), np.float32), {}, "class_size is 0: no class to draw"),
    (np.zeros((4, 3), np.float32), {"sample_size": 1 << 40}, "output 'y' [4, 1099511627776] would take"),
])
def test_multinomial_refuses_bad_input_in_one_line(x, attrs, message):
    # ONNX Runtime draws class_size (no class) from a row without a finite logit; here it is an error.
    with pytest.raises(SaturateError) as err:
        eval_node(Node("Multinomial", ["x"], ["y"], attrs, name="draw"), [x])
    text = str(err.value)
    assert text.startswith("node 'draw' (Multinomial): ") and message in text and "\n" not in text


@pytest.mark.parametrize("axis, index_dtype", [(0, np.int64), (1, np.int64), (-1, np.int32)])
def test_scatter_runs_as_scatter_elements_as_onnx_runtime_runs_it(axis, index_dtype):
    # Scatter (opsets 9 and 10) is ScatterElements of opset 11 under its old name: ONNX Runtime's
    # run of an opset-10 model, against the interpreter on the graph as written (import converts an
    # opset this old to ScatterElements) and as imported. Indices negative too, updates a corner.
    rng = np.random.default_rng(4)
    data = rng.standard_normal((3, 4, 2)).astype(np.float32)
    n = data.shape[axis]
    # Distinct indices along the axis: where two updates land on one element, which one stays
    # is left open by the spec.
    order = np.argsort(rng.random((3, 4, 2)), axis=axis)[:2, :3] if axis == 0 else \
        np.argsort(rng.random((3, 4, 2)), axis=axis)[:2, :3, :1]
    idx = (order - n * (rng.random(order.shape) < 0.5)).astype(index_dtype)
    updates = rng.standard_normal(idx.shape).astype(np.float32)
    feeds = {"d": data, "i": idx, "u": updates}
    info = lambda name, a: helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Scatter", ["d", "i", "u"], ["y"], axis=axis)], "scatter",
        [info(k, v) for k, v in feeds.items()], [info("y", data)]), opset_imports=[helper.make_opsetid("", 10)])
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    g = Graph(inputs=list(feeds), outputs=["y"], opset=10)
    g.nodes = [Node("Scatter", ["d", "i", "u"], ["y"], {"axis": axis}, name="s")]
    np.testing.assert_array_equal(run_graph(g, feeds)["y"], want)
    np.testing.assert_array_equal(run_graph(import_model(model), feeds)["y"], want)
    assert not np.array_equal(want, data)


@pytest.mark.parametrize("idx, updates, message", [
    (np.array([[3, 0]], np.int64), np.zeros((1, 2), np.float32), "indices out of range for axis 0 of size 3"),
    (np.array([[0, 1]], np.int64), np.zeros((1, 1), np.float32), "must have one shape"),
    (np.array([[0, 1]], np.float32), np.zeros((1, 2), np.float32), "indices must be int32 or int64"),
    (np.array([0, 1], np.int64), np.zeros(2, np.float32), "indices must have the rank of data (2), got 1"),
])
def test_scatter_refuses_bad_input_in_one_line(idx, updates, message):
    with pytest.raises(SaturateError) as err:
        eval_node(Node("Scatter", ["d", "i", "u"], ["y"], {}, name="sc"), [np.zeros((3, 2), np.float32), idx, updates], 10)
    assert str(err.value).startswith("node 'sc' (Scatter): ") and message in str(err.value)


def test_scatter_runs_past_opset_10_where_onnx_runtime_refuses_it():
    # `saturate check` draws its graphs at opset 17; ONNX deprecated Scatter at 11.
    data, idx, updates = np.zeros(3, np.float32), np.array([-1], np.int64), np.ones(1, np.float32)
    info = lambda name, a: helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Scatter", ["d", "i", "u"], ["y"])], "scatter",
        [info("d", data), info("i", idx), info("u", updates)], [info("y", data)]), opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(Exception, match="INVALID_GRAPH"):
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = eval_node(Node("Scatter", ["d", "i", "u"], ["y"], {}, name="s"), [data, idx, updates], 17)[0]
    np.testing.assert_array_equal(got, [0, 0, 1])
