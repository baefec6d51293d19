"""C backend: the rotary position embedding (Slice, Neg, Concat, Mul, Mul, Add) and RMSNorm (Pow, ReduceMean,
Add, Sqrt, Div) as exporters write them, each run as one kernel, checked against ONNX Runtime and the reference
interpreter; a pattern whose inner value is read elsewhere stays node by node."""

from __future__ import annotations

import numpy as np
import pytest

from backend_util import check_three_way, make, side_by_side
from saturate.core.ir import Node

pytestmark = pytest.mark.compiler

BIG = np.iinfo(np.int64).max


def rotary_graph(x: tuple, table: tuple, swap: bool = False, high_end: int | None = None, seed: int = 0,
                 concat_out: bool = False, then: str = "", perm: list | None = None, x_out: bool = False):
    """x * cos + rotate_half(x) * sin over x's last axis; `swap` puts the constants first and the sine
    product first in the Add; `concat_out` makes rotate_half(x) an output too; `then` a unary op after;
    `perm` makes x a Transpose of the input (`x_out`: x an output too)."""
    rng = np.random.default_rng(seed)
    d, half = x[-1], x[-1] // 2
    ints = lambda *v: np.array(v, np.int64)  # noqa: E731
    consts = {"cos": rng.standard_normal(table).astype(np.float32), "sin": rng.standard_normal(table).astype(np.float32),
              "lo_s": ints(0), "lo_e": ints(half), "hi_s": ints(half), "hi_e": ints(high_end or d), "ax": ints(-1)}
    pair = lambda a, b: [b, a] if swap else [a, b]  # noqa: E731
    nodes = [Node("Mul", pair("x", "cos"), ["xc"]),
             Node("Slice", ["x", "hi_s", "hi_e", "ax"], ["hi"]),
             Node("Neg", ["hi"], ["nhi"]),
             Node("Slice", ["x", "lo_s", "lo_e", "ax"], ["lo"]),
             Node("Concat", ["nhi", "lo"], ["rot"], {"axis": len(x) - 1}),
             Node("Mul", pair("rot", "sin"), ["rs"]),
             Node("Add", pair("xc", "rs"), ["y"])]
    if then:
        nodes[-1].outputs = ["z"]
        nodes.append(Node(then, ["z"], ["y"]))
    inputs = {"x": x}
    if perm:
        nodes.insert(0, Node("Transpose", ["t"], ["x"], {"perm": perm}))
        inputs = {"t": tuple(x[perm.index(d)] for d in range(len(x)))}
    outputs = ["y"] + (["rot"] if concat_out else []) + (["x"] if x_out else [])
    return make(nodes, inputs, consts, outputs=outputs)


def rms_graph(x: tuple, square: str = "Pow", axes=(-1,), swap: bool = False, mean_out: bool = False, seed: int = 0,
              int_two: bool = False):
    """x / sqrt(mean(x^2 over `axes`) + eps) times a weight; `square` Pow (of an integer exponent with `int_two`)
    or Mul, `swap` eps first in the Add, `mean_out` makes the mean an output too."""
    rng = np.random.default_rng(seed)
    two = np.array(2, np.int64) if int_two else np.array([2.0], np.float32)
    consts = {"two": two, "eps": np.array([1e-5], np.float32),
              "w": rng.standard_normal(x[-1]).astype(np.float32)}
    nodes = [Node("Pow", ["x", "two"], ["sq"]) if square == "Pow" else Node("Mul", ["x", "x"], ["sq"]),
             Node("ReduceMean", ["sq"], ["ms"], {"axes": list(axes), "keepdims": 1}),
             Node("Add", ["eps", "ms"] if swap else ["ms", "eps"], ["mse"]),
             Node("Sqrt", ["mse"], ["root"]),
             Node("Div", ["x", "root"], ["n"]),
             Node("Mul", ["n", "w"], ["y"])]
    return make(nodes, {"x": x}, consts, outputs=["y", "ms"] if mean_out else ["y"])


CASES = [
    rotary_graph((1, 2, 8, 16), (1, 1, 8, 16)),
    rotary_graph((2, 8, 12), (8, 12), swap=True, high_end=BIG, seed=1),
    rotary_graph((3, 5, 32), (1, 32), seed=2),
    rotary_graph((1, 3, 4, 8), (1, 1, 4, 8), seed=3, concat_out=True),
    rotary_graph((1, 2, 8, 16), (1, 1, 8, 16), seed=4, then="Tanh"),
    rms_graph((1, 6, 20)),
    rms_graph((2, 3, 16), square="Mul", axes=(2,), swap=True, seed=1),
    rms_graph((3, 5, 12), axes=(1,), seed=2),
    rms_graph((1, 4, 8), mean_out=True, seed=3),
    rms_graph((2, 24), int_two=True, seed=4),
    rotary_graph((1, 3, 8, 16), (1, 1, 8, 16), seed=5, perm=[0, 2, 1, 3]),
    rotary_graph((2, 1, 6, 8), (6, 8), seed=6, perm=[1, 2, 0, 3], then="Relu"),
    rotary_graph((1, 2, 4, 8), (1, 1, 4, 8), seed=7, perm=[0, 2, 1, 3], x_out=True),
]


@pytest.mark.parametrize("threads", [1, 2])
def test_patterns_match_reference_and_ort(threads):
    from saturate.backend import compile_graph

    graph = side_by_side(CASES)
    check_three_way(graph, threads=threads)
    steps = compile_graph(graph, threads=threads).emitted.plan.steps
    fused = sorted((s.pattern, s.out) for s in steps if s.pattern)
    # rotate_half(x) of case 3 and the mean of case 8 are outputs, and case 7 normalizes over another axis:
    # their nodes run one by one
    assert fused == [("rms_norm", "c5_y"), ("rms_norm", "c6_y"), ("rms_norm", "c9_y"), ("rotary", "c0_y"),
                     ("rotary", "c10_y"), ("rotary", "c11_y"), ("rotary", "c12_y"), ("rotary", "c1_y"),
                     ("rotary", "c2_y"), ("rotary", "c4_y")]
    # cases 10 and 11 read their transposed x in place; case 12's x is an output, written by its Transpose
    read_through = sorted(s.out for s in steps if s.pattern == "rotary" and s.inner[0].op == "Transpose")
    assert read_through == ["c10_y", "c11_y"]
