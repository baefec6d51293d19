"""C backend, AVX-512 and AVX2 builds: values stored in pixel panels (plan.panel_roots). A ResNet stage's residual
stream, written by its 1x1 convs (one adding onto it in place) and read only by 1x1 convs (one of stride 2, which
gathers its pixels), is stored as panels of all its channels (32 pixels on AVX-512, 16 on AVX2), read by
sat_conv_pw in place; the planner cases (which streams may, which must not), then stages against the reference
interpreter and ONNX Runtime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from backend_util import check_three_way, make
from saturate.backend.build import BuildConfig
from saturate.backend.emit import emit
from saturate.core.ir import Node

CPU_FLAGS = Path("/proc/cpuinfo").read_text().replace("\n", " ")
AVX512 = " avx512f " in CPU_FLAGS
# each build, skipped where the CPU cannot run it
ISAS = [pytest.param("avx512", marks=pytest.mark.skipif(not AVX512, reason="the CPU has no AVX-512")),
        pytest.param("avx2", marks=pytest.mark.skipif(" avx2 " not in CPU_FLAGS, reason="the CPU has no AVX2"))]


def arr(seed: int, shape) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * 0.15).astype(np.float32)


def stage(n=1, hw=(47, 47), blocks=2, tail=(), outputs=None):
    """x -> 1x1 conv 48 -> 96 (the stream s0), then `blocks` bottlenecks (1x1 96 -> 32 + Relu, 3x3 32 -> 32 +
    Relu, 1x1 32 -> 96 + s + Relu: the stream s1, s2 ...), then a 1x1 conv of stride 2 (96 -> 40) and one of
    stride 1 (96 -> 24) reading the last stream, their outputs the graph's; then `tail`."""
    consts = {"wd": arr(1, (96, 48, 1, 1)), "bd": arr(2, (96,))}
    nodes = [Node("Conv", ["x", "wd", "bd"], ["s0"])]
    for k in range(blocks):
        s, t = f"s{k}", f"s{k + 1}"
        consts.update({f"w1_{k}": arr(10 + k, (32, 96, 1, 1)), f"b1_{k}": arr(20 + k, (32,)),
                       f"w2_{k}": arr(30 + k, (32, 32, 3, 3)), f"w3_{k}": arr(40 + k, (96, 32, 1, 1)),
                       f"b3_{k}": arr(50 + k, (96,))})
        nodes += [Node("Conv", [s, f"w1_{k}", f"b1_{k}"], [f"c{k}"]), Node("Relu", [f"c{k}"], [f"h{k}"]),
                  Node("Conv", [f"h{k}", f"w2_{k}"], [f"e{k}"], {"pads": [1, 1, 1, 1]}),
                  Node("Relu", [f"e{k}"], [f"g{k}"]), Node("Conv", [f"g{k}", f"w3_{k}", f"b3_{k}"], [f"d{k}"]),
                  Node("Add", [f"d{k}", s], [f"a{k}"]), Node("Relu", [f"a{k}"], [t])]
    last = f"s{blocks}"
    consts.update({"ws": arr(60, (40, 96, 1, 1)), "wt": arr(61, (24, 96, 1, 1)), "bt": arr(62, (24,))})
    nodes += [Node("Conv", [last, "ws"], ["down"], {"strides": [2, 2]}), Node("Conv", [last, "wt", "bt"], ["u"]),
              Node("Relu", ["u"], ["next"]), *tail]
    return make(nodes, {"x": (n, 48, *hw)}, consts, outputs=outputs or ["down", "next"])


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
def test_a_residual_stream_is_stored_in_pixel_panels(isa):
    """The stream (one buffer: each block adds onto it in place) is in panels and every conv touching it runs on
    sat_conv_pw; not where the stream is also a graph output, is read by another op (a MaxPool) or by an
    epilogue's Add that is not added in place, nor on the portable build or with sat_conv_pw turned off."""
    cfg = BuildConfig(isa=isa)
    emitted = emit(stage(), config=cfg)
    assert emitted.plan.panels == {"s0"} and {emitted.plan.root(f"s{k}") for k in range(3)} == {"s0"}
    calls = [line for line in emitted.source.splitlines() if line.strip().startswith("sat_conv_pw(")]
    flags = sorted(tuple(int(f) for f in line.split(",")[-3:-1]) for line in calls)
    assert flags == [(0, 1)] * 3 + [(1, 0)] * 4  # stream written thrice, read by 2 blocks and 2 convs after
    assert ", 2, 2, 0, 1, 0, pwconv" in emitted.source  # the strided conv gathers from the panels
    assert not emit(stage(outputs=["down", "next", "s2"]), config=cfg).plan.panels
    pooled = stage(tail=[Node("MaxPool", ["s2"], ["p"], {"kernel_shape": [2, 2], "strides": [2, 2]})],
                   outputs=["down", "next", "p"])
    assert not emit(pooled, config=cfg).plan.panels
    added = stage(tail=[Node("Conv", ["s2", "wt"], ["v"]), Node("Add", ["v", "next"], ["z"])],
                  outputs=["down", "z"])
    assert emit(added, config=cfg).plan.panels == {"s0"}  # the Add reads `next`, not the stream
    read_by_add = stage(blocks=1, tail=[Node("Conv", ["x", "wd"], ["v"]), Node("Add", ["v", "s1"], ["z"])],
                        outputs=["down", "next", "z"])
    assert not emit(read_by_add, config=cfg).plan.panels
    assert not emit(stage(), config=BuildConfig(isa="portable")).plan.panels
    assert not emit(stage(), config=BuildConfig(isa=isa, pw=False)).plan.panels


