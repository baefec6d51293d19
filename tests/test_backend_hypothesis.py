"""C backend against the reference interpreter and ONNX Runtime on generated ops and small graphs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backend_util import check_three_way, make
from saturate.core.ir import Node

pytestmark = pytest.mark.compiler
SETTINGS = settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def arr(seed: int, shape) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@st.composite
def convs(draw):
    groups = draw(st.integers(1, 3))
    cg, mg = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    dh, dw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    pads = [draw(st.integers(0, 2)) for _ in range(4)]
    h = draw(st.integers((kh - 1) * dh + 1, 9))
    wd = draw(st.integers((kw - 1) * dw + 1, 9))
    attrs = {"group": groups, "pads": pads, "dilations": [dh, dw],
             "strides": [draw(st.integers(1, 3)), draw(st.integers(1, 3))]}
    bias = draw(st.booleans())
    act = draw(st.sampled_from([None, "Relu", "Clip", "LeakyRelu"]))
    seed = draw(st.integers(0, 2**16))
    nodes = [Node("Conv", ["x", "w", "b"] if bias else ["x", "w"], ["c"], attrs)]
    consts = {"w": arr(seed, (groups * mg, cg, kh, kw)), "b": arr(seed + 1, (groups * mg,))}
    if act:
        extra = {"alpha": 0.3} if act == "LeakyRelu" else {}
        ins = ["c", "lo", "hi"] if act == "Clip" else ["c"]
        consts.update(lo=np.float32(-0.5), hi=np.float32(1.0))
        nodes.append(Node(act, ins, ["y"], extra))
    return make(nodes, {"x": (draw(st.integers(1, 2)), groups * cg, h, wd)}, consts)


@given(convs(), st.integers(1, 2))
@SETTINGS
def test_generated_convs(graph, threads):
    check_three_way(graph, threads=threads)


@st.composite
def broadcasts(draw):
    out = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=4)))
    graph_inputs, consts, nodes = {}, {}, []
    seed = draw(st.integers(0, 2**16))

    def operand(name):
        keep = draw(st.integers(0, len(out)))
        shape = tuple(d if draw(st.booleans()) else 1 for d in out[len(out) - keep:])
        if draw(st.booleans()):
            graph_inputs[name] = shape
        else:
            consts[name] = arr(seed + len(consts), shape) + np.float32(3.0)  # away from 0 for Div
        return name

    graph_inputs["x"] = out
    current = "x"
    for k in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["Add", "Sub", "Mul", "Div", "Relu", "Sigmoid", "Tanh", "Neg"]))
        if op in ("Add", "Sub", "Mul", "Div"):
            other = operand(f"o{k}")
            ins = [current, other] if draw(st.booleans()) or op != "Sub" else [other, current]
            if op == "Div":
                ins = [current, other]
        else:
            ins = [current]
        nodes.append(Node(op, ins, [f"v{k}"]))
        current = f"v{k}"
    return make(nodes, graph_inputs, consts)


@given(broadcasts())
@SETTINGS
def test_generated_broadcast_chains(graph):
    check_three_way(graph)


@st.composite
def blocks(draw):
    """Conv/BN/activation blocks with residual adds, pools and extra outputs: fusion and reuse."""
    c, h = draw(st.integers(1, 4)), draw(st.integers(4, 9))
    seed = draw(st.integers(0, 2**16))
    consts, nodes, values, outputs = {}, [], ["x"], []
    for k in range(draw(st.integers(2, 6))):
        kind = draw(st.sampled_from(["conv", "bn", "relu", "residual", "pool", "sigmoid", "dw"]))
        src, out = values[-1], f"v{k}"
        if kind in ("conv", "dw"):
            group = c if kind == "dw" else 1
            consts[f"w{k}"] = arr(seed + k, (c, c // group, 3, 3)) * np.float32(0.5)
            nodes.append(Node("Conv", [src, f"w{k}"], [out], {"pads": [1, 1, 1, 1], "group": group}))
        elif kind == "bn":
            consts.update({f"s{k}": arr(seed + k, c), f"b{k}": arr(seed + k + 1, c), f"m{k}": arr(seed + k + 2, c),
                           f"q{k}": np.abs(arr(seed + k + 3, c)) + np.float32(0.5)})
            nodes.append(Node("BatchNormalization", [src, f"s{k}", f"b{k}", f"m{k}", f"q{k}"], [out]))
        elif kind == "residual":
            nodes.append(Node("Add", [src, draw(st.sampled_from(values))], [out]))
        elif kind == "pool":
            nodes.append(Node("MaxPool", [src], [out], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}))
        else:
            nodes.append(Node("Relu" if kind == "relu" else "Sigmoid", [src], [out]))
        values.append(out)
        if draw(st.integers(0, 4)) == 0:
            outputs.append(out)
    outputs = [values[-1]] + [o for o in outputs if o != values[-1]]
    return make(nodes, {"x": (1, c, h, h)}, consts, outputs=outputs)


@given(blocks(), st.integers(1, 2))
@SETTINGS
def test_generated_small_graphs(graph, threads):
    check_three_way(graph, threads=threads)


@st.composite
def matmuls(draw):
    m, k, n = (draw(st.integers(1, 6)) for _ in range(3))
    batch = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    bb = tuple(d if draw(st.booleans()) else 1 for d in batch)[draw(st.integers(0, len(batch))):]
    seed = draw(st.integers(0, 2**16))
    if draw(st.booleans()):
        ta, tb = draw(st.integers(0, 1)), draw(st.integers(0, 1))
        attrs = {"transA": ta, "transB": tb, "alpha": draw(st.sampled_from([1.0, 0.5])),
                 "beta": draw(st.sampled_from([1.0, 2.0]))}
        cshape = draw(st.sampled_from([(n,), (m, n), (m, 1), (1, n)]))
        consts = {"b": arr(seed, (n, k) if tb else (k, n)), "c": arr(seed + 1, cshape)}
        return make([Node("Gemm", ["a", "b", "c"], ["y"], attrs), Node("Relu", ["y"], ["z"])],
                    {"a": (k, m) if ta else (m, k)}, consts)
    return make([Node("MatMul", ["a", "b"], ["y"])], {"a": batch + (m, k)}, {"b": arr(seed, bb + (k, n))})


@given(matmuls())
@SETTINGS
def test_generated_matmuls(graph):
    check_three_way(graph)


@st.composite
def pools(draw):
    op = draw(st.sampled_from(["MaxPool", "AveragePool"]))
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    pads = [draw(st.integers(0, k - 1)) for k in (kh, kw, kh, kw)]
    attrs = {"kernel_shape": [kh, kw], "pads": pads, "strides": [draw(st.integers(1, 3)), draw(st.integers(1, 3))],
             "ceil_mode": draw(st.integers(0, 1))}
    dh, dw = 1, 1
    if op == "MaxPool":
        dh, dw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
        attrs["dilations"] = [dh, dw]
    else:
        attrs["count_include_pad"] = draw(st.integers(0, 1))
    h, w = draw(st.integers((kh - 1) * dh + 1, 9)), draw(st.integers((kw - 1) * dw + 1, 9))
    return make([Node(op, ["x"], ["y"], attrs), Node("Relu", ["y"], ["z"])], {"x": (2, 2, h, w)})


@given(pools())
@SETTINGS
def test_generated_pools(graph):
    check_three_way(graph)
