"""C backend: products on B packed by the emitter (sat_gemm_packed) whose A panels the threads pack as they
first reach them, within the product's one job, checked against ONNX Runtime and the reference interpreter
at several thread counts, and equal from call to call."""

from __future__ import annotations

import numpy as np
import pytest

from backend_util import check_three_way, make, side_by_side
from saturate.core.ir import Node

pytestmark = pytest.mark.compiler


def product(m: int, k: int, n: int, seed: int, trans_a: bool = False, then: str = ""):
    """A (m x k, an input) times a constant B (k x n), as MatMul or as Gemm of A given transposed."""
    rng = np.random.default_rng(seed)
    consts = {"b": (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)}
    if trans_a:
        nodes = [Node("Gemm", ["a", "b"], ["y"], {"transA": 1})]
        inputs = {"a": (k, m)}
    else:
        nodes = [Node("MatMul", ["a", "b"], ["y"])]
        inputs = {"a": (m, k)}
    if then:
        nodes[-1].outputs = ["p"]
        nodes.append(Node(then, ["p"], ["y"]))
    return make(nodes, inputs, consts)


# rows not a multiple of the 6-row panel, reductions past one 256-deep block, columns of many panels
CASES = [product(50, 300, 200, 0), product(128, 384, 96, 1, then="Relu"), product(7, 64, 512, 2),
         product(61, 520, 130, 3, trans_a=True)]


@pytest.mark.parametrize("threads", [2, 3, 4])
def test_products_packing_a_as_threads_reach_it(threads):
    from saturate.backend import compile_graph
    from backend_util import feed_for

    graph = side_by_side(CASES)
    check_three_way(graph, threads=threads)
    model, feed = compile_graph(graph, threads=threads), feed_for(graph, 5)
    first = model(feed)
    for _ in range(20):
        again = model(feed)
        for name, value in first.items():
            np.testing.assert_array_equal(again[name], value)
