"""C backend, planning stage: fuse elementwise epilogues into kernels and place buffers by liveness."""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from saturate.backend.build import KERNELS_DIR, BuildConfig
from saturate.backend.shapes import (ALIASES, ELEMENTWISE_BINARY, ELEMENTWISE_UNARY, conv_window, reduce_axes,
                                      slice_params)
from saturate.core.errors import SaturateError
from saturate.core.ir import Graph, Node

ALIGN = 64


def c_constants() -> dict[str, int]:
    """The kernels' integer constants (`#define SAT_NAME 123` in the headers), which the planner and emitter
    size tiles and pack weights by: the C is their one source. A name defined with different values (per
    instruction set, as SAT_VL) is left out."""
    found: dict[str, int] = {}
    varies: set[str] = set()
    for path in sorted(KERNELS_DIR.glob("*.h")):
        for name, value in re.findall(r"^#define (SAT_\w+) (\d+)\b", path.read_text(), re.M):
            if found.setdefault(name, int(value)) != int(value):
                varies.add(name)
    return {name: value for name, value in found.items() if name not in varies}


C = c_constants()
# Bytes of one im2col tile (sat_tile_rows in kernels.c).
TILE_BYTES = C["SAT_TILE_BYTES"]
# Convs with at most this many output pixels, and at least this reduction length, run as dot products
# of their transposed columns (sat_conv_dot, vec.h).
DOT_MAXP, DOT_MINK = C["SAT_DOT_MAXP"], C["SAT_DOT_MINK"]
# Products of at most this many rows against B as stored run on sat_skinny_nn (vec.h).
SKINNY = C["SAT_SKINNY"]
# Kernels whose output loop can apply an epilogue while the row is still in cache.
_HOST_KERNELS = frozenset({"Conv", "Gemm", "MatMul", "MaxPool", "AveragePool", "GlobalAveragePool",
                           "BatchNormalization", "LayerNormalization"})


def hosts_epilogue(op: str) -> bool:
    """Whether a kernel of `op` can apply an epilogue; the pointwise sets are the registry's live ones, so
    an op registered after import counts too."""
    return op in _HOST_KERNELS or op in ELEMENTWISE_UNARY or op in ELEMENTWISE_BINARY


def joins_epilogue(op: str) -> bool:
    """Whether `op` is pointwise on its first (data) operand and so can ride along as an epilogue."""
    return op == "BatchNormalization" or op in ELEMENTWISE_UNARY or op in ELEMENTWISE_BINARY


@dataclass
class Step:
    """One kernel call: an anchor node, the elementwise nodes fused after it, and the value written."""

    anchor: Node
    chain: list[Node] = field(default_factory=list)
    out: str = ""
    # A pattern of several nodes run as one kernel (the anchor last): its name, the nodes inside it, and
    # the values the kernel reads.
    pattern: str = ""
    inner: list[Node] = field(default_factory=list)
    operands: tuple[str, ...] = ()
    # A Softmax over the last axis run on the output's rows after the chain (see _row_softmax).
    softmax: Node | None = None
    # The residual a conv adds its sums onto in place, its chain's leading Add then left out: the step's
    # output takes that value's storage (see in_place_residual).
    accumulates: str = ""
    # The residual whose storage the output takes while the epilogue still adds it, each output read and
    # written by the one tile that makes it (dconv.h's vector epilogue; see in_place_residual).
    shares: str = ""

    def nodes(self) -> list[Node]:
        return [*self.inner, self.anchor, *self.chain, *([self.softmax] if self.softmax else [])]

    def reads(self) -> list[str]:
        """Every value the fused kernel reads (the chain's own intermediates excluded)."""
        inner = {n.outputs[0] for n in self.nodes()}
        return [i for n in self.nodes() for i in n.inputs if i and i not in inner]


