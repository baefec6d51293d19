"""C backend: convs on pgemm.h's tile in builds without the AVX-512 kernels (SATURATE_ISA=avx2), against the
reference interpreter and ONNX Runtime. Strided convs on sat_conv_xdirect's grid of input phases: every stride
up to 4, strides differing by direction, dilations that fold taps onto fewer phases, pads on some sides only,
groups, two images, and a 7x7 stem as the planner places it. On AVX-512 builds the same graphs run on the
AVX-512 kernels (the checks still hold; the planner cases below fix the instruction set themselves)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from backend_util import check_three_way, make
from saturate.backend import plan
from saturate.backend.build import BuildConfig
from saturate.backend.emit import emit
from saturate.backend.shapes import conv_window
from saturate.core.ir import Node


def arr(seed: int, shape) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def conv_relu(xshape, wshape, attrs: dict, seed: int = 7):
    consts = {"w": arr(seed, wshape) * np.float32(0.2), "b": arr(seed + 1, (wshape[0],))}
    nodes = [Node("Conv", ["x", "w", "b"], ["c"], attrs), Node("Relu", ["c"], ["y"])]
    return make(nodes, {"x": xshape}, consts)


STRIDED = [
    # (input shape, weight shape, attrs)
    ((1, 5, 13, 17), (11, 5, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ((2, 6, 16, 15), (14, 6, 3, 3), {"pads": [0, 1, 2, 0], "strides": [2, 2]}),           # asymmetric pads
    ((1, 4, 19, 22), (9, 4, 5, 5), {"pads": [2, 2, 2, 2], "strides": [3, 3]}),
    ((1, 4, 17, 21), (7, 4, 3, 5), {"pads": [1, 2, 1, 2], "strides": [1, 2]}),            # strides differ
    ((1, 3, 23, 26), (6, 3, 4, 4), {"pads": [1, 1, 2, 2], "strides": [4, 4]}),            # 16 phases
    ((1, 4, 21, 21), (8, 4, 3, 3), {"pads": [2, 2, 2, 2], "strides": [2, 2], "dilations": [2, 2]}),  # one phase
    ((1, 6, 12, 14), (10, 6, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2], "dilations": [3, 1]}),
    ((1, 16, 12, 12), (20, 16, 1, 1), {"strides": [2, 2]}),                               # 1x1: one phase
    ((2, 12, 11, 13), (18, 6, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2], "group": 2}),
    ((1, 3, 40, 38), (19, 3, 7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 2]}),           # a stem
]


@pytest.mark.compiler
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("xshape,wshape,attrs", STRIDED)
def test_strided_convs_on_the_phase_grid(xshape, wshape, attrs, threads):
    """Layout 2 forced: the padded grid of the input's phases, on one thread and on two."""
    check_three_way(conv_relu(xshape, wshape, attrs), threads=threads, config=BuildConfig.from_env(conv_layout=2))


@pytest.mark.compiler
@pytest.mark.parametrize("threads", [1, 2])
def test_stem_as_planned(threads):
    """A 7x7 stride-2 stem of 3 channels with the planner's own choice (the direct tiles on AVX2 builds)."""
    check_three_way(conv_relu((1, 3, 64, 64), (24, 3, 7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 2]}),
                    threads=threads)


def layout_of(xshape, wshape, attrs, isa: str = "avx2") -> int | None:
    g = conv_relu(xshape, wshape, attrs)
    node, shapes = g.nodes[0], {"x": xshape, "w": wshape}
    cfg = BuildConfig(isa=isa)
    if not plan.runs_packed(node, shapes, g.constants, cfg):
        return None
    win = conv_window(node, xshape, wshape)
    return plan.conv_layout(xshape, wshape, win, int(node.attr("group", 1)), cfg)


def test_planner_sends_strided_stems_to_the_direct_tiles():
    """ResNet's 7x7 stem (K = 147) and a 3x3 stem of 3 channels (K = 27) run on the AVX2 direct tiles (dconv8.h),
    off pgemm.h's tile; AVX-512 builds run convs on their own kernels."""
    for stem in [((1, 3, 96, 96), (64, 3, 7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 2]}),
                 ((1, 3, 96, 96), (32, 3, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]})]:
        g = conv_relu(*stem)
        assert plan.direct_avx2(g.nodes[0], {"x": stem[0], "w": stem[1]}, g.constants, BuildConfig(isa="avx2"))
        assert layout_of(*stem) is None
        assert layout_of(*stem, isa="avx512") is None