@pytest.mark.compiler
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n,hw", [(1, (47, 47)), (2, (48, 46)), (1, (40, 60))])
def test_a_stage_on_pixel_panels_matches_the_references(n, hw, threads, isa):
    """47x47 maps end on a panel of one pixel; 48x46 (two images) on whole panels of 32 (on AVX2 of 16); 40x60
    has panels crossing rows of 60 and a stride-2 output of 20x30 (600 pixels: a partial last panel of 32, a
    whole one of 16). (Maps of at least 2048 pixels: smaller ones put the 32 -> 96 convs on dconv.h's tiles on
    AVX-512, which do not write panels.)"""
    cfg = BuildConfig(isa=isa)
    g = stage(n, hw)
    assert emit(g, config=cfg).plan.panels == {"s0"}
    check_three_way(g, threads=threads, config=cfg)


def fan_out(n=1, hw=(40, 40)):
    """x -> 1x1 conv 48 -> 520 (s, in panels), read by convs of stride 2 and 4 with more than PW_MAXW weights
    (sat_conv2d's tiles, their im2col gathering from the panels; onto 10x10 the transposed product), by one of
    stride 2 to 64 channels (sat_conv_pw, writing t in panels too) and one of stride 1; t read by a 1x1 conv."""
    consts = {"w0": arr(1, (520, 48, 1, 1)), "b0": arr(2, (520,)), "w1": arr(3, (300, 520, 1, 1)),
              "w2": arr(4, (300, 520, 1, 1)), "w3": arr(5, (64, 520, 1, 1)), "w4": arr(6, (24, 520, 1, 1)),
              "w5": arr(7, (24, 64, 1, 1))}
    nodes = [Node("Conv", ["x", "w0", "b0"], ["c"]), Node("Relu", ["c"], ["s"]),
             Node("Conv", ["s", "w1"], ["y1"], {"strides": [2, 2]}), Node("Conv", ["s", "w2"], ["y2"], {"strides": [4, 4]}),
             Node("Conv", ["s", "w3"], ["t"], {"strides": [2, 2]}), Node("Conv", ["s", "w4"], ["y4"]),
             Node("Conv", ["t", "w5"], ["y5"])]
    return make(nodes, {"x": (n, 48, *hw)}, consts, outputs=["y1", "y2", "y4", "y5"])


@pytest.mark.compiler
@pytest.mark.skipif(not AVX512, reason="the CPU has no AVX-512")
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n,hw", [(1, (40, 40)), (2, (38, 42))])
def test_convs_of_large_weights_and_strided_writers_on_pixel_panels(n, hw, threads):
    cfg = BuildConfig(isa="avx512")
    g = fan_out(n, hw)
    emitted = emit(g, config=cfg)
    assert emitted.plan.panels == {"s", "t"}
    calls = [line.strip() for line in emitted.source.splitlines() if line.strip().startswith("sat_conv2d(")]
    assert len(calls) == 2 and all(line.split(",")[-2].strip() == "1" for line in calls)  # xpan
    assert {line.split(",")[-4].strip() for line in calls} == {"0", "1"}  # one transposed, one not
    check_three_way(g, threads=threads, config=cfg)