@dataclass
class Plan:
    """Schedule of fused steps plus the static placement of every intermediate buffer."""

    steps: list[Step]
    alias: dict[str, str]          # value -> value whose storage it shares (a view: Reshape, Flatten...)
    offsets: dict[str, int]        # storage root -> byte offset in the arena
    arena_bytes: int
    scratch_bytes: int             # im2col columns, live only inside one conv
    naive_bytes: int               # what one buffer per intermediate would take
    # Roots stored in pixel panels (see panel_roots): image n, pixel p, channel c of an N x C x H x W value at
    # ((n * Q + p / R) * C + c) * R + p % R, Q = ceil(H * W / R), R = panel_pixels (the build's sat_conv_pw tile).
    panels: set[str] = field(default_factory=set)
    panel_pixels: int = 1

    @property
    def peak_bytes(self) -> int:
        """Peak workspace: the arena plus the conv scratch."""
        return self.arena_bytes + self.scratch_bytes

    def root(self, value: str) -> str:
        while value in self.alias:
            value = self.alias[value]
        return value

    def floats(self, root: str, shape: tuple[int, ...]) -> int:
        """Floats a root's storage holds: pixel panels round each image's pixels up to whole panels."""
        if root in self.panels:
            r = self.panel_pixels
            return shape[0] * shape[1] * -(-shape[2] * shape[3] // r) * r
        return math.prod(shape)


def _fusible(step: Step, value: str, user: Node, shapes: dict) -> bool:
    """Whether `user` can be applied pointwise to `value` inside the step's output loop."""
    if not joins_epilogue(user.op) or shapes[user.outputs[0]] != shapes[value]:
        return False
    if user.op in ELEMENTWISE_BINARY:
        return True
    # Unary ops, Clip and BatchNormalization read the chain value as their data input only.
    return user.inputs[0] == value and value not in user.inputs[1:]


def _rotary_table(graph: Graph, value: str, x: tuple[int, ...]) -> bool:
    """Whether `value` is a constant of shape (1, ..., 1, S, D) or (1, ..., 1, D) against x (..., S, D)."""
    if value not in graph.constants or graph.constants[value].dtype.kind != "f":
        return False
    t = graph.constants[value].shape
    return (0 < len(t) <= len(x) and t[-1] == x[-1] and all(d == 1 for d in t[:-2])
            and (len(t) < 2 or t[-2] in (1, x[-2])))


def rotary(graph: Graph, add: Node, producers: dict, consumers: dict, outputs: set,
           shapes: dict) -> tuple[list[Node], tuple[str, str, str]] | None:
    """The rotary position embedding ending at `add`, as exporters write it:
    Add(Mul(x, cos), Mul(Concat(Neg(Slice(x, D/2:)), Slice(x, :D/2), axis=-1), sin)), cos and sin constant
    tables over the last two axes. Returns the nodes before `add` and (x, cos, sin), or None when `add`
    is not one or a value inside it is read elsewhere. When x is a Transpose's output read by these nodes
    alone, and the last axis stays last, the Transpose is one of the nodes and its input stands for x."""
    def made(value, op):
        node = producers.get(value)
        if node is None or node.op != op or value in outputs or len(consumers.get(value, [])) != 1:
            return None
        return node

    if add.op != "Add" or len(add.inputs) != 2:
        return None
    for first, second in (add.inputs, reversed(add.inputs)):
        mc, ms = made(first, "Mul"), made(second, "Mul")
        if mc is None or ms is None:
            continue
        for r, sin in (ms.inputs, reversed(ms.inputs)):
            cat = made(r, "Concat")
            if cat is None or len(cat.inputs) != 2:
                continue
            neg, low = made(cat.inputs[0], "Neg"), made(cat.inputs[1], "Slice")
            high = made(neg.inputs[0], "Slice") if neg is not None else None
            if low is None or high is None or low.inputs[0] != high.inputs[0]:
                continue
            x = low.inputs[0]
            if x not in mc.inputs or x in graph.constants:
                continue
            cos = mc.inputs[1] if mc.inputs[0] == x else mc.inputs[0]
            xs = shapes.get(x)
            if (not xs or len(xs) < 2 or xs[-1] % 2 or int(cat.attr("axis", 0)) % len(xs) != len(xs) - 1
                    or any(shapes.get(v) != xs for v in (add.outputs[0], first, second, r))
                    or not _rotary_table(graph, cos, xs) or not _rotary_table(graph, sin, xs)
                    or graph.constants[cos].shape != graph.constants[sin].shape):
                continue
            half = xs[-1] // 2
            whole = [(0, 1, n) for n in xs[:-1]]
            try:
                if (slice_params(graph, low, xs) != whole + [(0, 1, half)]
                        or slice_params(graph, high, xs) != whole + [(half, 1, half)]):
                    continue
            except SaturateError:
                continue
            inner = [mc, high, neg, low, cat, ms]
            # A transpose making x (the heads' split) is read through: the kernel takes x's rows in place.
            t = producers.get(x)
            if (t is not None and t.op == "Transpose" and x not in outputs
                    and {id(n) for n in consumers.get(x, [])} == {id(mc), id(high), id(low)}):
                perm = list(t.attr("perm") or reversed(range(len(xs))))
                if perm[-1] == len(xs) - 1:
                    return [t, *inner], (t.inputs[0], cos, sin)
            return inner, (x, cos, sin)
    return None


def rms_norm(graph: Graph, div: Node, producers: dict, consumers: dict, outputs: set,
             shapes: dict) -> tuple[list[Node], tuple[str, float]] | None:
    """The RMSNorm ending at `div`, as exporters write it: Div(x, Sqrt(Add(ReduceMean(Pow(x, 2)), eps))), the
    mean over the last axis kept, eps a constant. Returns the nodes before `div` and (x, eps), or None when
    `div` is not one or a value inside it is read elsewhere."""
    def made(value, ops):
        node = producers.get(value)
        if node is None or node.op not in ops or value in outputs or len(consumers.get(value, [])) != 1:
            return None
        return node

    def scalar(value, kinds="f"):
        arr = graph.constants.get(value)
        return float(arr.reshape(-1)[0]) if arr is not None and arr.size == 1 and arr.dtype.kind in kinds else None

    if div.op != "Div" or len(div.inputs) != 2:
        return None
    x, xs = div.inputs[0], shapes.get(div.inputs[0])
    root = made(div.inputs[1], ("Sqrt",))
    add = made(root.inputs[0], ("Add",)) if root is not None else None
    if add is None or not xs or x in graph.constants or shapes.get(div.outputs[0]) != xs:
        return None
    mean, eps = add.inputs if scalar(add.inputs[1]) is not None else reversed(add.inputs)
    mean, eps = made(mean, ("ReduceMean",)), scalar(eps)
    square = made(mean.inputs[0], ("Pow", "Mul")) if mean is not None else None
    if square is None or eps is None or shapes.get(square.outputs[0]) != xs:
        return None
    if square.op == "Pow" and (square.inputs[0] != x or scalar(square.inputs[1], "fiu") != 2.0):
        return None
    if square.op == "Mul" and list(square.inputs) != [x, x]:
        return None
    try:
        if reduce_axes(graph, mean, xs) != ([len(xs) - 1], True):
            return None
    except SaturateError:
        return None
    return [square, mean, add, root], (x, eps)


def transposed_operands(graph: Graph, mm: Node, producers: dict, consumers: dict, outputs: set,
                        shapes: dict) -> tuple[list[Node], tuple[str, str]] | None:
    """A batched MatMul (B of rank 3 or more) reading an operand through a Transpose that only it reads:
    attention's heads split by Transpose (1, S, H, D) -> (1, H, S, D) for Q and V, and K^T by (0, 2, 3, 1) or
    (0, 1, 3, 2). The product reads the Transpose's input in place (sat_matmul_batched's row pitches and
    transposed B), so the copy is not made. A qualifies when its rows stay contiguous (the last axis stays
    last); B when its rows or its columns do. Returns the Transposes and (A's value, B's value) as read."""
    if mm.op != "MatMul" or len(mm.inputs) != 2:
        return None
    a, b = mm.inputs
    sa, sb = shapes.get(a), shapes.get(b)
    if not sa or not sb or len(sa) < 2 or len(sb) < 3:
        return None
    found, reads = [], []
    for value, shape, contiguous in ((a, sa, (-1,)), (b, sb, (-1, -2))):
        t = producers.get(value)
        if (t is not None and t.op == "Transpose" and a != b and value not in outputs
                and [id(n) for n in consumers.get(value, [])] == [id(mm)]):
            perm = list(t.attr("perm") or reversed(range(len(shape))))
            if len(perm) == len(shape) and any(perm[d] == len(shape) - 1 for d in contiguous):
                found.append(t)
                reads.append(t.inputs[0])
                continue
        reads.append(value)
    if not found:
        return None
    return found, (reads[0], reads[1])


# Products whose epilogue may read a value of its own chain again (a GELU's x * f(x)): their epilogues are
# the scalar loop of emit.pointwise, which keeps such values in locals (the kernels with vector epilogue forms
# have no place for them).
_DIAMOND_HOSTS = frozenset({"Gemm", "MatMul"})


def _diamond(step: Step, value: str, users: list[Node], consumers: dict, outputs: set, absorbed: set,
             shapes: dict) -> list[Node] | None:
    """The pointwise nodes from one user of `value` on, each the single user of the one before, up to the
    last of the other users of `value`, each of which reads `value` and the chain value (GELU: x / sqrt 2, erf,
    + 1, then x * that); None when the users do not close so. Those nodes then run in the step's epilogue,
    `value` in a local, where the chain stopped at `value` and wrote it for a step of its own."""
    for first in users:
        if id(first) in absorbed or not _fusible(step, value, first, shapes):
            continue
        path, cur, waiting = [first], first, {id(u) for u in users} - {id(first)}
        while waiting:
            out = cur.outputs[0]
            nxt = consumers.get(out, [])
            if out in outputs or len(nxt) != 1 or id(nxt[0]) in absorbed or not _fusible(step, out, nxt[0], shapes):
                break
            cur = nxt[0]
            if id(cur) in waiting:
                if cur.op not in ELEMENTWISE_BINARY or sorted(cur.inputs) != sorted([value, out]):
                    break
                waiting.discard(id(cur))
            elif value in cur.inputs:
                break
            path.append(cur)
        if not waiting:
            return path
    return None


def _row_softmax(graph: Graph, step: Step, value: str, users: list[Node], outputs: set, absorbed: set,
                 shapes: dict) -> Node | None:
    """The Softmax that is the only reader of a batched MatMul step's output `value` and normalizes its last
    axis (attention's probabilities): sat_matmul_batched then runs it on each block of rows it has just made,
    while they are in cache."""
    node = step.anchor
    if (node.op != "MatMul" or step.pattern not in ("", "bmm_views") or value in outputs or len(users) != 1
            or id(users[0]) in absorbed or users[0].op != "Softmax"):
        return None
    sm, shape = users[0], shapes.get(value)
    b = shapes.get(node.inputs[1])
    if not shape or not b or len(b) < 3 or min(shape) < 1 or shapes.get(sm.outputs[0]) != shape:
        return None
    axis = sm.attr("axis", -1 if graph.opset >= 13 else 1)
    return sm if axis % len(shape) == len(shape) - 1 else None


# Patterns of several nodes run as one kernel, by the op of their last node.
PATTERNS = {"Add": ("rotary", rotary), "Div": ("rms_norm", rms_norm), "MatMul": ("bmm_views", transposed_operands)}


def fuse(graph: Graph, shapes: dict[str, tuple[int, ...]]) -> tuple[list[Step], dict[str, str]]:
    """Group nodes into steps: a value with exactly one consumer that is pointwise on it is fused.

    Steps run at the position of their last node, so every operand a fused node reads exists.
    """
    consumers = graph.consumers()
    outputs = set(graph.outputs)
    index = {id(n): k for k, n in enumerate(graph.nodes)}
    alias: dict[str, str] = {}
    absorbed: set[int] = set()
    placed: list[tuple[int, Step]] = []
    producers = graph.producers()
    patterns: dict[int, Step] = {}
    for node in graph.nodes:
        name, match = PATTERNS.get(node.op, ("", None))
        found = match(graph, node, producers, consumers, outputs, shapes) if match else None
        if found and not any(id(n) in absorbed for n in found[0]):
            patterns[id(node)] = Step(node, pattern=name, inner=found[0], operands=found[1])
            absorbed.update(id(n) for n in found[0])
    for node in graph.nodes:
        if node.op in ALIASES:
            alias[node.outputs[0]] = node.inputs[0]
            continue
        if id(node) in absorbed:
            continue
        step = patterns.get(id(node)) or Step(node)
        tail = node
        while hosts_epilogue(node.op):
            value = tail.outputs[0]
            users = consumers.get(value, [])
            if len(users) > 1 and node.op in _DIAMOND_HOSTS and value not in outputs:
                path = _diamond(step, value, users, consumers, outputs, absorbed, shapes)
                if path:
                    step.chain += path
                    absorbed.update(id(n) for n in path)
                    tail = path[-1]
                    continue
            if (value in outputs or len(users) != 1 or id(users[0]) in absorbed
                    or not _fusible(step, value, users[0], shapes)):
                step.softmax = _row_softmax(graph, step, value, users, outputs, absorbed, shapes)
                if step.softmax:
                    tail = step.softmax
                    absorbed.add(id(tail))
                break
            tail = users[0]
            step.chain.append(tail)
            absorbed.add(id(tail))
        step.out = tail.outputs[0]
        placed.append((index[id(tail)], step))
    placed.sort(key=lambda p: p[0])
    return [s for _, s in placed], alias


def _nbytes(floats: int) -> int:
    return (floats * 4 + ALIGN - 1) // ALIGN * ALIGN


# Largest output (pixels) of a strided 1x1 conv that sat_conv_direct runs on its gathered input (dconv.h);
# on the 6 x 64 tiles (direct_width) every strided 1x1 conv is gathered.
GATHER_MAXP = C["SAT_GATHER_MAXP"]

# Output channels per weight panel of the AVX-512 direct tiles on small maps (dconv.h's sat_dconv_tile64), and
# the most output pixels they take. ResNet-50 at 224x224, AVX-512 build, 1 thread, per-step medians on the Xeon
# (family 6 model 167), two runs side by side on its two cores: 7x7 maps' 3x3 convs of 512 channels 1.56-1.69 ->
# 1.47-1.64 ms and 1x1 convs 0.74-0.79 -> 0.71-0.73, 14x14's 256 -> 1024 with the residual 0.68-0.72 -> 0.64-0.68;
# on 56x56 maps the 3x3 convs of 64 channels ran 1.38-1.43 -> 1.42-1.61 and the stem 1.50-1.53 -> 1.56-1.65, on
# 28x28 level.
DIRECT_WIDE, DIRECT_WIDE_MAXP = 64, 256


def direct_width(node: Node, shapes: dict, cfg: BuildConfig) -> int:
    """Channels per weight panel of a conv on the AVX-512 direct tiles: DIRECT_WIDE (6 pixel x 64 channel
    tiles) where its groups have a multiple of 64 output channels and its map at most DIRECT_WIDE_MAXP pixels,
    else SAT_NR (8 x 32)."""
    x, w = shapes[node.inputs[0]], shapes[node.inputs[1]]
    win = conv_window(node, x, w)
    mg = w[0] // int(node.attr("group", 1))
    return DIRECT_WIDE if cfg.packed_gemm and mg % DIRECT_WIDE == 0 and win.oh * win.ow <= DIRECT_WIDE_MAXP else C["SAT_NR"]


def direct_scratch(node: Node, shapes: dict, width: int = 0) -> int:
    """Floats of scratch sat_conv_direct (dconv.h) needs on panels of `width` channels: the offset table and
    the zero-padded input of one (image, group); mirrors its geometry."""
    x, w = shapes[node.inputs[0]], shapes[node.inputs[1]]
    win = conv_window(node, x, w)
    h, wd = (x[2], x[3]) if len(x) == 4 else (1, x[-1])
    cg = x[1] // int(node.attr("group", 1))
    hp, wq = (win.oh - 1) * win.sh + (win.kh - 1) * win.dh + 1, (win.ow - 1) * win.sw + (win.kw - 1) * win.dw + 1
    k = cg * win.kh * win.kw
    if (win.kh == win.kw == 1 and (win.sh > 1 or win.sw > 1)
            and (win.oh * win.ow <= GATHER_MAXP or width == DIRECT_WIDE)):
        return -(-k // 16) * 16 + cg * win.oh * win.ow  # the gathered pixels of a strided 1x1 conv
    inplace = win.ph == 0 and win.pw == 0 and hp <= h and wq <= wd
    return -(-k // 16) * 16 + (0 if inplace else cg * hp * wq)


@functools.cache
def _cpu_has_avx2() -> bool:
    try:
        return " avx2 " in Path("/proc/cpuinfo").read_text().replace("\n", " ")
    except OSError:
        return False


# Largest output (pixels) of a unit-stride conv on the AVX2 direct tiles; a 1x1 conv runs there if it reduces
# over at least DIRECT8_ONE_MINK channels or has at most DIRECT8_ONE_MAXW weights (direct_avx2).
DIRECT8_MAXP, DIRECT8_ONE_MINK, DIRECT8_ONE_MAXW = 64, 512, 131072


def direct_avx2(node: Node, shapes: dict, constants, cfg: BuildConfig) -> bool:
    """Whether a conv runs on the AVX2 direct tiles of dconv8.h (builds with AVX2 but not AVX-512): constant
    weights, not depthwise, offsets within 32 bits; kxk windows with a stride or on at most DIRECT8_MAXP
    output pixels, and 1x1 windows of unit stride on 13 to DIRECT8_MAXP pixels reducing over at least
    DIRECT8_ONE_MINK channels or of at most DIRECT8_ONE_MAXW weights. Builds that force a kernel
    (cfg.conv_layout, wino="all") keep it, and
    cfg.direct off keeps every conv off these tiles.

    Per-step CPU time at 1 thread, the avx2 build on a Zen 4 (medians of 15-25 interleaved runs, shared
    host): strided convs ran 0.57-0.84x the time of their kernels before (ResNet-50's 3x3 stride-2 convs
    on 24x24 and 12x12 maps 0.67 -> 0.56 and 0.69 -> 0.52 ms, from OpenBLAS and the transposed tile;
    its 7x7 stem 0.66 -> 0.52 ms from the phase grid; 3x3 stems of 3 channels 0.13 -> 0.08 ms from
    im2col); 3x3 convs of 256 and 512 channels on 6x6 and 3x3 maps 0.90-0.95x Winograd's and the streamed
    weights'. Winograd stays faster from 12x12 maps (0.38-0.44 ms, 0.42-0.51 on the tiles). Of the 1x1
    convs on 6x6 maps, ResNet-50's 1024 -> 256 ran 0.87-0.89x the transposed tile's time (0.33 -> 0.29 ms),
    MobileNetV2's and EfficientNet-B0's (64 to 672 channels) 0.7-0.8x the transposed tile's and OpenBLAS's
    (the two models 2.14 -> 2.01 and 4.72 -> 4.52 ms in all), ResNet-50's 256 -> 1024 1.03-1.08x; those on
    12x12 and 24x24 maps and the strided ones ran 0.9-1.3x as long (the input's planes, a cache line per
    reduction step, no longer fit in L1 beside a weight block)."""
    if (node.op != "Conv" or not cfg.direct or cfg.packed_gemm or not cfg.pgemm or cfg.lanes != 8
            or node.inputs[1] not in constants
            or cfg.conv_layout is not None or not (cfg.isa == "avx2" or (cfg.isa == "native" and _cpu_has_avx2()))):
        return False
    x, w = shapes[node.inputs[0]], shapes[node.inputs[1]]
    if w[1] == 1 or len(x) != 4 or direct_scratch(node, shapes) >= 2**31 - 2**20:
        return False
    if cfg.wino == "all" and wino_eligible(node, shapes, constants, cfg):
        return False
    win = conv_window(node, x, w)
    p, strided = win.oh * win.ow, win.sh > 1 or win.sw > 1
    if w[2] * w[3] == 1:
        small = w[0] * w[1] <= DIRECT8_ONE_MAXW
        return not strided and STREAM_MAXP < p <= DIRECT8_MAXP and (w[1] >= DIRECT8_ONE_MINK or small)
    return strided or p <= DIRECT8_MAXP


# Largest input (bytes, of one image and group) of a 1x1 conv of unit strides and no padding to at least
# DIRECT_ONE_MINM channels that the AVX-512 tiles of dconv.h read in place (runs_direct), and of a strided one.
DIRECT_ONE_MAXB, DIRECT_ONE_MINM, DIRECT_STRIDED_ONE_MAXB = 256 * 1024, 64, 1024 * 1024


def runs_direct(node: Node, shapes: dict, constants, cfg: BuildConfig) -> bool:
    """Whether a conv runs im2col-free on the AVX-512 tiles of dconv.h (or the AVX2 ones of dconv8.h, see
    direct_avx2): constant weights, not depthwise, offsets within 32 bits; a plain 1x1 conv (plain_pointwise)
    only on at most DIRECT_ONE_MAXB bytes of input. A tile reads one line of every input plane for its 8
    pixels, and planes that no longer stay in L2 came from L3 a line at a time: the packed product
    (sat_conv2d) copies its blocks plane by plane. ResNet-50 at 224x224, AVX-512 build, 1 thread, per-step
    medians on the Xeon (family 6 model 167): 256 -> 64 on 56x56 maps 1.41 -> 0.90 ms, its Conv+Add+Relu 64 ->
    256 2.0 -> 1.4, 512 -> 128 on 28x28 0.88 -> 0.76; the steps in all 66.9 -> 63.7 ms. A cap of 64 KB (14x14
    maps' 256 -> 1024 too) ran 66.8, of 1 MB 65.0. Convs to fewer channels keep the tiles: the packed
    product's 32-channel panels ran EfficientNet-B0's 32 -> 16 on a 48x48 map 4x slower (0.036 -> 0.143 ms),
    its 144 -> 24 on 24x24 0.048 -> 0.082. Strided 1x1 convs (no padding) over more than DIRECT_STRIDED_ONE_MAXB
    take the packed product too, their im2col the pixels they read: ResNet-50's 256 -> 512 of stride 2 from a
    56x56 map 2.0 -> 1.6-1.66 ms, 512 -> 1024 from 28x28 2.0-2.07 -> 1.87-1.93; its 1024 -> 2048 from 14x14
    (800 KB) ran 1.6 -> 2.35 there and keeps the tiles. Nor does a plain 1x1 conv whose 32-pixel panels would pad
    its map by more than a quarter (7x7: 49 pixels in 64), whose tiles run its pixels in rows of 7 without
    waste: ResNet-50's 2048 -> 512 on 7x7 maps at 224x224, per-step medians, 1.05-1.08 -> 0.83 ms at 1 thread,
    0.59-0.60 -> 0.48-0.50 at 2. Its 1024 -> 256 on 14x14 (196 pixels in 224) ran 0.79-0.86 -> 0.76-0.83 at 1
    thread but 0.48-0.50 -> 0.55-0.61 at 2 on the 8 x 32 tiles. On the 6 x 64 tiles (direct_width) every 1x1 conv
    stays: alone, warm, 1 thread (two runs side by side on the two cores), 1024 -> 256 on 14x14 0.67-0.72 ->
    0.59-0.65 ms, 1024 -> 512 1.37-1.43 -> 1.22-1.27; 2 threads 0.40-0.41 -> 0.35-0.37."""
    if direct_avx2(node, shapes, constants, cfg):
        return True
    if node.op != "Conv" or not cfg.packed_gemm or node.inputs[1] not in constants:
        return False
    x, w = shapes[node.inputs[0]], shapes[node.inputs[1]]
    win = conv_window(node, x, w) if len(x) == 4 else None
    if (win and win.kh == win.kw == 1 and win.ph == win.pw == 0
            and w[0] // int(node.attr("group", 1)) >= DIRECT_ONE_MINM
            and w[1] * x[2] * x[3] * 4 > (DIRECT_ONE_MAXB if plain_pointwise(x, win) else DIRECT_STRIDED_ONE_MAXB)
            and not (plain_pointwise(x, win) and -(-x[2] * x[3] // C["SAT_NR"]) * C["SAT_NR"] * 4 > 5 * x[2] * x[3])
            and direct_width(node, shapes, cfg) != DIRECT_WIDE):
        return False
    return w[1] != 1 and direct_scratch(node, shapes) < 2**31 - 2**20 and not runs_wino(node, shapes, constants, cfg)


# The register tile of pgemm.h (builds without the AVX-512 micro-kernel): SAT_PR rows by SAT_PN columns, two
# vectors (panel_width).
PR = C["SAT_PR"]


def panel_width(cfg: BuildConfig) -> int:
    """pgemm.h's SAT_PN: two vector registers of the build's floats."""
    return 2 * cfg.lanes


# Shortest reduction of a strided conv run on sat_conv_xdirect's grid of input phases (conv_layout).
XSTRIDED_MINK = 128


# Shortest reduction of a 1x1 conv whose usual product reads its input in place (reads_in_place).
IN_PLACE_MINK = 96


def reads_in_place(x, w, win) -> bool:
    """Whether a conv's usual product on pgemm.h's tile reads its column matrix from the input planes
    themselves (sat_pconv_run): 1x1, unit strides, no padding, and a reduction of at least IN_PLACE_MINK
    channels. Per-step medians in the models (avx2 build, 1 thread, the Xeon of family 6 model 167):
    ResNet-50's 256 -> 64 and 512 -> 128 on 24x24 and 12x12 maps 0.26-0.285 -> 0.22-0.24 ms (OpenBLAS before),
    its 512 -> 256 0.49 -> 0.41-0.44, MobileNetV2's projections of 96 and 144 channels on 24x24 maps 0.054 ->
    0.033 and 0.061 -> 0.044; reductions over 16 to 32 channels ran 3-25% slower than sgemm and sat_gemm_nn,
    their twelve stores a tile no longer small beside 16 to 32 reduction steps. At 224x224 the 56x56 maps'
    inputs (3 MB) leave L2 and these run level with sgemm (1.3-1.6 ms for 256 -> 64), where ONNX Runtime's
    NCHWc kernel takes 1.0 (docs/benchmarks.md)."""
    return w[1] >= IN_PLACE_MINK and plain_pointwise(x, win)


def plain_pointwise(x, win) -> bool:
    """A 1x1 conv of unit strides and no padding: its column matrix is its input, plane by plane."""
    return (win.kh == win.kw == 1 and win.sh == win.sw == 1 and win.ph == win.pw == 0
            and (win.oh, win.ow) == ((x[2] if len(x) == 4 else 1), x[-1]))


def conv_layout(x, w, win, group: int, cfg: BuildConfig) -> int:
    """How a conv runs on pgemm.h's tile: 0 the usual product (channels on the tile's 6 rows, im2col pixels
    on its PN columns), 1 the transposed one (pixels on the rows, channels on the columns: a deep layer's
    36 pixels fill 6 rows exactly but only 75% of three 16-wide panels), 2 with unit strides the product on
    the padded grid (no im2col; discards the Wp - OW pad columns of every row; every 16-pixel run reads
    all of a group's weights, so only where they fit in L2: 256 KB). Each is scored by the share
    of the tile's lanes doing useful work; packing the column matrix costs about 16 channels' worth of
    products (the unfolded tile is written twice and read once per 6-channel panel), so the packed
    layouts' score is scaled by M / (M + 16). cfg.conv_layout forces one (tests reach each that way)."""
    mg, k, PN = w[0] // group, w[1] * win.kh * win.kw, panel_width(cfg)
    p = tile_rows(k, win.oh, win.ow) * win.ow
    # a 1x1 conv's usual product may read its input planes in place (sat_pconv_run): nothing to pack
    pack = 1.0 if reads_in_place(x, w, win) else mg / (mg + 16)
    scores = [pack * p / (-(-p // PN) * PN) * mg / (-(-mg // PR) * PR),
              pack * p / (-(-p // PR) * PR) * mg / (-(-mg // PN) * PN)]
    if p * min(k, 256) > 16384:
        # the transposed product passes its whole packed tile (p x 256 of a reduction block) once per
        # channel panel: past 64 KB it comes from L2 every time (a 7x7 stem's tile ran 20% slower)
        scores[1] = 0.0
    # sat_conv_xdirect's grid: a strided conv's on the input's phases (as many as its taps read, at most 16)
    wp = win.ow + (win.kw - 1) * win.dw // win.sw
    hp = win.oh + (win.kh - 1) * win.dh // win.sh
    phases = len({(kh * win.dh % win.sh, kw * win.dw % win.sw) for kh in range(win.kh) for kw in range(win.kw)})
    # (sat_conv_xdirect's tap offsets into a group's padded input are 32-bit)
    # Strided convs of short reductions stay on im2col: a 3x3 stem of 3 channels (K = 27) ran 15% slower on the
    # grid, its tile stores and phase copy no longer small beside the products; a 7x7 one (K = 147) 17% faster.
    strided_ok = win.sh == win.sw == 1 or (max(win.sh, win.sw) <= 4 and (k >= XSTRIDED_MINK or cfg.conv_layout == 2))
    if strided_ok and mg * k * 4 <= 256 * 1024 and (x[1] // group) * phases * hp * wp < 2**31 - 2**20:
        # a row tile of sat_conv_xdirect: its useful pixels over the whole panels its virtual run takes
        rows = max(1, min(win.oh, -(-256 // wp)))
        run = (rows - 1) * wp + win.ow
        scores.append(rows * win.ow / (-(-run // PN) * PN) * mg / (-(-mg // PR) * PR))
    if cfg.conv_layout is not None and cfg.conv_layout < len(scores):
        return cfg.conv_layout
    return max(range(len(scores)), key=lambda i: (scores[i], -i))


# Smallest output (pixels) and channel counts (in and out) of a conv run as Winograd (runs_wino); from
# WINO_DEEP_C input channels on, at least WINO_DEEP_MINP pixels.
WINO_MINP, WINO_MINC, WINO_DEEP_C, WINO_DEEP_MINP = 36, 32, 512, 144
# Winograd's second form (sat_conv_wino16, wino.h: transforms in vectors, products on the builds' tile) takes
# the Winograd convs of at most WINO16_MAXCM channel pairs (runs_wino16). AVX-512 builds run Winograd only for
# outputs of at least WINO16_MINP pixels on it, the rest of those convs on their direct conv (dconv.h), which
# reads each weight once for all a small map's pixels. Single Conv+Relu, 1 thread, medians, Xeon (family 6 model
# 167), time on sat_conv_wino16 over time direct: 64 -> 64 on 56x56 0.63, 128 -> 128 on 28x28 0.71, 64 -> 64 on
# 24x24 0.63, 128 -> 128 on 12x12 0.92, 64 -> 64 on 14x14 0.80, 32 -> 32 on 28x28 0.73, 64 -> 128 on 48x48 0.53.
# ResNet-50 at 224x224 in the model (1 thread, per-step medians beside the build before): its 3x3 convs of 64
# channels on 56x56 1.39-1.46 -> 0.82-0.93 ms, of 128 on 28x28 (the first form before) 1.20-1.29 -> 0.80-0.89;
# those of 256 on 14x14 (4 MB of transformed weights, fetched into L2 a slice ahead) level with the direct tiles
# in the model where alone 0.75x their time. The AVX2 build (AVX-512 hidden), same runs: 56x56 1.83-1.94 ->
# 1.36-1.50 ms, 28x28 1.45-1.49 -> 1.27-1.36, while the 14x14 ones of 256 channels took 1.47-1.58 on the first
# form, 2.07-2.17 on the second.
# Convs of more channel pairs keep the first form (on AVX-512 from WINO_AVX512_MINP pixels and WINO_AVX512_MINCM
# pairs): its blocks of tiles are larger for the same L2, and VGG-11's 3x3 convs of 128 -> 256 to 512 -> 512
# channels on 48x48 to 24x24 maps (AVX-512, 1 thread, per-step medians) took 7.5-15.4 ms there, 10.5-21.4 on
# sat_conv_wino16 (blocks of 32 tiles: the weights, 4 to 16 MB, come from memory for every 32 tiles).
WINO16_MINP, WINO16_MAXCM = 144, 16384
WINO_AVX512_MINP, WINO_AVX512_MINCM = 784, 8192

# Largest output (pixels) of a conv run on streamed weights (sat_conv_stream, SAT_SP in pgemm.h).
STREAM_MAXP = C["SAT_SP"]


def runs_stream(node: Node, shapes: dict, constants, cfg: BuildConfig) -> bool:
    """Whether a conv runs on pgemm.h's streamed-weight kernel (builds without the AVX-512 micro-kernel):
    constant weights, one group, not depthwise, at most STREAM_MAXP output pixels and a reduction of at
    least DOT_MINK. Each weight is read once for that handful of products, so these convs go at the speed
    the weights come from memory, which the kernel keeps busy (see sat_conv_stream)."""
    if not (cfg.stream and cfg.pgemm and node.op == "Conv" and not cfg.packed_gemm and node.inputs[1] in constants
            and int(node.attr("group", 1)) == 1):
        return False
    if direct_avx2(node, shapes, constants, cfg):
        return False
    x, w = shapes[node.inputs[0]], shapes[node.inputs[1]]
    if w[1] == 1 and x[1] != 1:
        return False
    win = conv_window(node, x, w)
    return win.oh * win.ow <= STREAM_MAXP and w[1] * win.kh * win.kw >= DOT_MINK


def wino_eligible(node: Node, shapes: dict, constants, cfg: BuildConfig) -> bool:
    """Whether sat_conv_wino (wino.h) can run a conv: builds whose vectors hold a tile panel's PR tiles (the
    input transform stores them as one vector: not the portable build's 4-float vectors), constant weights,
    3x3, unit strides and dilations, one group."""
    if not (cfg.pgemm and node.op == "Conv" and cfg.lanes >= PR and node.inputs[1] in constants
            and int(node.attr("group", 1)) == 1):
        return False
    x, w = shapes[node.inputs[0]], shapes[node.inputs[1]]
    if len(x) != 4 or tuple(w[2:]) != (3, 3):
        return False
    win = conv_window(node, x, w)
    return win.sh == win.sw == 1 and win.dh == win.dw == 1


def runs_wino(node: Node, shapes: dict, constants, cfg: BuildConfig) -> bool:
    """Whether a conv runs as Winograd F(2x2, 3x3) (sat_conv_wino, or sat_conv_wino16: runs_wino16): outputs
    of at least WINO_MINP pixels,
    at least WINO_MINC channels in and out, and from WINO_DEEP_C input channels on at least WINO_DEEP_MINP
    pixels. Single convs with bias and Relu (1 thread, medians of interleaved runs on a shared 2-core
    Zen 3) took 0.52-0.74x the time of the kernels before from 6x6 maps of 256 channels and 12x12 of 128
    to 56x56 maps of 256, 0.80x on 112x112 maps of 32 channels, 0.89x on 12x12 maps of 512; 16 channels
    ran 6% slower, and 6x6 and 7x7 maps of 512 channels (their 16/9 larger weights read again for every
    block of tiles, 6 tiles of 512 channels) 0.90-1.01x."""
    if (cfg.wino == "off" or not wino_eligible(node, shapes, constants, cfg) or runs_stream(node, shapes, constants, cfg)
            or direct_avx2(node, shapes, constants, cfg)):
        return False
    if cfg.wino == "all":
        return True
    x, w = shapes[node.inputs[0]], shapes[node.inputs[1]]
    win = conv_window(node, x, w)
    p = win.oh * win.ow
    if cfg.packed_gemm:
        return (p >= WINO16_MINP and min(w[0], w[1]) >= WINO_MINC and w[0] * w[1] <= WINO16_MAXCM
                or p >= WINO_AVX512_MINP and w[0] * w[1] >= WINO_AVX512_MINCM and min(w[0], w[1]) >= WINO_MINC)
    return p >= WINO_MINP and min(w[0], w[1]) >= WINO_MINC and (w[1] < WINO_DEEP_C or p >= WINO_DEEP_MINP)


def runs_wino16(node: Node, shapes: dict, constants, cfg: BuildConfig) -> bool:
    """Whether a conv runs on sat_conv_wino16 (AVX-512 and AVX2 builds): every Winograd conv (runs_wino) under
    BuildConfig(wino="all"), else those of at most WINO16_MAXCM channel pairs; the others keep sat_conv_wino."""
    if not (cfg.lanes >= 8 and runs_wino(node, shapes, constants, cfg)):
        return False
    w = shapes[node.inputs[1]]
    return cfg.wino == "all" or w[0] * w[1] <= WINO16_MAXCM


# Weights (K x M) from which a 1x1 conv expanding its channels runs on pgemm.h's tile, not OpenBLAS (runs_packed).
PACKED_ONE_MINW = 65536


def runs_packed(node: Node, shapes: dict, constants, cfg: BuildConfig) -> bool:
    """Whether a conv runs on pgemm.h's tile (builds without the AVX-512 micro-kernel): constant weights,
    not depthwise. Its column panels live in per-thread buffers, not in the workspace."""
    if not (cfg.pgemm and node.op == "Conv" and not cfg.packed_gemm and node.inputs[1] in constants
            and shapes[node.inputs[1]][1] != 1) or runs_stream(node, shapes, constants, cfg) \
            or runs_wino(node, shapes, constants, cfg) or direct_avx2(node, shapes, constants, cfg):
        return False
    # Outputs of fewer pixels than the tile's 6 rows (squeeze-excite convs on 1x1 maps), and long reductions
    # over at most DOT_MAXP pixels (3x3 convs of 512 channels on a 3x3 map), stay dot products: they read
    # each weight once, 4 rows at a time, where the tile's rows would be mostly padding (measured 2x and
    # 1.05-1.08x slower on the tile).
    x, w = shapes[node.inputs[0]], shapes[node.inputs[1]]
    win = conv_window(node, x, w)
    p, k = win.oh * win.ow, w[1] * win.kh * win.kw
    if k >= DOT_MINK and (p < 6 or (p <= DOT_MAXP and k > 2048)):
        return False
    # Where the tile's product is the usual one it runs level with OpenBLAS sgemm, and 1x1 convs on the
    # padded grid ran 5-25% slower than sgemm and the short-reduction kernel (sat_gemm_nn) on the expansion
    # and projection convs of MobileNetV2 and EfficientNet-B0: those keep their kernels. The transposed
    # product (few pixels) and unfolded-free kxk convs are the ones faster on the tile.
    layout = conv_layout(x, w, win, int(node.attr("group", 1)), cfg)
    # 1x1 projections to fewer than 256 channels from at least twice as many (closing the MobileNetV2 and
    # EfficientNet-B0 blocks on 3x3 and 6x6 maps) ran 5-25% faster as dot products (at most DOT_MAXP
    # pixels) or OpenBLAS sgemm than on the transposed tile; ResNet-50's to 256 and 512 channels ran
    # 4-16% slower there, and those to 320 level.
    mg = w[0] // int(node.attr("group", 1))
    if layout == 1 and win.kh * win.kw == 1 and k >= 2 * mg and mg < 256:
        return False
    # 1x1 expansions to at least twice their channels of at least PACKED_ONE_MINW weights run on the tile in
    # the layout it scores best (ResNet-50's 128 -> 512 on 12x12 maps and its stride-2 256 -> 512 from 24x24):
    # per-step medians in the model at 96x96, avx2 build on the Zen 4, 1 thread, 0.21 -> 0.18-0.19 and 0.43 ->
    # 0.37-0.39 ms against OpenBLAS sgemm (and the strided one's im2col). Smaller ones (64 -> 256 on 24x24 maps,
    # MobileNetV2's and EfficientNet-B0's) ran level or slower there, and so did the projections (512 -> 128)
    # while the tile packed their input; reading it in place (reads_in_place) they run faster (layout 0 below).
    if win.kh * win.kw == 1 and mg >= 2 * k and mg * k >= PACKED_ONE_MINW:
        return True
    return (layout == 1 or (layout == 2 and win.kh * win.kw > 1) or (layout == 0 and reads_in_place(x, w, win))
            or cfg.conv_layout is not None)


def im2col_bytes(step: Step, shapes: dict, cfg: BuildConfig, constants=()) -> int:
    """Scratch a conv step needs for its column matrix or padded input (0 for depthwise convs)."""
    node = step.anchor
    if runs_direct(node, shapes, constants, cfg):
        return direct_scratch(node, shapes, direct_width(node, shapes, cfg)) * 4 + 64
    if node.op != "Conv" or runs_packed(node, shapes, constants, cfg) or runs_stream(node, shapes, constants, cfg) \
            or runs_wino(node, shapes, constants, cfg):
        return 0
    x, w = shapes[node.inputs[0]], shapes[node.inputs[1]]
    win = conv_window(node, x, w)
    group = int(node.attr("group", 1))
    k = (x[1] // group) * win.kh * win.kw
    if w[1] != 1 and win.oh * win.ow <= DOT_MAXP and k >= DOT_MINK:
        return k * win.oh * win.ow * 4  # sat_conv_dot's transposed columns (convs not on packed weights)
    if w[1] == 1 or plain_pointwise(x, win):
        return 0
    cols = tile_rows(k, win.oh, win.ow) * win.ow
    return k * (-(-cols // 32) * 32 if cfg.packed_gemm else cols) * 4


def transposed_product(x, w, win, group: int) -> bool:
    """Whether sat_conv2d runs a conv (AVX-512 builds, constant weights) as Y^T = X^T W^T (pixels on the
    kernel's 8 rows, channels on its 32 columns): when its output is one im2col tile whose pixel count fills
    32-wide panels clearly worse than 8-row ones, as 7x7 and 14x14 outputs do; direct 1x1 convs keep their
    im2col-free path."""
    nr, panel = C["SAT_NR"], C["SAT_MR"]
    mg, k = w[0] // group, w[1] * win.kh * win.kw
    if plain_pointwise(x, win) or tile_rows(k, win.oh, win.ow) < win.oh:
        return False
    p = win.oh * win.ow
    usual = p / (-(-p // nr) * nr) * mg / (-(-mg // panel) * panel)
    trans = p / (-(-p // panel) * panel) * mg / (-(-mg // nr) * nr)
    return trans > usual + 0.03


def accumulating_kernel(node: Node, shapes: dict, constants, cfg: BuildConfig) -> bool:
    """Whether the kernel a conv runs on (emit_Conv's choice) can add its sums onto its output buffer as it
    stands: sat_conv2d's products (the AVX-512 packed one not transposed; sgemm and sat_gemm_nn, not the dot
    products of few pixels) and sat_conv_packed's usual product (layout 0). Not the direct, streamed, Winograd
    or depthwise kernels."""
    if node.op != "Conv" or node.inputs[1] not in constants:
        return False
    if (runs_direct(node, shapes, constants, cfg) or runs_stream(node, shapes, constants, cfg)
            or runs_wino(node, shapes, constants, cfg)):
        return False
    x, w = shapes[node.inputs[0]], shapes[node.inputs[1]]
    if w[1] == 1 or len(x) != 4:
        return False
    win, group = conv_window(node, x, w), int(node.attr("group", 1))
    if runs_packed(node, shapes, constants, cfg):
        return conv_layout(x, w, win, group, cfg) == 0
    if cfg.packed_gemm:
        return not transposed_product(x, w, win, group)
    return True


def in_place_residual(step: Step, k: int, pl: Plan, graph: Graph, shapes: dict, cfg: BuildConfig,
                      last_read: dict[str, int], external: set) -> tuple[str, bool]:
    """The value a conv step adds its sums onto in place and whether its kernel does the adding, or ("", False):
    the other operand of an Add leading its
    chain (a residual block's identity: relu(conv(x) + b + r)), of the output's shape, stored in the
    workspace, read last by this step (so its storage is free to take) and by nothing else in the step, on a
    kernel that accumulates (accumulating_kernel). The kernel then reads the residual as it adds, where the
    epilogue read it in a pass of its own beside the sums' lines. ResNet-50 at 224x224, 1 thread, per-step
    medians in the model on the Xeon (family 6 model 167), AVX-512 build: its 64 -> 256 + residual + Relu on
    56x56 maps 1.11-1.19 -> 0.88-0.94 ms (the plain 64 -> 256 beside them: 0.87-0.89), 128 -> 512 on 28x28
    0.93-0.98 -> 0.85-0.90; avx2 build (with sat_gemm_nn's row-group order) 1.52-1.82 -> 1.41-1.48.

    The AVX-512 build's direct tiles (dconv.h) add the residual in their vector epilogue as each output is
    stored, reading it at the very offset they write: the output takes its storage there too, the Add kept
    (where only Relus follow it, whose vector forms always exist: a scalar epilogue would run after the
    stores, on sums that overwrote the residual). ResNet-50's 256 -> 1024 + residual + Relu on 14x14 maps (x6),
    each store's line in cache from the residual's read, not fetched for a buffer of its own: 0.81-0.83 ->
    0.78-0.80 ms; 512 -> 2048 on 7x7 (x3) 0.85-0.88 -> 0.84-0.86."""
    node, none = step.anchor, ("", False)
    if node.op != "Conv" or not step.chain or step.pattern or step.softmax:
        return none
    add, c = step.chain[0], node.outputs[0]
    if add.op != "Add" or len(add.inputs) != 2 or add.inputs.count(c) != 1:
        return none
    r = add.inputs[1] if add.inputs[0] == c else add.inputs[0]
    root = pl.root(r)
    if root in external or shapes.get(r) != shapes.get(c) or last_read.get(root) != k:
        return none
    later = step.chain[1:]
    # the residual's storage is overwritten as the kernel goes: nothing else in the step may read it, nor the
    # conv's own output (its sums alone exist nowhere) or the Add's (but as the next member's chain value)
    if any(i and pl.root(i) == root for i in node.inputs):
        return none
    if any(i and (pl.root(i) == root or i == c) for n in later for i in n.inputs):
        return none
    if any(n.inputs.count(add.outputs[0]) > (1 if j == 0 else 0) for j, n in enumerate(later)):
        return none
    if accumulating_kernel(node, shapes, graph.constants, cfg):
        return r, True
    if (cfg.packed_gemm and runs_direct(node, shapes, graph.constants, cfg) and shapes[r][1:2] == shapes[c][1:2]
            and all(n.op == "Relu" for n in later)):
        return r, False
    return none


# Most weight floats (M x K) for sat_conv_pw (pw.h's SAT_PW_MAXW): pixel panels outer read all of them from L2 for
# every pixel panel; larger ones it splits into channel blocks. Most output bytes it adds onto in place (a residual
# it reads a line of every channel of per panel).
PW_MAXW, PW_ACC_MAXB = C["SAT_PW_MAXW"], 2 << 20
# Fewest input pixels of a 1x1 conv on sat_conv_pw's AVX2 tile outside pixel panels.
PW_AVX2_MINP = 256
# Fewest pixel panels in the output (all images) of a conv whose weights sat_conv_pw splits into channel blocks.
PW_BLOCK_MINPANELS = 8


def runs_pw(node: Node, shapes: dict, constants, cfg: BuildConfig, accumulates: bool = False) -> bool:
    """Whether a conv runs on sat_conv_pw (AVX-512 and AVX2 builds; with an epilogue, where it has a row form): a
    plain 1x1 conv of one group with constant weights the packed product takes (not dconv.h's tiles), of at most
    PW_MAXW packed weights, adding onto at most PW_ACC_MAXB of output where it `accumulates`. Others keep
    sat_conv2d's tiles: with larger weights their channel panels outer read the weights once a tile, and
    read a residual as 8 rows front to back. ResNet-50 at 224x224, 1 thread, per-step medians beside ONNX
    Runtime's (Xeon, family 6 model 167): 128 -> 512 + residual on 28x28 maps 0.82-0.88 -> 0.76-0.79 ms (x4),
    512 -> 128 0.81-0.82 -> 0.74-0.76 (x3), 64 -> 64 on 56x56 0.30 -> 0.23-0.24, 256 -> 128 1.63-1.67 ->
    1.55-1.56, 64 -> 256 0.90 -> 0.84-0.92; its 64 -> 256 + residual on 56x56 (3.2 MB) 0.86-0.96 -> 0.92-1.10
    and keeps the tiles."""
    if not pw_capable(node, shapes, constants, cfg, False):
        return False
    x, w = shapes[node.inputs[0]], shapes[node.inputs[1]]
    if accumulates and x[0] * w[0] * x[2] * x[3] * 4 > PW_ACC_MAXB:
        return False
    if cfg.packed_gemm:
        return not runs_direct(node, shapes, constants, cfg)
    # AVX2: maps of at least PW_AVX2_MINP pixels, not the convs the streamed kernel or the transposed product
    # runs. ResNet-50 at 96x96, avx2 build, 1 thread, per step beside the build before (Xeon, family 6 model
    # 167): its 1x1 convs on 24x24 maps 0.21-0.25 -> 0.20-0.22 ms, on 12x12 maps 0.21-0.23 -> 0.23-0.25.
    return (x[2] * x[3] >= PW_AVX2_MINP and not runs_stream(node, shapes, constants, cfg)
            and not direct_avx2(node, shapes, constants, cfg)
            and conv_layout(x, w, conv_window(node, x, w), 1, cfg) != 1)


def pw_tile(cfg: BuildConfig) -> tuple[int, int] | None:
    """sat_conv_pw's register tile, (channels, pixels): gemm.h's 8 x 32 on AVX-512 builds, pgemm.h's 6 x 16 on
    AVX2 ones (pw.h), None on others or with BuildConfig.pw off."""
    if not cfg.pw:
        return None
    if cfg.packed_gemm:
        return C["SAT_MR"], C["SAT_NR"]
    if cfg.pgemm and cfg.lanes == 8:
        return PR, 16
    return None


def pw_capable(node: Node, shapes: dict, constants, cfg: BuildConfig, strided: bool, blocked: bool = False) -> bool:
    """Whether sat_conv_pw can run a conv whatever its input's and output's storage: AVX-512 and AVX2 builds,
    one group, constant weights of at most PW_MAXW floats (any number where `blocked`: the kernel splits them
    into channel blocks), a 1x1 window without padding, of unit strides unless `strided` (a strided one gathers
    its pixels from an input in pixel panels)."""
    tile = pw_tile(cfg)
    if node.op != "Conv" or not tile or node.inputs[1] not in constants or int(node.attr("group", 1)) != 1:
        return False
    x, w = shapes[node.inputs[0]], shapes[node.inputs[1]]
    if len(x) != 4 or len(w) != 4 or w[1] == 1:
        return False
    win = conv_window(node, x, w)
    if win.kh != 1 or win.kw != 1 or win.ph or win.pw or not (strided or plain_pointwise(x, win)):
        return False
    if w[0] * w[1] <= PW_MAXW:
        return True
    # each channel block's weights pass every pixel panel of the output from L2: on few panels they come from
    # memory as often as they are used (ResNet-50's 1024 -> 2048 of stride 2 onto 7x7, 4 panels, AVX2 build:
    # 2.9 -> 4.4 ms)
    return blocked and x[0] * -(-win.oh * win.ow // tile[1]) >= PW_BLOCK_MINPANELS


def _row_chain(step: Step, shapes: dict) -> bool:
    """Whether a conv step's epilogue past an Add it accumulates is Relus and Adds of an operand of the output's
    shape (its row form then exists and reads no operand by its storage's layout but the output's own)."""
    chain = step.chain[1:] if step.accumulates else step.chain
    return not step.pattern and not step.softmax and all(
        n.op == "Relu" or (n.op == "Add" and all(shapes.get(i) == shapes[step.out] for i in n.inputs)) for n in chain)


def panel_roots(pl: Plan, graph: Graph, shapes: dict, cfg: BuildConfig) -> set[str]:
    """Roots stored in pixel panels, the layout sat_conv_pw's kernel reads its input in: each panel's (32 pixels on
    AVX-512, 16 on AVX2: the tile's columns)
    channels one after another, so a panel of a reduction block is one run of memory, read in place, where an
    N x C x H x W input is packed a panel at a time from a line of every channel plane. A root qualifies when
    sat_conv_pw writes all of it (convs whose epilogue is Relus, each adding onto it in place or not; no Add
    reading it in the epilogue, whose operand would be read as N x C x H x W; strided ones only from panels,
    which they gather from) and every step reading it is a conv that sat_conv_pw runs on it as its input (any
    stride), one adding onto it, or a strided 1x1 conv of larger weights on sat_conv2d's tiles (its im2col
    gathers from the panels): a ResNet stage's residual stream with its 1x1 convs, not its 3x3 convs' inputs
    (dconv.h reads planes). Graph inputs and outputs and views keep N x C x H x W. ResNet-50 at 224x224, 1
    thread, per-step medians beside ONNX Runtime's (Xeon, family 6 model 167), its first stage's stream (3.2 MB):
    64 -> 256 + residual 0.92-0.96 ->
    0.75-0.80 ms (x3, level with ONNX Runtime's NCHWc kernel), 256 -> 64 0.87-0.89 -> 0.76-0.79 (x2), 256 ->
    128 1.51 -> 1.40, the stride-2 256 -> 512 1.75 -> 1.52; the model 62.3-64.9 -> 61.9-63.5 ms (C/ORT
    1.03-1.05 -> 0.96-1.03), at 2 threads 35.5-36.4 -> 33.4-35.4 (1.02-1.03 -> 0.97). Its second stage's
    stream (28x28) is in panels too; the third's is written by direct tiles (dconv.h) and stays.
    AVX2 builds (pw.h's 6 x 16 tile), same model, per step interleaved with the build before: 64 -> 256 + residual
    1.44-1.55 -> 1.21-1.29 ms (x3), 256 -> 64 1.45-1.51 -> 1.14-1.21 (x2), 256 -> 128 2.73-2.78 -> 2.28-2.33, the
    stride-2 256 -> 512 2.72-2.75 -> 2.38, 128 -> 512 + residual on 28x28 1.32-1.37 -> 1.13-1.16 (x4); the
    third stage's stream stays, its stride-2 reader writing 7x7 maps (PW_BLOCK_MINPANELS)."""
    tile = pw_tile(cfg)
    if not tile:
        return set()
    external = set(graph.inputs) | set(graph.constants) | {pl.root(o) for o in graph.outputs}
    writers: dict[str, list[Step]] = {}
    readers: dict[str, list[tuple[Step, str]]] = {}
    for step in pl.steps:
        writers.setdefault(pl.root(step.out), []).append(step)
        for v in step.reads():
            readers.setdefault(pl.root(v), []).append((step, v))
    found: set[str] = set()
    # (AVX2 builds run convs of any weights on sat_conv_pw's channel blocks there: they have no other kernel
    # reading panels)
    blocked = not cfg.packed_gemm

    def writes(s: Step) -> bool:
        # sat_conv_pw, its epilogue Relus (past an Add it accumulates); of stride 2 only from panels it gathers
        if s.shares or not pw_capable(s.anchor, shapes, graph.constants, cfg, True, blocked):
            return False
        x, w = shapes[s.anchor.inputs[0]], shapes[s.anchor.inputs[1]]
        return ((plain_pointwise(x, conv_window(s.anchor, x, w)) or pl.root(s.anchor.inputs[0]) in found)
                and all(n.op == "Relu" for n in (s.chain[1:] if s.accumulates else s.chain)))

    def reads(s: Step, v: str, r: str) -> bool:
        if s.accumulates and pl.root(s.accumulates) == r and v == s.accumulates:
            return True
        node = s.anchor
        if (node.op != "Conv" or v != node.inputs[0] or shapes.get(v) != shapes[r]
                or r in [pl.root(i) for n in s.nodes() for i in n.inputs[1:]]):
            return False
        if pw_capable(node, shapes, graph.constants, cfg, True, blocked) and _row_chain(s, shapes):
            return True
        # a strided 1x1 conv of larger weights on sat_conv2d's tiles (AVX-512), its im2col gathering from the
        # panels, or on the 6 x 64 direct tiles, which gather its pixels from them (sat_gather_plane)
        x, w = shapes[node.inputs[0]], shapes[node.inputs[1]]
        win = conv_window(node, x, w)
        return (cfg.packed_gemm and node.inputs[1] in graph.constants and int(node.attr("group", 1)) == 1 and win.kh == win.kw == 1
                and not (win.ph or win.pw or plain_pointwise(x, win)) and not s.accumulates and not s.shares
                and (not runs_direct(node, shapes, graph.constants, cfg) or direct_width(node, shapes, cfg) == DIRECT_WIDE))

    for r, steps in writers.items():  # in the order of their first writes: a stride-2 writer's input is decided
        if r in external or len(shapes.get(r, ())) != 4 or not all(writes(s) for s in steps):
            continue
        # (the kernels' gathers index an image's panels with 32-bit offsets)
        if shapes[r][1] * -(-shapes[r][2] * shapes[r][3] // tile[1]) * tile[1] >= 2**31:
            continue
        if all(reads(s, v, r) for s, v in readers.get(r, [])):
            found.add(r)
    return found


def tile_rows(k: int, oh: int, ow: int) -> int:
    """Output rows per im2col tile; mirrors sat_tile_rows in kernels.h."""
    rows = TILE_BYTES // (k * ow * 4)
    if rows * ow < 256:
        rows = (256 + ow - 1) // ow
    return max(1, min(rows, oh))


def plan(graph: Graph, shapes: dict[str, tuple[int, ...]], cfg: BuildConfig, redzone: int = 0) -> Plan:
    """Fuse, then assign arena offsets: buffers whose lifetimes overlap never share bytes.

    `redzone` bytes are kept free after every buffer (sanitizer builds poison them); `cfg` chooses each
    conv's kernel, which sizes the conv scratch."""
    steps, alias = fuse(graph, shapes)
    external = set(graph.inputs) | set(graph.constants)
    pl = Plan(steps, alias, {}, 0, 0, 0)
    last_read: dict[str, int] = {}
    for k, step in enumerate(steps):
        for v in step.reads():
            last_read[pl.root(v)] = k
    for o in graph.outputs:
        last_read[pl.root(o)] = len(steps)
    for k, step in enumerate(steps):
        r, by_kernel = in_place_residual(step, k, pl, graph, shapes, cfg, last_read, external)
        if r:
            if by_kernel:
                step.accumulates = r
            else:
                step.shares = r
            alias[step.out] = r
            root = pl.root(r)
            last_read[root] = max(last_read[root], last_read.pop(step.out, k))
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for k, step in enumerate(steps):
        if step.out not in alias:
            first[step.out] = k
            last[step.out] = max(last.get(step.out, k), k)
        for v in step.reads():
            r = pl.root(v)
            if r not in external:
                last[r] = max(last.get(r, k), k)
    for o in graph.outputs:
        r = pl.root(o)
        if r not in external:
            last[r] = len(steps)  # outputs are copied out after the last step
    # Greedy placement, largest first: lowest offset clear of every buffer live at the same time.
    placed: list[tuple[int, int, int, int]] = []
    pl.panels = panel_roots(pl, graph, shapes, cfg)
    pl.panel_pixels = (pw_tile(cfg) or (1, 1))[1]
    for r in sorted(first, key=lambda v: (-_nbytes(pl.floats(v, shapes[v])), first[v])):
        size, lo, hi = _nbytes(pl.floats(r, shapes[r])) + redzone, first[r], last[r]
        busy = sorted((o, e) for o, e, a, b in placed if not (b < lo or hi < a))
        off = 0
        for o, e in busy:
            if off + size <= o:
                break
            off = max(off, e)
        placed.append((off, off + size, lo, hi))
        pl.offsets[r] = off
        pl.arena_bytes = max(pl.arena_bytes, off + size)
        pl.naive_bytes += size - redzone
    pl.scratch_bytes = max((im2col_bytes(s, shapes, cfg, graph.constants) for s in steps), default=0)
    return pl
