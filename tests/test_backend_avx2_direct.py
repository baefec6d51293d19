"""C backend: the AVX2 direct conv (dconv8.h: 6 pixel x 16 channel tiles broadcasting from the input, no
im2col) in avx2 builds, against the reference interpreter and ONNX Runtime. The cases are shapes the planner
sends there (strided convs, kxk convs on maps of at most 64 pixels, 1x1 convs of long reductions or few
weights on such maps), built for avx2 whatever the machine's own ISA: last panels of 1 to 5 pixels and of 1 to 15 channels,
reductions over one to eleven blocks of 256 (of 128 on maps of at most 12 pixels), pads, dilations, groups,
two images, the 8-channel epilogue and the scalar one, on one thread and two."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from backend_util import check_three_way, make, side_by_side
from saturate.backend import plan
from saturate.backend.build import BuildConfig
from saturate.backend.emit import emit
from saturate.core.ir import Node

pytestmark = pytest.mark.skipif(" avx2 " not in Path("/proc/cpuinfo").read_text().replace("\n", " "),
                                reason="the CPU has no AVX2")

AVX2 = BuildConfig(isa="avx2")


def arr(seed: int, shape) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def conv(xshape, wshape, attrs: dict, seed: int = 3, residual: bool = False):
    """Conv + bias + Relu (an 8-channel epilogue), or with a residual Add first (the scalar epilogue)."""
    consts = {"w": arr(seed, wshape) * np.float32(1.0 / np.sqrt(np.prod(wshape[1:]))), "b": arr(seed + 1, (wshape[0],))}
    nodes = [Node("Conv", ["x", "w", "b"], ["c"], attrs)]
    inputs = {"x": xshape}
    if residual:
        g = make(nodes, inputs, consts)  # for the output shape only
        from saturate.backend.shapes import conv_window
        win = conv_window(g.nodes[0], xshape, wshape)
        inputs["r"] = (xshape[0], wshape[0], win.oh, win.ow)
        nodes.append(Node("Add", ["c", "r"], ["a"]))
        nodes.append(Node("Relu", ["a"], ["y"]))
    else:
        nodes.append(Node("Relu", ["c"], ["y"]))
    return make(nodes, inputs, consts)


CASES = [
    # (input shape, weight shape, attrs, residual)
    ((1, 16, 12, 12), (32, 16, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}, False),    # 36 pixels: whole panels
    ((1, 24, 11, 11), (20, 24, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}, False),    # 36 px, 16 + 4 channels
    ((2, 8, 7, 7), (13, 8, 3, 3), {"pads": [1, 1, 1, 1]}, True),                            # 49 px: 8 x 6 + 1; scalar
    ((1, 40, 5, 8), (9, 40, 3, 3), {"pads": [1, 1, 1, 1]}, False),                          # 40 px: 6 x 6 + 4; 9 ch
    ((1, 300, 4, 4), (24, 300, 3, 3), {"pads": [1, 1, 1, 1]}, True),                        # K = 2700: 11 blocks
    ((1, 64, 6, 6), (17, 64, 3, 3), {}, False),                                             # no pads: in place, 16 px
    ((1, 32, 7, 7), (8, 32, 3, 3), {"pads": [2, 2, 2, 2], "dilations": [2, 2]}, False),     # dilated, 49 px
    ((1, 3, 40, 38), (19, 3, 7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 2]}, False),      # a stem: 380 px, K = 147
    ((1, 3, 33, 33), (10, 3, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}, True),       # 289 px: 48 x 6 + 1
    ((2, 12, 11, 13), (18, 6, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2], "group": 2}, False),
    ((1, 6, 12, 14), (10, 6, 3, 3), {"pads": [0, 1, 2, 0], "strides": [2, 3], "dilations": [3, 1]}, False),
    ((1, 64, 4, 4), (40, 64, 3, 3), {"pads": [1, 1, 1, 1]}, False),                         # 16 px, 16 + 16 + 8 ch
    ((1, 520, 3, 3), (70, 520, 3, 3), {"pads": [1, 1, 1, 1]}, False),                       # 9 px, K = 4680
    ((1, 600, 5, 5), (20, 600, 1, 1), {}, True),                                            # 1x1, K = 600
    ((2, 1030, 4, 4), (9, 1030, 1, 1), {}, False),                                          # 1x1, two images
    ((1, 24, 7, 7), (144, 24, 1, 1), {}, False),                                            # 1x1, few weights
]


def test_planner_sends_the_cases_to_the_direct_tiles():
    """Every case above runs on sat_conv_direct in an avx2 build (else the checks below test another kernel)."""
    for k, (xshape, wshape, attrs, residual) in enumerate(CASES):
        g = conv(xshape, wshape, attrs, residual=residual)
        shapes = {"x": xshape, "w": wshape}
        assert plan.direct_avx2(g.nodes[0], shapes, g.constants, AVX2), (k, xshape, wshape, attrs)


def test_planner_keeps_other_kernels_where_they_are_faster():
    """1x1 convs, 3x3 convs of unit stride on maps past 64 pixels (Winograd's), the AVX-512 build, forced
    layouts and forced Winograd stay off the direct tiles."""
    def direct(xshape, wshape, attrs, cfg=AVX2):
        g = conv(xshape, wshape, attrs)
        return plan.direct_avx2(g.nodes[0], {"x": xshape, "w": wshape}, g.constants, cfg)

    assert direct((1, 128, 6, 6), (128, 128, 3, 3), {"pads": [1, 1, 1, 1]})
    assert not direct((1, 128, 12, 12), (128, 128, 3, 3), {"pads": [1, 1, 1, 1]})
    assert not direct((1, 256, 24, 24), (64, 256, 1, 1), {})
    assert direct((1, 96, 6, 6), (576, 96, 1, 1), {})                  # 1x1, few weights
    assert not direct((1, 256, 6, 6), (1024, 256, 1, 1), {})           # 1x1, a short reduction of many weights
    assert not direct((1, 1024, 12, 12), (64, 1024, 1, 1), {})         # 1x1 past 64 pixels
    assert not direct((1, 1024, 3, 3), (64, 1024, 1, 1), {})           # 1x1 on streamed weights
    assert not direct((1, 1024, 12, 12), (64, 1024, 1, 1), {"strides": [2, 2]})
    assert not direct((1, 128, 6, 6), (128, 128, 3, 3), {"pads": [1, 1, 1, 1]}, BuildConfig(isa="avx512"))
    assert not direct((1, 128, 6, 6), (128, 128, 3, 3), {"pads": [1, 1, 1, 1]}, BuildConfig(isa="avx2", conv_layout=2))
    assert not direct((1, 128, 6, 6), (128, 128, 3, 3), {"pads": [1, 1, 1, 1]}, BuildConfig(isa="avx2", wino="all"))
    assert not direct((1, 8, 6, 6), (8, 1, 3, 3), {"pads": [1, 1, 1, 1], "group": 8})  # depthwise


@pytest.mark.compiler
@pytest.mark.parametrize("threads", [1, 2])
def test_direct_tiles_match_the_reference_and_onnxruntime(threads):
    g = side_by_side([conv(x, w, a, seed=k, residual=r) for k, (x, w, a, r) in enumerate(CASES)])
    assert emit(g, config=AVX2).source.count("sat_conv_direct(") == len(CASES)
    check_three_way(g, threads=threads, config=AVX2)