@pytest.mark.compiler
@pytest.mark.skipif(not AVX512, reason="the CPU has no AVX-512")
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n,hw", [(1, (28, 28)), (2, (27, 25))])
def test_a_strided_conv_on_64_channel_tiles_gathers_its_pixels_from_panels(n, hw, threads):
    """fan_out's stride-2 conv to 320 channels (five 64-channel panels) onto at most 196 pixels runs on the
    6 x 64 direct tiles (plan.direct_width), gathering its pixels from the panels (sat_gather_plane); the panels
    stay."""
    cfg = BuildConfig(isa="avx512")
    g = fan_out(n, hw)
    g.constants["w1"] = arr(3, (320, 520, 1, 1))
    emitted = emit(g, config=cfg)
    assert emitted.plan.panels == {"s", "t"}
    calls = [line.strip() for line in emitted.source.splitlines() if line.strip().startswith("sat_conv_direct(")]
    assert len(calls) == 1 and [v.strip() for v in calls[0].split(",")[-4:-2]] == ["64", "1"]  # width, xpan
    check_three_way(g, threads=threads, config=cfg)


@pytest.mark.compiler
@pytest.mark.skipif(" avx2 " not in CPU_FLAGS, reason="the CPU has no AVX2")
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n,hw", [(1, (48, 48)), (2, (38, 42))])
def test_avx2_convs_of_large_weights_read_pixel_panels_in_channel_blocks(n, hw, threads):
    """The AVX2 build has no other kernel reading panels: sat_conv_pw runs every conv touching them, weights of
    more than PW_MAXW floats in channel blocks (520 -> 300 of strides 2 and 4: two blocks; 520 -> 400 of stride 1
    reading the panels in place: three), each block gathering or reading its pixels again; not onto fewer than
    PW_BLOCK_MINPANELS panels (a 24x24 map: 36 pixels of stride 4, three panels), whose blocks would come from
    memory each time."""
    cfg = BuildConfig(isa="avx2")

    def graph(n, hw):
        g = fan_out(n, hw)
        g.constants["w6"] = arr(9, (400, 520, 1, 1))
        g.nodes.append(Node("Conv", ["s", "w6"], ["y6"], name="n7"))
        g.outputs.append("y6")
        return g

    assert not emit(graph(1, (24, 24)), config=cfg).plan.panels
    g = graph(n, hw)
    emitted = emit(g, config=cfg)
    assert emitted.plan.panels == {"s", "t"}
    calls = [line.strip() for line in emitted.source.splitlines() if line.strip().startswith("sat_conv")]
    assert len(calls) == 7 and all(line.startswith("sat_conv_pw(") for line in calls)
    check_three_way(g, threads=threads, config=cfg)


@pytest.mark.compiler
@pytest.mark.skipif(not AVX512, reason="the CPU has no AVX-512")
def test_a_strided_conv_whose_epilogue_has_no_row_form_gathers_panels_on_the_tiles():
    """A stride-2 conv reading panels with an epilogue sat_conv_pw has no row form for (a per-pixel operand of
    another shape, read by a gather) runs on sat_conv2d's tiles, gathering the panels in its im2col."""
    g = fan_out()
    g.constants["q"] = arr(8, (1, 1, 1, 20))
    g.nodes[4] = Node("Conv", ["s", "w3"], ["t0"], {"strides": [2, 2]})
    g.nodes.insert(5, Node("Mul", ["t0", "q"], ["t"]))
    cfg = BuildConfig(isa="avx512")
    emitted = emit(g, config=cfg)
    assert emitted.plan.panels == {"s"}
    assert sum(line.strip().startswith("sat_conv2d(") for line in emitted.source.splitlines()) == 3
    check_three_way(g, threads=2, config=cfg)


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
def test_panels_only_for_images_of_fewer_than_2_31_floats(isa):
    """The kernels' gathers index an image's panels with 32-bit offsets: a 2048-channel 1024x1024 map (2^31
    floats) stays N x C x H x W, a 64-channel 64x64 one takes panels."""
    def graph(c, hw):
        consts = {"w0": arr(1, (c, 48, 1, 1)), "w1": arr(2, (16, c, 1, 1))}
        nodes = [Node("Conv", ["x", "w0"], ["s0"]), Node("Relu", ["s0"], ["s"]), Node("Conv", ["s", "w1"], ["y"])]
        return make(nodes, {"x": (1, 48, *hw)}, consts)

    cfg = BuildConfig(isa=isa)
    assert emit(graph(64, (64, 64)), config=cfg).plan.panels == {"s"}
    assert not emit(graph(2048, (1024, 1024)), config=cfg).plan.panels
