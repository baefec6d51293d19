"""C backend: the portable vector kernels (vec.h) against the reference interpreter and ONNX Runtime:
depthwise convolution, convs with few output pixels run as dot products, products with few rows, and
the call-free erf. Shapes are chosen to reach every branch: rows wider than four vectors and narrower
than one, strides 1 to 3 (phase-split padded planes), dilation, asymmetric pads, channel multipliers,
channel counts off the 8 lanes of the channels-in-lanes kernel."""

from __future__ import annotations


import re
import numpy as np
import pytest

from backend_util import check_three_way, make, own_cache, side_by_side
from saturate.backend.build import BuildConfig, avx512_build, vector_lanes
from saturate.backend.emit import emit
from saturate.core.ir import Node


def packed_gemm() -> bool:
    """Whether convs run on the AVX-512 kernels (an AVX-512 build)."""
    return BuildConfig.from_env().packed_gemm


pytestmark = pytest.mark.compiler


def arr(seed: int, shape) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def conv_then(act: str, xshape, wshape, attrs: dict, seed: int, scale: float):
    """x -> Conv with bias (weights scaled by `scale`, seeded from `seed`) -> `act`."""
    consts = {"w": arr(seed, wshape) * np.float32(scale), "b": arr(seed + 1, (wshape[0],))}
    nodes = [Node("Conv", ["x", "w", "b"], ["c"], attrs), Node(act, ["c"], ["y"])]
    return make(nodes, {"x": xshape}, consts)


