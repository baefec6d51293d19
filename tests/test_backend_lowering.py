"""C backend: transformer blocks that used to fail to compile. A SiLU gating MLP (Llama) whose Mul(x,
Sigmoid(x)) falls back to the interpreter must run as written (Swish is an ONNX op only from opset 24), and
RMSNorm's ReduceMean over the last axis must compile under -Werror at the shapes T5 and Llama use."""

from __future__ import annotations

import numpy as np
import pytest

from backend_util import TOL, check_three_way, make, rel_error
from saturate.core.ir import Node, ValueInfo

pytestmark = pytest.mark.compiler


def arr(seed: int, shape) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("opset", [17, 18])
def test_silu_gating_mlp_in_the_interpreter_runs_as_written(opset):
    """The gate's input has a runtime shape (Reshape to a fed shape), so the gating MLP and a GELU after it
    run in the interpreter, which has neither Swish nor Gelu at these opsets; C runs the MatMuls before."""
    from saturate.backend import compile_graph
    from saturate.backend.bench import ort_session

    d, h = 16, 32
    half, one, root2 = np.float32(0.5), np.float32(1.0), np.float32(2 ** 0.5)
    nodes = [Node("MatMul", ["x0", "wi"], ["x1"]), Node("Reshape", ["x1", "shp"], ["x"]),
             Node("MatMul", ["x", "wg"], ["g"]), Node("Sigmoid", ["g"], ["sg"]), Node("Mul", ["sg", "g"], ["a"]),
             Node("MatMul", ["x", "wu"], ["u"]), Node("Mul", ["a", "u"], ["m"]), Node("MatMul", ["m", "wd"], ["z"]),
             Node("Div", ["z", "r2"], ["q"]), Node("Erf", ["q"], ["e"]), Node("Add", ["e", "one"], ["e1"]),
             Node("Mul", ["z", "e1"], ["ze"]), Node("Mul", ["ze", "half"], ["y"])]
    g = make(nodes, {"x0": (5, d), "shp": (3,)},
             {"wi": arr(1, (d, d)), "wg": arr(2, (d, h)), "wu": arr(3, (d, h)), "wd": arr(4, (h, d)),
              "r2": root2, "one": one, "half": half}, opset=opset)
    g.values["shp"] = ValueInfo("int64", (3,))
    feed = {"x0": arr(0, (5, d)), "shp": np.array([1, 5, d], np.int64)}
    model = compile_graph(g)
    assert {op for op, _, _ in model.partition.fallback_ops()} >= {"Sigmoid", "Mul", "Erf"}
    got = model(feed)["y"]
    want = ort_session(g, 1).run(None, feed)[0]
    assert got.shape == want.shape == (1, 5, d)
    assert rel_error(got, np.asarray(want, np.float64)) <= TOL


def test_rmsnorm_reductions_compile_warning_free():
    """RMSNorm (Pow 2, ReduceMean over the last axis, Add eps, Sqrt, Div, Mul) at widths that are
    multiples of the kernel's 8 lanes and not, one to three axes; and the ReduceSum form."""
    shapes = [(64,), (4, 64), (1, 7, 64), (2, 3, 16), (1, 5, 12), (3, 7)]
    nodes, consts, inputs, outs = [], {"two": np.float32(2.0), "ax": np.array([-1]), "eps": np.float32(1e-6)}, {}, []
    for k, shape in enumerate(shapes):
        x, w = f"x{k}", f"w{k}"
        inputs[x], consts[w] = shape, arr(10 + k, shape[-1:])
        reduce = "ReduceSum" if k % 2 else "ReduceMean"
        nodes += [Node("Pow", [x, "two"], [f"p{k}"]), Node(reduce, [f"p{k}", "ax"], [f"m{k}"]),
                  Node("Add", [f"m{k}", "eps"], [f"me{k}"]), Node("Sqrt", [f"me{k}"], [f"s{k}"]),
                  Node("Div", [x, f"s{k}"], [f"n{k}"]), Node("Mul", [f"n{k}", w], [f"y{k}"])]
        outs.append(f"y{k}")
    check_three_way(make(nodes, inputs, consts, outputs=outs, opset=18))


def test_ops_after_a_bool_interpreter_node_stay_in_c():
    """A mask made by an op without a C kernel (Less, then Where, as attention masks are): Less runs in the
    interpreter, the shape of its bool output is inferred, so the Where and the MatMul after it still run in C.
    (The dynamo exports' IsNaN masks run in C: test_backend_ops.py.)"""
    from saturate.backend import compile_graph
    from saturate.backend.bench import ort_session

    nodes = [Node("Less", ["x", "zero"], ["m"]), Node("Where", ["m", "zero", "x"], ["c"]),
             Node("MatMul", ["c", "w"], ["y"])]
    g = make(nodes, {"x": (1, 4, 8, 8)}, {"zero": np.float32(0.0), "w": arr(1, (8, 8))}, opset=18)
    model = compile_graph(g)
    assert sorted(op for op, _, _ in model.partition.fallback_ops()) == ["Less"]
    x = arr(0, (1, 4, 8, 8))
    got, want = model({"x": x})["y"], ort_session(g, 1).run(None, {"x": x})[0]
    assert rel_error(got, np.asarray(want, np.float64)) <= TOL