EXPANSIONS = [
    # ResNet-50's 1x1 expansions: 128 -> 512 on a 12x12 map (layout 0 reading its input in place) and the
    # stride-2 256 -> 512 projection from a 24x24 map (layout 0, im2col packed for the tile)
    ((1, 128, 12, 12), (512, 128, 1, 1), {}, 0),
    ((1, 256, 24, 24), (512, 256, 1, 1), {"strides": [2, 2]}, 0),
]


def test_planner_sends_large_1x1_expansions_to_the_tile():
    """1x1 convs to at least twice their channels, of at least PACKED_ONE_MINW weights, run on pgemm.h's tile
    in AVX2 builds; smaller ones of short reductions stay on OpenBLAS (or the direct tiles)."""
    for xshape, wshape, attrs, layout in EXPANSIONS:
        assert layout_of(xshape, wshape, attrs) == layout
        assert layout_of(xshape, wshape, attrs, isa="avx512") is None
    assert layout_of((1, 64, 24, 24), (256, 64, 1, 1), {}) is None


# 1x1 convs of unit strides and no padding over at least IN_PLACE_MINK channels: the usual product reads its
# whole 16-pixel panels from the input planes in place, a last partial panel packed.
IN_PLACE = [
    # (input shape, weight shape, attrs, residual)
    ((1, 256, 24, 24), (64, 256, 1, 1), {}, False),     # ResNet-50's projection: 36 whole panels, 64 = 10 x 6 + 4
    ((2, 100, 7, 9), (13, 100, 1, 1), {}, True),        # 63 px: 3 panels + 15 packed; 13 = 6 + 6 + 1; two images
    ((1, 300, 5, 7), (20, 300, 1, 1), {}, False),       # K = 300: two reduction blocks, the second accumulating
    ((1, 96, 3, 5), (7, 96, 1, 1), {}, True),           # 15 px: no whole panel, all packed
    ((1, 192, 10, 10), (24, 96, 1, 1), {"group": 2}, False),  # per group, its channels' planes in place
    ((1, 1024, 9, 9), (140, 1024, 1, 1), {}, True),     # 560 KB of weights: channel blocks of 126 and 14
]


def test_planner_reads_1x1_inputs_in_place():
    """Projections and expansions of at least IN_PLACE_MINK input channels take the usual product in place
    (layout 0) in AVX2 builds; reductions over fewer stay where they ran (sgemm, the short-reduction kernel)."""
    assert layout_of((1, 512, 12, 12), (128, 512, 1, 1), {}) == 0
    assert layout_of((1, 256, 24, 24), (64, 256, 1, 1), {}) == 0
    assert layout_of((1, 96, 24, 24), (24, 96, 1, 1), {}) == 0
    assert layout_of((1, 24, 24, 24), (144, 24, 1, 1), {}) is None
    assert layout_of((1, 256, 24, 24), (64, 256, 1, 1), {}, isa="avx512") is None
    node = conv_relu((1, 256, 24, 24), (64, 256, 1, 1), {}).nodes[0]
    win = conv_window(node, (1, 256, 24, 24), (64, 256, 1, 1))
    assert plan.reads_in_place((1, 256, 24, 24), (64, 256, 1, 1), win)
    for xshape, wshape, attrs in [((1, 256, 24, 24), (64, 256, 1, 1), {"pads": [1, 1, 1, 1]}),
                                  ((1, 256, 24, 24), (64, 256, 1, 1), {"strides": [2, 2]}),
                                  ((1, 64, 24, 24), (64, 64, 1, 1), {})]:
        node = conv_relu(xshape, wshape, attrs).nodes[0]
        assert not plan.reads_in_place(xshape, wshape, conv_window(node, xshape, wshape)), (xshape, wshape, attrs)