DEPTHWISE = [
    # (input N, C, H, W), multiplier, kernel (kh, kw), attrs
    ((1, 8, 9, 9), 1, (3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 5, 13, 70), 1, (3, 3), {"pads": [1, 1, 1, 1]}),                     # rows of 4+ vectors, two images
    ((1, 6, 12, 12), 1, (3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ((1, 4, 11, 37), 1, (5, 5), {"pads": [2, 2, 2, 2], "strides": [2, 2]}),  # odd sizes, stride 2
    ((1, 3, 3, 3), 1, (5, 5), {"pads": [2, 2, 2, 2]}),                       # kernel larger than the plane
    ((1, 4, 10, 17), 1, (3, 3), {"pads": [0, 1, 2, 0], "strides": [1, 3]}),  # asymmetric pads, stride 3
    ((1, 4, 15, 15), 1, (3, 3), {"pads": [2, 2, 2, 2], "dilations": [2, 2]}),
    ((1, 3, 14, 19), 1, (3, 3), {"pads": [2, 3, 2, 3], "dilations": [2, 3], "strides": [2, 2]}),
    ((1, 3, 9, 9), 2, (3, 3), {"pads": [1, 1, 1, 1]}),                       # channel multiplier 2
    ((1, 2, 16, 16), 3, (5, 5), {"pads": [2, 2, 2, 2], "strides": [2, 2]}),  # multiplier 3, stride 2
    ((1, 4, 8, 8), 1, (1, 1), {}),
    ((1, 4, 20, 20), 1, (7, 7), {"pads": [3, 3, 3, 3]}),
    ((1, 5, 1, 40), 1, (1, 3), {"pads": [0, 1, 0, 1]}),                      # one row
    ((1, 4, 9, 9), 1, (3, 3), {}),                                             # no pads
    # at most 64 outputs per plane: lanes across channels (sat_dwc_group), channel counts off the lane width
    ((1, 11, 8, 9), 1, (3, 3), {"pads": [0, 1, 2, 0], "strides": [2, 3], "dilations": [2, 1]}),
    ((2, 20, 6, 6), 1, (5, 5), {"pads": [2, 2, 2, 2]}),
    ((1, 37, 7, 7), 1, (3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 17, 5, 4), 1, (3, 3), {"pads": [3, 2, 1, 0]}),                       # pads wider than the kernel reach
    # channels in the lanes (sat_conv_dwt, AVX2 builds): rows of whole and partial 8-column blocks, a plane
    # smaller than one 8-pixel block, full channel groups over two images
    ((1, 13, 24, 21), 1, (3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ((1, 9, 3, 3), 1, (5, 5), {"pads": [2, 2, 2, 2]}),
    ((2, 16, 12, 12), 1, (3, 3), {"pads": [1, 1, 1, 1]}),
    # planes past a strip of L1 (sat_dwt_strip): several strips per group, rows shared between strips moved,
    # pad rows at both ends, strips whose pixels are not a multiple of 8
    ((1, 20, 50, 50), 1, (3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 18, 49, 47), 1, (3, 3), {"pads": [1, 0, 2, 1], "strides": [2, 2]}),
    ((1, 17, 61, 61), 1, (5, 5), {"pads": [2, 2, 2, 2], "dilations": [1, 2]}),
]


def depthwise(xshape, mult, kernel, attrs):
    c = xshape[1]
    consts = {"w": arr(1, (c * mult, 1) + kernel), "b": arr(2, (c * mult,))}
    return make([Node("Conv", ["x", "w", "b"], ["y"], {"group": c, **attrs})], {"x": xshape}, consts)


# The cases of one list side by side in one build (output cK_y is case K of the list): each conv is
# planned alone, and one build saves a compiler start a case.
@pytest.mark.parametrize("threads", [1, 2])
def test_depthwise_conv_geometries(threads):
    check_three_way(side_by_side([depthwise(*case) for case in DEPTHWISE]), threads=threads)


@pytest.mark.parametrize("act", ["Relu", "HardSwish", "Clip", "SiLU"])
def test_depthwise_conv_fused_bias_and_activation(act):
    consts = {"w": arr(3, (24, 1, 5, 5)), "b": arr(4, (24,))}
    nodes = [Node("Conv", ["x", "w", "b"], ["c"], {"group": 24, "pads": [2, 2, 2, 2], "strides": [2, 2]})]
    if act == "Clip":
        consts.update(lo=np.float32(0.0), hi=np.float32(6.0))
        nodes.append(Node("Clip", ["c", "lo", "hi"], ["y"]))
    elif act == "SiLU":  # lowered to Swish, whose vector form has its own exp (sat_exp8)
        nodes += [Node("Sigmoid", ["c"], ["s"]), Node("Mul", ["c", "s"], ["y"])]
    else:
        nodes.append(Node(act, ["c"], ["y"]))
    check_three_way(make(nodes, {"x": (1, 24, 14, 14)}, consts))


SMALL_MAPS = [(3, 3), (2, 5), (3, 4), (1, 3), (1, 13), (5, 5), (6, 6), (7, 7)]


@pytest.mark.parametrize("threads", [1, 2])
def test_convs_on_small_maps(threads):
    """Maps whose pixels leave a short last panel of the direct conv's tile (9 = 8 + 1, 10 = 8 + 2,
    12 = 8 + 4, 13 = 7 + 6, 25 = 8 * 3 + 1...), which runs only the rows it needs; a reduction of 300
    carries partial sums between blocks of 256."""
    consts = {"w": arr(15, (40, 300, 1, 1)) * np.float32(0.1), "b": arr(16, (40,))}
    nodes = [Node("Conv", ["x", "w", "b"], ["c"]), Node("Relu", ["c"], ["y"])]
    check_three_way(side_by_side([make(nodes, {"x": (2, 300) + hw}, consts) for hw in SMALL_MAPS]), threads=threads)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("xshape,wshape,tail", [
    ((1, 8, 32, 32), (40, 8, 3, 3), "Add"),    # 1024 pixels: a partial second weight panel, a residual Add
    ((2, 3, 64, 64), (20, 3, 3, 3), "Relu"),   # 4096 pixels, two images, 20 channels
    ((1, 5, 16, 32), (33, 5, 3, 3), "Add"),    # 512 pixels: 64 panels split between threads
])
def test_convs_whose_planes_alias_in_cache(xshape, wshape, tail, threads):
    """Output planes a multiple of 2 KB apart: the direct conv's outputs go through a stage, two panels
    at a time (sat_dconv_flush), the vector epilogue applied at the flush."""
    consts = {"w": arr(17, wshape) * np.float32(0.3), "b": arr(18, (wshape[0],))}
    shapes = {"x": xshape, "r": (xshape[0], wshape[0]) + xshape[2:]}
    nodes = [Node("Conv", ["x", "w", "b"], ["c"], {"pads": [1, 1, 1, 1]})]
    nodes += [Node("Add", ["c", "r"], ["y"])] if tail == "Add" else [Node("Relu", ["c"], ["y"])]
    if tail != "Add":
        del shapes["r"]
    check_three_way(make(nodes, shapes, consts), threads=threads)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("wshape,pads", [((40, 16, 1, 1), [0, 0, 0, 0]), ((21, 8, 3, 3), [1, 1, 1, 1])])
def test_conv_bias_and_silu_epilogue(wshape, pads, threads):
    """Bias then Swish on a dense conv: on AVX-512 builds both run on 16 channels of a pixel before the
    direct conv's tile is transposed (sat_exp16); channel counts off 16 and 32 leave partial panels."""
    consts = {"w": arr(11, wshape) * np.float32(0.3), "b": arr(12, (wshape[0],))}
    nodes = [Node("Conv", ["x", "w", "b"], ["c"], {"pads": pads}), Node("Sigmoid", ["c"], ["s"]),
             Node("Mul", ["c", "s"], ["y"])]
    g = make(nodes, {"x": (2, wshape[1], 11, 13)}, consts)
    if packed_gemm():
        from saturate import compile_graph

        assert "sat_exp16(" in compile_graph(g).emitted.source
    check_three_way(g, threads=threads)


@pytest.mark.parametrize("threads", [1, 2])
def test_depthwise_conv_per_channel_epilogue_with_a_batched_operand(threads):
    """The channels-in-lanes kernel applies a per-channel epilogue to 8 channels at once: an operand varying
    with the image as well (a squeeze-excite scale, 2 x 13 x 1 x 1) must be read at each image's channels."""
    consts = {"w": arr(7, (13, 1, 3, 3)), "b": arr(8, (13,))}
    nodes = [Node("Conv", ["x", "w", "b"], ["c"], {"group": 13, "pads": [1, 1, 1, 1]}),
             Node("Mul", ["c", "s"], ["m"]), Node("Relu", ["m"], ["y"])]
    check_three_way(make(nodes, {"x": (2, 13, 6, 5), "s": (2, 13, 1, 1)}, consts), threads=threads)


DOT_CONVS = [
    # (input shape, weight shape, attrs): at most 16 output pixels and a reduction of 32 or more
    ((1, 96, 3, 3), (160, 96, 1, 1), {}),                                     # 1x1 on a 3x3 map
    ((1, 64, 3, 3), (70, 64, 3, 3), {"pads": [1, 1, 1, 1]}),                  # 3x3 on 3x3, odd channels
    ((2, 40, 7, 7), (33, 40, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ((1, 48, 4, 4), (18, 24, 3, 3), {"pads": [1, 1, 1, 1], "group": 2}),
    ((1, 37, 5, 3), (9, 37, 2, 2), {"dilations": [2, 1]}),                    # K not a multiple of a vector
    ((1, 130, 1, 1), (1001, 130, 1, 1), {}),                                  # a conv classifier head
]


@pytest.mark.parametrize("threads", [1, 2])
def test_convs_with_few_pixels_run_as_dot_products(threads):
    # (builds without AVX-512 run most of these on streamed weights)
    g = side_by_side([conv_then("Relu", xshape, wshape, attrs, 5, 0.2) for xshape, wshape, attrs in DOT_CONVS])
    check_three_way(g, threads=threads, config=BuildConfig.from_env(stream=False))


STRIDED_POINTWISE_CONVS = [
    # (input shape, weight shape, attrs): 1x1 convs with strides; up to 64 output pixels they run on the
    # gathered pixels (dconv.h's sat_gather_plane, AVX-512 builds), else in place
    ((1, 64, 6, 6), (70, 64, 1, 1), {"strides": [2, 2]}),                    # onto a 3x3 map
    ((2, 48, 11, 9), (33, 48, 1, 1), {"strides": [2, 3]}),                   # two images, odd sizes
    ((1, 32, 7, 7), (20, 32, 1, 1), {"strides": [2, 2], "pads": [1, 0, 0, 1]}),  # pads read as zeros
    ((1, 32, 8, 8), (34, 16, 1, 1), {"strides": [2, 2], "group": 2}),        # grouped
    ((1, 40, 24, 24), (64, 40, 1, 1), {"strides": [2, 2]}),                  # 144 pixels: in place
]


@pytest.mark.parametrize("threads", [1, 2])
def test_strided_pointwise_convs(threads):
    graphs = [conv_then("Relu", xshape, wshape, attrs, 23, 0.2) for xshape, wshape, attrs in STRIDED_POINTWISE_CONVS]
    check_three_way(side_by_side(graphs), threads=threads)


STREAM_CONVS = [
    # (input shape, weight shape, attrs): at most 12 output pixels, one group (sat_conv_stream, builds without
    # AVX-512): every pixel count's unrolled loop from 1 to 12, channel counts off the 8-channel panels
    ((1, 96, 3, 3), (160, 96, 1, 1), {}),                                     # 1x1 on a 3x3 map, the input as is
    ((1, 64, 3, 3), (70, 64, 3, 3), {"pads": [1, 1, 1, 1]}),                  # 3x3 on 3x3, a partial panel
    ((2, 40, 6, 6), (33, 40, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),  # two images, stride 2
    ((1, 37, 5, 3), (9, 37, 2, 2), {"dilations": [2, 1]}),                    # 6 pixels, K off the vector
    ((1, 130, 1, 1), (1001, 130, 1, 1), {}),                                  # one pixel: a conv classifier head
    ((1, 32, 4, 3), (24, 32, 1, 1), {}),                                      # 12 pixels
    ((1, 48, 2, 2), (5, 48, 1, 1), {}),                                       # 4 pixels, fewer channels than a panel
    ((1, 36, 7, 7), (16, 36, 3, 3), {"strides": [3, 3], "pads": [1, 2, 1, 0]}),  # asymmetric pads: 3 x 2 pixels
    ((1, 40, 1, 11), (20, 40, 1, 1), {}),                                     # 11 pixels
]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("act", ["Relu", "SiLU", "Add"])
def test_convs_with_few_pixels_on_streamed_weights(act, threads):
    """Bias and Relu or SiLU run in their 8-channel form on the accumulators (AVX2 builds); the Add of a
    second input is an epilogue per plane. The cases side by side in one build, each emitted alone too. The
    AVX2 direct tiles, which take the kxk cases in AVX2 builds, are off (test_backend_avx2_direct.py)."""
    graphs = [stream_conv(xshape, wshape, attrs, act) for xshape, wshape, attrs in STREAM_CONVS]
    config = BuildConfig.from_env(direct=False)
    if not avx512_build():
        for k, g in enumerate(graphs):
            assert "sat_conv_stream(" in emit(g, config=config).source, STREAM_CONVS[k]
    check_three_way(side_by_side(graphs), threads=threads, config=config)


def stream_conv(xshape, wshape, attrs, act):
    consts = {"w": arr(21, wshape) * np.float32(0.2), "b": arr(22, (wshape[0],))}
    nodes = [Node("Conv", ["x", "w", "b"], ["c"], attrs)]
    shapes = {"x": xshape}
    if act == "SiLU":
        nodes += [Node("Sigmoid", ["c"], ["s"]), Node("Mul", ["c", "s"], ["y"])]
    elif act == "Add":
        pads, strides, dil = attrs.get("pads", [0] * 4), attrs.get("strides", [1, 1]), attrs.get("dilations", [1, 1])
        out = [(xshape[2 + i] + pads[i] + pads[2 + i] - dil[i] * (wshape[2 + i] - 1) - 1) // strides[i] + 1
               for i in range(2)]
        shapes["r"] = (xshape[0], wshape[0], *out)
        nodes.append(Node("Add", ["c", "r"], ["y"]))
    else:
        nodes.append(Node(act, ["c"], ["y"]))
    return make(nodes, shapes, consts)


SHORT_K_CONVS = [
    # (input shape, weight shape, attrs): reductions of at most 64, more than 16 pixels (sat_gemm_nn)
    ((1, 16, 48, 48), (96, 16, 1, 1), {}),                                    # a widening 1x1, whole panels
    ((1, 16, 13, 11), (42, 16, 1, 1), {}),                                    # 143 pixels: a partial panel
    ((2, 3, 33, 31), (32, 3, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),  # a stem conv, K = 27
    ((1, 8, 10, 10), (6, 4, 3, 3), {"pads": [1, 1, 1, 1], "group": 2}),       # grouped, 3 rows of output channels
    ((1, 64, 9, 9), (5, 64, 1, 1), {}),
]


@pytest.mark.parametrize("threads", [1, 2])
def test_convs_with_short_reductions(threads):
    graphs = [conv_then("HardSwish", xshape, wshape, attrs, 13, 0.3) for xshape, wshape, attrs in SHORT_K_CONVS]
    check_three_way(side_by_side(graphs), threads=threads)


# Reductions the direct tiles (AVX-512, dconv.h) split into equal blocks of at most 160: K = 147 and 160 in one,
# 288 in two of 144, 416 in three of 139 (the last 138), 417 in three of 139, 360 in three of 120.
EQUAL_BLOCK_CONVS = [
    ((1, 3, 40, 38), (19, 3, 7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 2]}),  # a stem
    ((1, 160, 9, 9), (40, 160, 1, 1), {}),
    ((1, 32, 11, 12), (36, 32, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 416, 6, 6), (33, 416, 1, 1), {}),
    ((1, 417, 6, 6), (33, 417, 1, 1), {}),
    ((1, 40, 9, 9), (24, 40, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
]


@pytest.mark.skipif(not packed_gemm(), reason="builds here hold no AVX-512 kernels")
@pytest.mark.parametrize("threads", [1, 2])
def test_direct_convs_in_equal_reduction_blocks(threads):
    from saturate.backend.plan import runs_direct

    graphs = [conv_then("Relu", xshape, wshape, attrs, 19, 0.2) for xshape, wshape, attrs in EQUAL_BLOCK_CONVS]
    for g in graphs:
        em = emit(g)
        conv = next(n for n in g.nodes if n.op == "Conv")
        assert runs_direct(conv, em.shapes, g.constants, BuildConfig.from_env()), conv
    check_three_way(side_by_side(graphs), threads=threads)


# Convs on the AVX-512 6 pixel x 64 channel direct tiles (plan.direct_width): a 7x7 map (eight 6-pixel panels and
# one of a pixel) of K = 180 in three blocks of 60; 14x14 (32 panels and one of 4) of 128 channels in two panels; a
# 1x1 conv over more than 256 KB of input and 13x13 (28 panels and one of 1), which the 8 x 32 tiles leave to the
# packed product; a strided 1x1 onto 10x10 (gathered); two groups of 64; 5- and 3-pixel maps (one short panel
# each); two images.
WIDE_CONVS = [
    ((1, 20, 7, 7), (64, 20, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 24, 14, 14), (128, 24, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 400, 13, 13), (64, 400, 1, 1), {}),
    ((1, 48, 20, 20), (64, 48, 1, 1), {"strides": [2, 2]}),
    ((1, 32, 9, 9), (128, 16, 3, 3), {"pads": [1, 1, 1, 1], "group": 2}),
    ((1, 40, 1, 5), (64, 40, 1, 3), {"pads": [0, 1, 0, 1]}),
    ((2, 16, 3, 3), (64, 16, 3, 3), {"strides": [2, 2], "pads": [2, 2, 2, 2]}),
]


@pytest.mark.skipif(not packed_gemm(), reason="builds here hold no AVX-512 kernels")
@pytest.mark.parametrize("threads", [1, 2])
def test_direct_convs_on_64_channel_tiles(threads):
    from saturate.backend.plan import DIRECT_WIDE, direct_width, runs_direct

    graphs = [conv_then("Relu", xshape, wshape, attrs, 23, 0.2) for xshape, wshape, attrs in WIDE_CONVS]
    cfg = BuildConfig.from_env()
    for g in graphs:
        em = emit(g, config=cfg)
        conv = next(n for n in g.nodes if n.op == "Conv")
        assert runs_direct(conv, em.shapes, g.constants, cfg) and direct_width(conv, em.shapes, cfg) == DIRECT_WIDE
        call = next(line for line in em.source.splitlines() if line.strip().startswith("sat_conv_direct("))
        assert call.split(",")[-4].strip() == "64", call  # the panels' width
    check_three_way(side_by_side(graphs), threads=threads)


FEW_ROW_GEMMS = [(1, 1024, 1000, 1), (1, 45, 13, 1), (3, 77, 45, 1), (16, 33, 9, 1), (1, 8, 5, 1), (1, 300, 70, 0),
                 (4, 19, 33, 0), (2, 64, 16, 0), (5, 300, 33, 0), (16, 96, 70, 0), (9, 20, 40, 1)]  # m, k, n, transB


@pytest.mark.parametrize("threads", [1, 2])
def test_gemm_with_few_rows(threads):
    graphs = []
    for m, k, n, trans_b in FEW_ROW_GEMMS:
        consts = {"w": arr(7, (n, k) if trans_b else (k, n)), "b": arr(8, (n,))}
        nodes = [Node("Gemm", ["x", "w", "b"], ["g"], {"transB": trans_b, "alpha": 0.5}), Node("Relu", ["g"], ["y"])]
        graphs.append(make(nodes, {"x": (m, k)}, consts))
    check_three_way(side_by_side(graphs), threads=threads)


def test_matmul_of_one_token():
    consts = {"w": arr(9, (192, 576))}
    check_three_way(make([Node("MatMul", ["x", "w"], ["y"])], {"x": (1, 1, 192)}, consts))


def test_erf_and_gelu_epilogues_over_a_wide_range():
    # the polynomial's whole range, tiny arguments (relative error) and the clamped tails
    g = make([Node("Mul", ["x", "s"], ["u"]), Node("Erf", ["u"], ["e"]), Node("Mul", ["e", "x"], ["y"])],
             {"x": (4, 300)}, {"s": np.float32(2.5)})
    check_three_way(g)
    x = np.concatenate([np.linspace(-6, 6, 4001), np.geomspace(1e-6, 1, 200)]).astype(np.float32).reshape(1, -1)
    from saturate.backend import compile_graph

    got = compile_graph(make([Node("Erf", ["x"], ["y"])], {"x": x.shape}))({"x": x})["y"]
    from math import erf

    ref = np.array([erf(float(v)) for v in x.reshape(-1)]).reshape(x.shape)
    assert float(np.max(np.abs(got - ref) / np.maximum(np.abs(ref), 1e-30))) < 5e-7


@pytest.mark.parametrize("isa", ["native", "avx2"])
def test_erf_within_its_stated_error_on_each_instruction_set(isa, monkeypatch):
    # tensor.h states 1.71e-7 with FMA; every float of [-10, 10] at a stride of 4099 bit patterns, +-inf, NaN
    from math import erf

    from saturate.backend import compile_graph

    monkeypatch.setenv("SATURATE_ISA", isa)
    bits = np.arange(0, 0x41200001, 4099, dtype=np.uint32)
    pos = bits.view(np.float32)
    x = np.concatenate([pos, -pos, np.float32([np.inf, -np.inf, np.nan, 3.92, -3.92])]).reshape(1, -1)
    got = compile_graph(make([Node("Erf", ["x"], ["y"])], {"x": x.shape}))({"x": x})["y"].reshape(-1)
    ref = np.array([erf(float(v)) for v in x.reshape(-1)])
    finite = ~np.isnan(ref)
    assert float(np.max(np.abs(got[finite] - ref[finite]))) <= 1.75e-7
    assert np.isnan(got[-3]) and float(np.max(np.abs(got[finite]))) <= 1.0


def test_any_thread_count_gives_the_same_outputs():
    from saturate.backend import compile_graph

    consts = {"w": arr(10, (16, 1, 3, 3)), "v": arr(11, (40, 16, 3, 3)) * np.float32(0.2)}
    g = make([Node("Conv", ["x", "w"], ["d"], {"group": 16, "pads": [1, 1, 1, 1]}),
              Node("Conv", ["d", "v"], ["y"], {"pads": [1, 1, 1, 1]})], {"x": (1, 16, 19, 23)}, consts)
    model = compile_graph(g)
    feed = {"x": arr(12, (1, 16, 19, 23))}
    one = model(feed, threads=1)["y"]
    for threads in (3, 5, 200):  # more than the pool holds is clamped to it
        np.testing.assert_allclose(model(feed, threads=threads)["y"], one, rtol=1e-5, atol=1e-5)


def test_peak_is_measured_once_and_cached(tmp_path, monkeypatch):
    from saturate.backend.bench import Row, format_table, peak_gflops

    cache = own_cache(tmp_path)
    monkeypatch.setenv("SATURATE_CACHE", str(cache))
    peak = peak_gflops()
    assert peak > 0.1 and len(list(cache.glob("peak-*.json"))) == 1
    assert peak_gflops() == peak
    table = format_table([Row("compiled C", 2.0, 1.0, peak, None, threads=2)])
    assert "50.0%" in table  # a row's share is of the peak times its threads


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_batched_matmul_items_that_split_their_own_product(threads):
    # one item per batch, each a product small enough for the few-row kernels, which split work themselves:
    # nested in the batch's items they run serially on the item's thread
    consts = {"b": arr(15, (6, 40, 70))}
    g = make([Node("MatMul", ["x", "b"], ["y"])], {"x": (6, 3, 40)}, consts)
    check_three_way(g, threads=threads)


PACKED_BMMS = [
    # (A shape, B shape): batched products on pgemm.h's tile with A read in place (sat_ukr_rows): rows off the
    # 6-row tile (last tiles of 4, 1 and 2 rows on the 4-row kernel), columns off the 16- and 32-column panels,
    # reductions past one 256-step block, more than SAT_BMM_JC panels, B's batch broadcast, fewer products than
    # two per thread (columns split)
    ((1, 6, 70, 64), (1, 6, 64, 64)),
    ((2, 3, 37, 300), (1, 3, 300, 45)),
    ((1, 2, 50, 70), (1, 2, 70, 150)),
    ((1, 1, 130, 520), (1, 1, 520, 33)),
]


def bmm_packed(source: str) -> str:
    """The `packed` argument of the source's one sat_matmul_batched call."""
    call = source[source.index("sat_matmul_batched("):].split(");")[0]
    return call.split(", ")[11]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", range(len(PACKED_BMMS)))
def test_batched_matmul_on_packed_tiles(case, threads):
    ashape, bshape = PACKED_BMMS[case]
    g = make([Node("MatMul", ["a", "b"], ["m"]), Node("Add", ["m", "c"], ["s"]), Node("Relu", ["s"], ["y"])],
             {"a": ashape, "b": bshape}, {"c": arr(18, (bshape[-1],))})
    assert bmm_packed(emit(g).source) == "1"
    check_three_way(g, threads=threads)
    # the same products on OpenBLAS (builds whose convs all take im2col keep sgemm)
    assert bmm_packed(emit(g, config=BuildConfig.from_env(im2col=True)).source) == "0"
    check_three_way(g, threads=threads, config=BuildConfig.from_env(im2col=True))


def attention_heads(s: int, h: int, d: int, k_perm, shared_v: bool = False):
    """BERT-style attention on (1, s, h * d) projections split into heads: Q and V by Transpose (0, 2, 1, 3),
    K^T by `k_perm` (from the split (1, s, h, d), or from K's heads (1, h, s, d) by (0, 1, 3, 2)); the context
    transposed back. With `shared_v` V's heads are read by a second node too (its Transpose stays a copy)."""
    nodes = [Node("Reshape", ["q", "split"], ["q4"]), Node("Transpose", ["q4"], ["qh"], {"perm": [0, 2, 1, 3]}),
             Node("Reshape", ["k", "split"], ["k4"])]
    if k_perm == [0, 1, 3, 2]:
        nodes += [Node("Transpose", ["k4"], ["kh"], {"perm": [0, 2, 1, 3]}), Node("Sigmoid", ["kh"], ["ks"]),
                  Node("Transpose", ["ks"], ["kt"], {"perm": k_perm})]
    else:
        nodes.append(Node("Transpose", ["k4"], ["kt"], {"perm": k_perm}))
    nodes += [Node("MatMul", ["qh", "kt"], ["sc"]), Node("Div", ["sc", "scale"], ["sd"]),
              Node("Softmax", ["sd"], ["p"], {"axis": -1}), Node("Reshape", ["v", "split"], ["v4"]),
              Node("Transpose", ["v4"], ["vh"], {"perm": [0, 2, 1, 3]}), Node("MatMul", ["p", "vh"], ["ctx"]),
              Node("Transpose", ["ctx"], ["ct"], {"perm": [0, 2, 1, 3]}), Node("Reshape", ["ct", "merge"], ["y"])]
    outputs = ["y"]
    if shared_v:
        nodes.append(Node("Relu", ["vh"], ["vr"]))
        outputs.append("vr")
    consts = {"split": np.array([1, s, h, d], np.int64), "merge": np.array([1, s, h * d], np.int64),
              "scale": np.float32(np.sqrt(d))}
    return make(nodes, {"q": (1, s, h * d), "k": (1, s, h * d), "v": (1, s, h * d)}, consts, outputs=outputs)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("seq,dim,k_perm,shared_v", [(70, 64, [0, 2, 3, 1], False), (100, 64, [0, 1, 3, 2], True),
                                                     (100, 36, [0, 2, 3, 1], False), (9, 64, [0, 2, 3, 1], False)])
def test_attention_reads_transposed_heads_in_place(seq, dim, k_perm, shared_v, threads):
    # Q x K^T and P x V read Q, K and V through their Transposes (plan.transposed_operands): no copy of the
    # heads, K^T packed from K's rows (8 x 8 blocks in registers, a head size of 36 leaving 4 steps); on
    # pgemm.h's tile (70 and 100 tokens) and on OpenBLAS (9, and the build whose products all take OpenBLAS).
    # Copies left: the context's merge, K's heads before the Sigmoid that K^T is taken of, and V's heads when
    # another node reads them.
    g = attention_heads(seq, 3, dim, k_perm, shared_v)
    source = emit(g).source
    copies = 1 + (k_perm == [0, 1, 3, 2]) + shared_v
    assert source.count("sat_strided(") == copies
    assert [c.split(", ")[11] for c in source.split("sat_matmul_batched(")[1:]] == ["1" if seq > 9 else "0"] * 2
    check_three_way(g, threads=threads)
    check_three_way(g, threads=threads, config=BuildConfig.from_env(im2col=True))


@pytest.mark.parametrize("threads", [2, 3])
def test_gemm_split_by_columns_across_threads(threads):
    consts = {"w": arr(16, (96, 300)), "b": arr(17, (300,))}
    nodes = [Node("Gemm", ["x", "w", "b"], ["g"]), Node("Relu", ["g"], ["y"])]
    check_three_way(make(nodes, {"x": (37, 96)}, consts), threads=threads)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("xshape", [(2, 300, 7, 7), (1, 3, 65, 67), (1, 1000, 1, 1)])
def test_global_average_pool_planes_split_across_threads(xshape, threads):
    g = make([Node("GlobalAveragePool", ["x"], ["p"]), Node("Sigmoid", ["p"], ["y"])], {"x": xshape})
    check_three_way(g, threads=threads)


PGEMM_CONVS = [
    # (input shape, weight shape, attrs): convs on pgemm.h's tile (builds without AVX-512), channel counts
    # off the 6-row and 16-column panels, odd widths, every pad and stride case
    ((1, 5, 11, 13), (7, 5, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 6, 9, 17), (13, 6, 3, 3), {"pads": [0, 1, 2, 1]}),                   # asymmetric pads, two images
    ((1, 4, 15, 15), (9, 4, 3, 3), {"pads": [2, 2, 2, 2], "dilations": [2, 2]}),
    ((1, 8, 14, 19), (11, 8, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ((1, 3, 20, 23), (17, 3, 7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 2]}),  # a stem
    ((2, 12, 7, 9), (18, 6, 3, 3), {"pads": [1, 1, 1, 1], "group": 2}),
    ((1, 40, 3, 3), (37, 40, 1, 1), {}),
    ((1, 300, 4, 5), (20, 300, 3, 3), {"pads": [1, 1, 1, 1]}),                # K = 2700: reduction blocks
    ((1, 7, 33, 1), (5, 7, 3, 1), {"pads": [1, 0, 1, 0]}),                    # one column
]


@pytest.mark.parametrize("layout", [None, "0", "1", "2"])
def test_packed_convs_in_every_layout(layout):
    """Each layout of plan.conv_layout forced (2, the padded grid, only where strides are 1); the default
    choice also on two threads, whose channel chunks split units that are too few to share. The cases
    side by side in one build per layout."""
    config = BuildConfig.from_env(conv_layout=None if layout is None else int(layout))
    g = side_by_side([conv_then("Relu", xshape, wshape, attrs, 15, 0.3) for xshape, wshape, attrs in PGEMM_CONVS])
    check_three_way(g, threads=1 if layout else 2, config=config)


@pytest.mark.parametrize("threads", [1, 2])
def test_transposed_packed_conv_with_fused_silu(threads):
    """An expansion conv on a 3x3 map (pixels on the tile's rows) with bias and SiLU: on AVX2 builds the epilogue
    runs on the 16-channel sums 8 channels at a time, the last panel of 150 channels ending in a partial half."""
    consts = {"w": arr(17, (150, 96, 1, 1)) * np.float32(0.1), "b": arr(18, (150,))}
    nodes = [Node("Conv", ["x", "w", "b"], ["c"]), Node("Sigmoid", ["c"], ["s"]), Node("Mul", ["c", "s"], ["y"])]
    check_three_way(make(nodes, {"x": (2, 96, 3, 3)}, consts), threads=threads)


PACKED_GEMMS = [(37, 768, 192, 0, 0), (17, 19, 45, 1, 0), (50, 300, 33, 0, 1), (23, 257, 200, 1, 1), (8, 19, 45, 1, 0),
                (16, 768, 200, 0, 0), (16, 768, 200, 0, 1), (2, 300, 70, 0, 1), (23, 260, 530, 1, 0)]  # m, k, n, tA, tB


@pytest.mark.parametrize("isa", ["native", "avx2"])
@pytest.mark.parametrize("threads", [1, 2])
def test_gemm_on_packed_constant_weights(threads, isa):
    """Products sat_gemm's own kernels do not take (more than one row against a transposed B, or a B as stored
    past the skinny kernel's rows): B packed in panels of two vectors' columns (pgemm.h); rows and columns
    off the panels, reductions over one block boundary, blocks of panels (SAT_PNB: 128 columns on AVX2, 256
    on AVX-512) with a partial last one, alpha and every transpose."""
    from saturate.backend.build import BuildConfig

    graphs = []
    for m, k, n, trans_a, trans_b in PACKED_GEMMS:
        consts = {"w": arr(17, (n, k) if trans_b else (k, n)) * np.float32(0.1), "b": arr(18, (n,))}
        nodes = [Node("Gemm", ["x", "w", "b"], ["g"], {"transA": trans_a, "transB": trans_b, "alpha": 0.5}),
                 Node("Relu", ["g"], ["y"])]
        graphs.append(make(nodes, {"x": (k, m) if trans_a else (m, k)}, consts))
    check_three_way(side_by_side(graphs), threads=threads, config=BuildConfig(isa=isa))


IN_PLACE_GEMMS = [(37, 300, 45, 0), (2, 40, 33, 1), (7, 257, 16, 1), (16, 513, 70, 0), (13, 64, 200, 1),
                  (9, 100, 50, 1), (4, 300, 33, 1), (11, 64, 40, 0), (14, 300, 530, 0)]  # m, k, n, transB


@pytest.mark.parametrize("isa", ["native", "avx2"])
@pytest.mark.parametrize("threads", [1, 2])
def test_gemm_on_packed_weights_reads_a_in_place(threads, isa):
    """Products of an unscaled A as stored read its rows in place on the packed tile (no A panels): row
    counts off the tile's 6 (a last tile of 1 to 4 rows on the 4-row kernel, of 5 repeating a row),
    reductions across a block boundary, columns off the panels and over several blocks of panels, each with
    its bias and Relu epilogue."""
    from saturate.backend.build import BuildConfig

    graphs = []
    for m, k, n, trans_b in IN_PLACE_GEMMS:
        consts = {"w": arr(21, (n, k) if trans_b else (k, n)) * np.float32(0.1), "b": arr(22, (n,))}
        nodes = [Node("Gemm", ["x", "w", "b"], ["g"], {"transB": trans_b}), Node("Relu", ["g"], ["y"])]
        graphs.append(make(nodes, {"x": (m, k)}, consts))
    check_three_way(side_by_side(graphs), threads=threads, config=BuildConfig(isa=isa))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("tokens", [(2, 37), (1, 16), (1, 7)])
def test_matmul_of_tokens_by_a_constant_matrix(tokens, threads):
    """A transformer's projection: a batch of tokens times one constant matrix, bias fused (16 and 7
    tokens: fewer rows than the dot products take, B packed all the same)."""
    consts = {"w": arr(19, (96, 70)) * np.float32(0.1), "b": arr(20, (70,))}
    nodes = [Node("MatMul", ["x", "w"], ["p"]), Node("Add", ["p", "b"], ["y"])]
    check_three_way(make(nodes, {"x": (*tokens, 96)}, consts), threads=threads)


WINO_CONVS = [
    # (input shape, output channels, pads): 3x3, unit strides. Odd and even maps (partial 2x2 tiles at the
    # right and bottom), pads 0, 1 and asymmetric, channel counts off 6, 8 and 16, two images, blocks of
    # tiles that split a tile row and rows longer than a block (a block is half the L2, 192 KB to 4 MB:
    # 1025 tiles a row of 32 channels pass the largest)
    ((1, 32, 16, 16), 32, [1, 1, 1, 1]),
    ((1, 32, 4, 2050), 32, [1, 1, 1, 1]),
    ((2, 37, 15, 13), 45, [1, 1, 1, 1]),
    ((1, 33, 17, 18), 40, [0, 0, 0, 0]),
    ((1, 48, 14, 15), 35, [1, 0, 0, 1]),
    ((1, 64, 56, 56), 64, [1, 1, 1, 1]),
    ((2, 40, 30, 140), 34, [1, 1, 1, 1]),
    # AVX-512 (sat_conv_wino16): more input channels than a reduction block, output channels past two passes
    ((1, 300, 10, 12), 150, [1, 1, 1, 1]),
]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("act", ["Relu", "Add"])
def test_winograd_3x3_convs(act, threads):
    """Bias and Relu run in their 8-channel form on the transformed-back sums (AVX2 builds); the residual
    Add of a second input is an epilogue on each block's output rows. BuildConfig(wino="all") gives
    the kernel the small maps too, which its choice rule leaves to the others. The cases side by side in
    one build, each emitted alone too."""
    config = BuildConfig.from_env(wino="all")
    graphs = [wino_conv(xshape, m, pads, act) for xshape, m, pads in WINO_CONVS]
    kernel = "sat_conv_wino16(" if vector_lanes() >= 8 else "sat_conv_wino("
    if vector_lanes() >= 6:  # not the portable build's 4-float vectors
        for k, g in enumerate(graphs):
            assert kernel in emit(g, config=config).source, WINO_CONVS[k]
    check_three_way(side_by_side(graphs), threads=threads, config=config)


@pytest.mark.parametrize("threads", [1, 2])
def test_winograd_epilogue_without_a_row_form(threads):
    """An epilogue with no vector form in the output transform's stores (an Add of a constant that varies
    along the rows alone, read by a gather) runs on each run of stored outputs instead."""
    consts = {"w": arr(34, (40, 32, 3, 3)) * np.float32(0.2), "r": arr(35, (1, 1, 30, 1))}
    g = make([Node("Conv", ["x", "w"], ["c"], {"pads": [1, 1, 1, 1]}), Node("Add", ["c", "r"], ["y"])],
             {"x": (1, 32, 30, 34)}, consts)
    config = BuildConfig.from_env(wino="all")
    if vector_lanes() >= 8:
        assert re.search(r"sat_conv_wino16\(.*, pw_\d+, NULL\);", emit(g, config=config).source)
    check_three_way(g, threads=threads, config=config)


@pytest.mark.parametrize("threads", [1, 2])
def test_winograd_of_many_channel_pairs(threads):
    """AVX-512 and AVX2 builds run a conv of more than WINO16_MAXCM channel pairs (on AVX-512 on a map of at
    least WINO_AVX512_MINP pixels) on the first form (sat_conv_wino, pgemm.h's tile), with a Relu and an Add."""
    if vector_lanes() < 8:
        pytest.skip("portable builds have no Winograd")
    graphs = [wino_conv((1, 136, 28, 29), 130, [1, 1, 1, 1], act) for act in ("Relu", "Add")]
    for g in graphs:
        assert "sat_conv_wino(" in emit(g).source
    check_three_way(side_by_side(graphs), threads=threads)


def wino_conv(xshape, m, pads, act):
    consts = {"w": arr(31, (m, xshape[1], 3, 3)) * np.float32(0.2), "b": arr(32, (m,))}
    nodes = [Node("Conv", ["x", "w", "b"], ["c"], {"pads": pads})]
    shapes = {"x": xshape}
    if act == "Add":
        shapes["r"] = (xshape[0], m, xshape[2] + pads[0] + pads[2] - 2, xshape[3] + pads[1] + pads[3] - 2)
        nodes.append(Node("Add", ["c", "r"], ["y"]))
    else:
        nodes.append(Node(act, ["c"], ["y"]))
    return make(nodes, shapes, consts)


def test_winograd_switch_and_rule():
    """BuildConfig(wino="off") keeps 3x3 convs on the kernels before it; outputs under WINO_MINP pixels
    (WINO_DEEP_MINP from 512 channels), fewer than WINO_MINC channels, strides, dilations and groups never
    take it; AVX-512 builds keep maps under WINO16_MINP pixels and convs of more than WINO16_MAXCM channel
    pairs on their direct conv (or, from WINO_AVX512_MINP pixels and WINO_AVX512_MINCM pairs, on the first form,
    sat_conv_wino), and AVX2 builds maps of at most plan.DIRECT8_MAXP pixels on theirs (off here but for the last
    check)."""
    def conv(xshape, m, wino="auto", direct=False, **attrs):
        g = make([Node("Conv", ["x", "w"], ["y"], {"pads": [1, 1, 1, 1], **attrs})], {"x": xshape},
                 {"w": arr(33, (m, xshape[1] // attrs.get("group", 1), 3, 3))})
        found = re.search(r"sat_conv_wino(16)?\(", emit(g, config=BuildConfig.from_env(wino=wino, direct=direct)).source)
        return found and found.group(0)

    if vector_lanes() < 6:
        pytest.skip("portable builds' 4-float vectors cannot hold a 6-tile panel: no Winograd")
    if packed_gemm():
        wino16 = "sat_conv_wino16("
        assert conv((1, 64, 56, 56), 64) == conv((1, 128, 28, 28), 128) == conv((1, 32, 12, 12), 128) == wino16
        assert not conv((1, 64, 11, 11), 128)       # 121 pixels
        assert not conv((1, 256, 14, 14), 256)      # more than 16384 pairs, under 784 pixels
        assert conv((1, 128, 28, 28), 256) == "sat_conv_wino(" and conv((1, 128, 28, 28), 256, wino="all") == wino16
        assert not conv((1, 16, 56, 56), 64)        # 16 input channels
        assert not conv((1, 64, 56, 56), 64, strides=[2, 2])
        assert conv((1, 128, 56, 56), 64) and not conv((1, 128, 56, 56), 64, wino="off")
        return
    assert conv((1, 32, 6, 6), 32)
    assert not conv((1, 32, 5, 5), 32)              # 25 pixels
    assert conv((1, 512, 12, 12), 512)
    assert not conv((1, 512, 7, 7), 512)            # 49 pixels of 512 channels
    assert not conv((1, 16, 56, 56), 64)            # 16 input channels
    assert not conv((1, 64, 56, 56), 64, strides=[2, 2])
    assert not conv((1, 64, 56, 56), 64, dilations=[2, 2], pads=[2, 2, 2, 2])
    assert not conv((1, 64, 56, 56), 64, group=2)
    assert not conv((1, 32, 6, 6), 32, wino="off")
    if BuildConfig.from_env().isa == "avx2":
        assert not conv((1, 32, 6, 6), 32, direct=True) and conv((1, 32, 12, 12), 32, direct=True)
