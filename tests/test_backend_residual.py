"""C backend: convs that add their sums onto a residual in place (plan.in_place_residual): the step's output
takes the residual's storage and the kernel accumulates onto it, the chain's leading Add left out. The planner
cases (which steps do, which must not), then each accumulating kernel against the reference interpreter and
ONNX Runtime, on one thread and two. The AVX-512 build's direct tiles (dconv.h) take the residual's storage too
but keep the Add, in the vector epilogue of their stores."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from backend_util import check_three_way, make
from saturate.backend.build import BuildConfig
from saturate.backend.emit import emit
from saturate.backend.shapes import conv_window
from saturate.core.ir import Node

CPU_FLAGS = Path("/proc/cpuinfo").read_text().replace("\n", " ")


def arr(seed: int, shape) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def block(xshape, wshape, attrs=None, group=1, tail=(), outputs=None):
    """y = Relu(Conv(x) + b + r), r = Relu(s) a workspace value (after the conv in node order, so the Add joins
    the conv's step, as a ResNet's identity, read by two nodes, never joins its producer's), then `tail`."""
    attrs = {**(attrs or {}), **({"group": group} if group > 1 else {})}
    consts = {"w": arr(3, wshape) * np.float32(0.2), "b": arr(4, (wshape[0],))}
    conv = Node("Conv", ["x", "w", "b"], ["c"], attrs)
    win = conv_window(conv, xshape, wshape)
    rshape = (xshape[0], wshape[0], win.oh, win.ow)
    nodes = [conv, Node("Relu", ["s"], ["r"]), Node("Add", ["c", "r"], ["a"]), Node("Relu", ["a"], ["y"]), *tail]
    return make(nodes, {"x": xshape, "s": rshape}, consts, outputs=outputs)


def conv_step(graph, cfg):
    emitted = emit(graph, config=cfg)
    return next(s for s in emitted.plan.steps if s.anchor.op == "Conv"), emitted


def test_planner_adds_a_conv_onto_its_residual_in_place():
    """The residual's storage is the output's (one buffer fewer); not where the residual is read again, is a
    graph input or output, is the conv's own input, or where the chain reads the conv's sums again, nor on
    kernels that do not accumulate (depthwise)."""
    cfg = BuildConfig(isa="avx2")
    g = block((1, 128, 20, 20), (96, 128, 1, 1))
    step, emitted = conv_step(g, cfg)
    assert step.accumulates == "r" and emitted.plan.root("y") == "r"
    assert [n.op for n in step.chain] == ["Add", "Relu"]
    assert ", 1, 0, 0, pwconv_" in emitted.source  # sat_conv_pw's accumulate flag, before its panel flags
    kept = block((1, 128, 20, 20), (96, 128, 1, 1), outputs=["y", "r"])
    step, other = conv_step(kept, cfg)
    assert not step.accumulates and other.plan.arena_bytes > emitted.plan.arena_bytes
    again = block((1, 128, 20, 20), (96, 128, 1, 1), tail=[Node("Add", ["y", "r"], ["z"])])
    assert not conv_step(again, cfg)[0].accumulates
    sums_again = block((1, 128, 20, 20), (96, 128, 1, 1), tail=[Node("Mul", ["y", "c"], ["z"])])
    assert not conv_step(sums_again, cfg)[0].accumulates
    own_input = make([Node("Relu", ["s"], ["r"]), Node("Conv", ["r", "w"], ["c"]), Node("Add", ["c", "r"], ["y"])],
                     {"s": (1, 96, 20, 20)}, {"w": arr(5, (96, 96, 1, 1))})
    assert not conv_step(own_input, cfg)[0].accumulates
    graph_input = make([Node("Conv", ["x", "w"], ["c"]), Node("Add", ["c", "s"], ["y"])],
                       {"x": (1, 128, 20, 20), "s": (1, 96, 20, 20)}, {"w": arr(6, (96, 128, 1, 1))})
    assert not conv_step(graph_input, cfg)[0].accumulates
    depthwise = block((1, 32, 20, 20), (32, 1, 3, 3), {"pads": [1, 1, 1, 1]}, group=32)
    assert not conv_step(depthwise, cfg)[0].accumulates


# (input shape, weight shape, the kernel's call in the emitted C, sat_conv_pw allowed). The AVX2 build runs plain
# 1x1 convs on sat_conv_pw's 6 x 16 tiles up to PW_MAXW weights and PW_ACC_MAXB of output (one reduction block,
# whole panels; two blocks, 70 = 11 x 6 + 4 rows; two images, a last panel of 13 pixels), more output (2.4 MB),
# more weights or maps of fewer than 256 pixels on pgemm.h's tile; with sat_conv_pw turned off, the kernels
# before it.
AVX2_CASES = [
    ((1, 128, 20, 20), (96, 128, 1, 1), "sat_conv_pw(", True),
    ((1, 300, 16, 17), (70, 300, 1, 1), "sat_conv_pw(", True),
    ((2, 100, 15, 19), (26, 100, 1, 1), "sat_conv_pw(", True),
    ((1, 128, 48, 48), (256, 128, 1, 1), "sat_conv_packed(", True),
    ((1, 1024, 9, 9), (140, 1024, 1, 1), "sat_conv_packed(", True),  # two channel blocks, four reduction blocks
    ((1, 128, 20, 20), (96, 128, 1, 1), "sat_conv_packed(", False),  # input planes read in place, 25 whole panels
    ((2, 100, 10, 11), (26, 100, 1, 1), "sat_conv_packed(", True),   # a packed last panel, 26 = 4 x 6 + 2, 2 images
    ((1, 64, 20, 20), (70, 64, 1, 1), "sat_conv2d(", False),         # sat_gemm_nn: a partial 24-wide panel, 70 rows
    ((1, 80, 12, 12), (40, 80, 1, 1), "sat_conv2d(", False),         # sgemm onto its output (beta 1)
]


def check_block(g, cfg: BuildConfig, how: str, kernel: str, threads: int) -> None:
    """The conv step of `g` takes the residual's storage (`how`: the Step field naming it) on `kernel`, and the
    build of `cfg` matches the interpreter and ONNX Runtime."""
    step, emitted = conv_step(g, cfg)
    assert getattr(step, how) == "r" and kernel in emitted.source
    check_three_way(g, threads=threads, config=cfg)


# AVX-512 builds run plain 1x1 convs over more than 256 KB of input on the packed product: sat_conv_pw's pixel
# panels (one reduction block; two blocks, three panels: split by channels too at 2 threads) up to PW_MAXW
# packed weights and PW_ACC_MAXB of output, else sat_conv2d's tiles: more output (2.4 MB), one reduction block
# (channel panels outer), two blocks (pixel panels outer), two blocks with weights of more than 2^18 floats.
AVX512_CASES = [((1, 72, 31, 31), (70, 72, 1, 1), "sat_conv_pw(", True),
                ((1, 700, 8, 12), (100, 700, 1, 1), "sat_conv_pw(", True), ((1, 72, 48, 48), (256, 72, 1, 1), "sat_conv2d(", True),
                ((1, 200, 24, 23), (700, 200, 1, 1), "sat_conv2d(", True),
                ((1, 300, 16, 16), (440, 300, 1, 1), "sat_conv2d(", True),
                ((1, 600, 12, 12), (440, 600, 1, 1), "sat_conv2d(", True)]


@pytest.mark.compiler
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("isa,xshape,wshape,kernel,pw", [
    *(pytest.param("avx2", *case, marks=pytest.mark.skipif(" avx2 " not in CPU_FLAGS, reason="the CPU has no AVX2"))
      for case in AVX2_CASES),
    *(pytest.param("avx512", *case, marks=pytest.mark.skipif(" avx512f " not in CPU_FLAGS,
                                                            reason="the CPU has no AVX-512"))
      for case in AVX512_CASES)])
def test_kernels_add_onto_the_residual(isa, xshape, wshape, kernel, pw, threads):
    check_block(block(xshape, wshape), BuildConfig(isa=isa, pw=pw), "accumulates", kernel, threads)


@pytest.mark.compiler
@pytest.mark.skipif(" avx2 " not in CPU_FLAGS, reason="the CPU has no AVX2")
def test_a_chain_of_residual_blocks_each_adding_onto_the_last():
    """Three blocks, each adding onto the previous block's output (itself stored in the first residual's
    buffer), on the avx2 build (its tile reads 96 channels in place and accumulates, on any CPU with AVX2;
    the AVX-512 build runs convs of this size on dconv.h, which does not)."""
    consts, nodes = {}, [Node("Relu", ["s"], ["r0"])]
    for k in range(3):
        consts[f"w{k}"] = arr(10 + k, (96, 96, 1, 1)) * np.float32(0.2)
        nodes += [Node("Conv", [f"r{k}", f"w{k}"], [f"c{k}"]), Node("Relu", [f"c{k}"], [f"h{k}"]),
                  Node("Conv", [f"h{k}", f"w{k}"], [f"d{k}"]), Node("Add", [f"d{k}", f"r{k}"], [f"a{k}"]),
                  Node("Relu", [f"a{k}"], [f"r{k + 1}"])]
    g = make(nodes, {"s": (1, 96, 24, 24)}, consts)
    cfg = BuildConfig(isa="avx2")
    emitted = emit(g, config=cfg)
    accumulating = [s for s in emitted.plan.steps if s.accumulates]
    assert len(accumulating) == 3 and {emitted.plan.root(s.out) for s in accumulating} == {"r0"}
    check_three_way(g, threads=2, config=cfg)


def test_avx512_direct_tiles_take_the_residuals_storage():
    """On dconv.h's tiles the output takes the residual's storage and the epilogue keeps its Add (the tiles
    read each residual element where they store its sum); not where anything but Relus follows the Add, nor
    on the AVX2 build's tiles, whose epilogue with a residual runs after their stores."""
    cfg = BuildConfig(isa="avx512")
    g = block((1, 64, 14, 14), (256, 64, 1, 1))
    step, emitted = conv_step(g, cfg)
    assert step.shares == "r" and not step.accumulates and emitted.plan.root("y") == "r"
    assert [n.op for n in step.chain] == ["Add", "Relu"] and "sat_conv_direct(" in emitted.source
    kept = block((1, 64, 14, 14), (256, 64, 1, 1), outputs=["y", "r"])
    step, other = conv_step(kept, cfg)
    assert not step.shares and other.plan.arena_bytes > emitted.plan.arena_bytes
    sigmoid = make([Node("Conv", ["x", "w", "b"], ["c"]), Node("Relu", ["s"], ["r"]), Node("Add", ["c", "r"], ["a"]),
                    Node("Sigmoid", ["a"], ["y"])], {"x": (1, 64, 14, 14), "s": (1, 256, 14, 14)},
                   {"w": arr(3, (256, 64, 1, 1)), "b": arr(4, (256,))})
    assert not conv_step(sigmoid, cfg)[0].shares
    step, emitted = conv_step(block((1, 96, 7, 7), (64, 96, 1, 1)), BuildConfig(isa="avx2"))
    assert not step.shares and not step.accumulates and "sat_conv_direct(" in emitted.source


# dconv.h's tiles: a 1x1 conv in 8-pixel rows over two 32-channel panels and a tail of 8; a padded 3x3 (its
# input copied); 6 pixel x 64 channel tiles (a 7x7 map, and a 14x14 one over two 64-channel panels); a map
# whose planes are a multiple of 2 KB (outputs staged, the epilogue at the flush); two images.
DIRECT_CASES = [((1, 64, 14, 14), (72, 64, 1, 1), {}), ((1, 24, 13, 11), (40, 24, 3, 3), {"pads": [1, 1, 1, 1]}),
                ((1, 96, 7, 7), (64, 96, 1, 1), {}), ((1, 16, 14, 14), (128, 16, 3, 3), {"pads": [1, 1, 1, 1]}),
                ((1, 16, 16, 32), (32, 16, 3, 3), {"pads": [1, 1, 1, 1]}),
                ((2, 32, 9, 9), (48, 32, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]})]


@pytest.mark.compiler
@pytest.mark.skipif(" avx512f " not in CPU_FLAGS, reason="the CPU has no AVX-512")
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("xshape,wshape,attrs", DIRECT_CASES)
def test_avx512_direct_tiles_add_the_residual_in_its_storage(xshape, wshape, attrs, threads):
    check_block(block(xshape, wshape, attrs), BuildConfig(isa="avx512"), "shares", "sat_conv_direct(", threads)