def conv_residual(xshape, wshape, attrs: dict, residual: bool, seed: int = 5):
    """Conv + bias, then a residual Add and Relu (the scalar epilogue), or Relu alone."""
    g = conv_relu(xshape, wshape, attrs, seed)
    if not residual:
        return g
    win = conv_window(g.nodes[0], xshape, wshape)
    consts = {"w": g.constants["w"], "b": g.constants["b"]}
    nodes = [Node("Conv", ["x", "w", "b"], ["c"], attrs), Node("Add", ["c", "r"], ["a"]), Node("Relu", ["a"], ["y"])]
    return make(nodes, {"x": xshape, "r": (xshape[0], wshape[0], win.oh, win.ow)}, consts)


@pytest.mark.compiler
@pytest.mark.skipif(" avx2 " not in Path("/proc/cpuinfo").read_text().replace("\n", " "), reason="the CPU has no AVX2")
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("xshape,wshape,attrs,residual", IN_PLACE)
def test_1x1_convs_read_in_place(xshape, wshape, attrs, residual, threads):
    """The avx2 build (whatever the machine's ISA) with layout 0 forced (the planner's own choice for the
    first), against the interpreter and ONNX Runtime, on one thread and two."""
    forced = {} if attrs == {} and wshape == (64, 256, 1, 1) else {"conv_layout": 0}
    check_three_way(conv_residual(xshape, wshape, attrs, residual), threads=threads,
                    config=BuildConfig(isa="avx2", **forced))


@pytest.mark.compiler
@pytest.mark.parametrize("xshape,wshape,attrs,residual", IN_PLACE[1:3])
def test_1x1_convs_read_in_place_on_the_portable_build(xshape, wshape, attrs, residual):
    """The portable build's 8-wide panels (4-float vectors) take the same path."""
    check_three_way(conv_residual(xshape, wshape, attrs, residual), config=BuildConfig(isa="portable", conv_layout=0))


@pytest.mark.compiler
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("xshape,wshape,attrs,layout", EXPANSIONS)
def test_large_1x1_expansions_as_planned(xshape, wshape, attrs, layout, threads):
    """The expansions above with the planner's choice, against the interpreter and ONNX Runtime."""
    check_three_way(conv_relu(xshape, wshape, attrs), threads=threads)


def test_avx512_tiles_leave_1x1_convs_of_large_inputs_to_the_packed_product():
    """AVX-512 builds read a plain 1x1 conv's input in place on dconv.h's tiles only up to DIRECT_ONE_MAXB bytes
    of input (one image and group), a strided one's up to DIRECT_STRIDED_ONE_MAXB; larger ones to at least
    DIRECT_ONE_MINM channels (ResNet-50's on 56x56 maps at 224x224) take the packed product, unless a plain one's
    32-pixel panels would pad its map by more than a quarter or it runs on the 6 x 64 tiles (a multiple of 64
    channels onto at most DIRECT_WIDE_MAXP pixels)."""
    cfg = BuildConfig(isa="avx512")
    for xshape, wshape, attrs, direct in [((1, 64, 56, 56), (64, 64, 1, 1), {}, False),         # 784 KB
                                          ((1, 16, 56, 56), (64, 16, 1, 1), {}, True),          # 196 KB
                                          ((1, 32, 48, 48), (16, 32, 1, 1), {}, True),          # to 16 channels
                                          ((1, 256, 14, 14), (1024, 256, 1, 1), {}, True),      # 196 KB
                                          ((1, 512, 28, 28), (128, 512, 1, 1), {}, False),      # 1.6 MB
                                          ((1, 2048, 7, 7), (512, 2048, 1, 1), {}, True),       # 49 in 64
                                          ((1, 1024, 14, 14), (256, 1024, 1, 1), {}, True),     # 6 x 64 tiles
                                          ((1, 1024, 14, 14), (200, 1024, 1, 1), {}, False),    # 196 in 224
                                          ((1, 512, 28, 28), (1024, 512, 1, 1), {"strides": [2, 2]}, True),
                                          ((1, 512, 34, 34), (1024, 512, 1, 1), {"strides": [2, 2]}, False),
                                          ((1, 2048, 6, 6), (256, 2048, 1, 1), {}, True),       # 36 in 64
                                          ((1, 64, 10, 10), (64, 64, 3, 3), {"pads": [1, 1, 1, 1]}, True),
                                          ((1, 256, 56, 56), (512, 256, 1, 1), {"strides": [2, 2]}, False),
                                          ((1, 1024, 14, 14), (2048, 1024, 1, 1), {"strides": [2, 2]}, True)]:
        g = conv_relu(xshape, wshape, attrs)
        shapes = {"x": xshape, "w": wshape}
        assert plan.runs_direct(g.nodes[0], shapes, g.constants, cfg) == direct, (xshape, wshape, attrs)


