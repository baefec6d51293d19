"""C backend: the rotary position embedding (Slice, Neg, Concat, Mul, Mul, Add as exporters write it) run as one
kernel, checked against ONNX Runtime and the reference interpreter; a pattern whose inner value is read
elsewhere stays node by node."""

from __future__ import annotations

import numpy as np
import pytest

from backend_util import check_three_way, make, side_by_side
from saturate.core.ir import Node

pytestmark = pytest.mark.compiler

BIG = np.iinfo(np.int64).max


def rotary_graph(x: tuple, table: tuple, swap: bool = False, high_end: int | None = None, seed: int = 0,
                 concat_out: bool = False):
    """x * cos + rotate_half(x) * sin over x's last axis; `swap` puts the constants first and the sine
    product first in the Add; `concat_out` makes rotate_half(x) an output too."""
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
    return make(nodes, {"x": x}, consts, outputs=["y", "rot"] if concat_out else ["y"])


CASES = [
    rotary_graph((1, 2, 8, 16), (1, 1, 8, 16)),
    rotary_graph((2, 8, 12), (8, 12), swap=True, high_end=BIG, seed=1),
    rotary_graph((3, 5, 32), (1, 32), seed=2),
    rotary_graph((1, 3, 4, 8), (1, 1, 4, 8), seed=3, concat_out=True),
]


@pytest.mark.parametrize("threads", [1, 2])
def test_rotary_matches_reference_and_ort(threads):
    from saturate.backend import compile_graph

    graph = side_by_side(CASES)
    check_three_way(graph, threads=threads)
    steps = compile_graph(graph, threads=threads).emitted.plan.steps
    fused = sorted(s.out for s in steps if s.pattern == "rotary")
    # the fourth case's rotate_half(x) is an output: its nodes run one by one
    assert fused == ["c0_y", "c1_y", "c2_y"]