# Plain 1x1 convs the AVX-512 build runs on the packed product (over DIRECT_ONE_MAXB bytes of input, at least
# DIRECT_ONE_MINM channels out). With more than PW_MAXW packed weights on sat_conv2d's tiles, in each loop order
# of sat_conv_tile: one reduction block (channel panels outer), two blocks and weights of at most 2^18 floats
# (pixel panels outer), two blocks and more (channel panels outer, the epilogue after the last block). Else on
# sat_conv_pw, the epilogue's row form in the kernel's stores: one reduction block (70 = 8 x 8 + 6 channels,
# 961 = 30 x 32 + 1 pixels), two blocks (300 = 256 + 44), two images, three pixel panels (at 2 threads also
# split by channels: 56 + 44). Channel and pixel tails throughout.
PACKED_ONE = [((1, 200, 24, 23), (700, 200, 1, 1), "sat_conv2d("), ((1, 300, 16, 16), (440, 300, 1, 1), "sat_conv2d("),
              ((1, 600, 12, 12), (440, 600, 1, 1), "sat_conv2d("), ((1, 72, 31, 31), (70, 72, 1, 1), "sat_conv_pw("),
              ((1, 300, 16, 16), (72, 300, 1, 1), "sat_conv_pw("), ((2, 96, 24, 30), (64, 96, 1, 1), "sat_conv_pw("),
              ((1, 700, 8, 12), (100, 700, 1, 1), "sat_conv_pw(")]


@pytest.mark.compiler
@pytest.mark.skipif(" avx512f " not in Path("/proc/cpuinfo").read_text().replace("\n", " "),
                    reason="the CPU has no AVX-512")
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("xshape,wshape,kernel", PACKED_ONE)
@pytest.mark.parametrize("residual", [False, True])
def test_packed_1x1_convs_on_each_kernel(xshape, wshape, kernel, residual, threads):
    """Conv + bias (+ a residual Add read by the epilogue: a graph input, not added in place) + Relu on the
    AVX-512 build's packed product, against the interpreter and ONNX Runtime, on one thread and two."""
    cfg = BuildConfig(isa="avx512")
    g = conv_residual(xshape, wshape, {}, residual)
    assert not plan.runs_direct(g.nodes[0], {"x": xshape, "w": wshape}, g.constants, cfg)
    assert plan.runs_pw(g.nodes[0], {"x": xshape, "w": wshape}, g.constants, cfg) == (kernel == "sat_conv_pw(")
    source = emit(g, config=cfg).source
    assert kernel in source and ("sat_conv2d(" in source) == (kernel == "sat_conv2d(")
    check_three_way(g, threads=threads, config=cfg)


@pytest.mark.compiler
@pytest.mark.skipif(" avx512f " not in Path("/proc/cpuinfo").read_text().replace("\n", " "),
                    reason="the CPU has no AVX-512")
@pytest.mark.parametrize("threads", [1, 2])
def test_strided_1x1_conv_of_a_large_input_on_the_packed_product(threads):
    """A stride-2 1x1 conv over more than DIRECT_STRIDED_ONE_MAXB of input (odd map: the last row and column are
    not read) with a residual, on the AVX-512 build's packed product."""
    cfg = BuildConfig(isa="avx512")
    g = conv_residual((1, 96, 55, 53), (70, 96, 1, 1), {"strides": [2, 2]}, True)
    assert not plan.runs_direct(g.nodes[0], {"x": (1, 96, 55, 53), "w": (70, 96, 1, 1)}, g.constants, cfg)
    check_three_way(g, threads=threads, config=cfg)


@pytest.mark.compiler
@pytest.mark.parametrize("threads", [1, 2])
def test_1x1_convs_of_large_inputs_as_planned(threads):
    """A 1x1 conv over more than DIRECT_ONE_MAXB bytes of input with a residual epilogue, on the machine's own
    build (AVX-512: the packed product; AVX2: the tile or sgemm), against the interpreter and ONNX Runtime."""
    check_three_way(conv_residual((1, 96, 30, 30), (40, 96, 1, 1), {}, True), threads=threads)
