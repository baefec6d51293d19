"""C backend, shape stage: static shapes of every value and normalized window attributes."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from saturate.core import geometry
from saturate.core.errors import SaturateError
from saturate.core.ir import Graph, Node
from saturate.ops.registry import attach, lookup, ops_with

# The op registry's C hooks (OpDef.c): live sets, current after later registrations.
ELEMENTWISE_UNARY = ops_with("c", "unary")
ELEMENTWISE_BINARY = ops_with("c", "binary")
# Ops whose output shares its input's storage (a view): no kernel runs.
ALIASES = ops_with("c", "view")
# Integer dtypes C segments hold as float32 numbers of exactly those values (a quantized activation is the
# integer QuantizeLinear rounded to, in a float: every 16-bit integer is one); their bounds.
INT_CODED = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767), "uint16": (0, 65535)}
# ONNX TensorProto element types of INT_CODED.
INT_CODED_TYPES = {3: "int8", 2: "uint8", 5: "int16", 4: "uint16"}
# Every dtype C segments hold as float32 numbers of exactly its values: INT_CODED, and bools as 0.0f and 1.0f
# (Where's condition, and the masks viewed or cast on the way to it).
HELD = ("float32", "bool", *INT_CODED)


def runs_in_c(node: Node) -> bool:
    """Whether the op's registry entry has a C hook (pointwise, view or kernel)."""
    d = lookup(node.op, node.domain)
    return d is not None and d.c is not None


@dataclass(frozen=True)
class Window:
    """A 2-D sliding window (conv or pool): kernel, strides, begin/end pads, dilations, output size."""

    kh: int
    kw: int
    sh: int
    sw: int
    ph: int
    pw: int
    pe_h: int
    pe_w: int
    dh: int
    dw: int
    oh: int
    ow: int


def unsupported(node: Node, why: str) -> SaturateError:
    """The compile-time error for a node the backend cannot run."""
    return SaturateError(f"{node.where()}: the C backend {why}")


def window(node: Node, in_hw: tuple[int, int], kernel: tuple[int, int], ceil_mode: bool = False) -> Window:
    """Resolve auto_pad, pads, strides and dilations of a 2-D window and its output size
    (saturate.core.geometry, the one definition the interpreter and the engine use too)."""
    try:
        w = geometry.window(node.attrs, in_hw, kernel, ceil_mode)
    except geometry.GeometryError as err:
        raise unsupported(node, f"cannot run this window: {err}") from None
    if min(w.out) <= 0:
        raise unsupported(node, f"got a window larger than its input {in_hw}")
    return Window(w.kernel[0], w.kernel[1], w.strides[0], w.strides[1], w.begin[0], w.begin[1], w.end[0], w.end[1],
                  w.dilations[0], w.dilations[1], w.out[0], w.out[1])


def lifted_node(node: Node) -> Node:
    """A copy of a 1-D window node with its attributes written for 2-D."""
    attrs = dict(node.attrs)
    if attrs.get("strides"):
        attrs["strides"] = [1] + list(attrs["strides"])
    if attrs.get("dilations"):
        attrs["dilations"] = [1] + list(attrs["dilations"])
    if attrs.get("pads"):
        p = list(attrs["pads"])
        attrs["pads"] = [0, p[0], 0, p[1]]
    if attrs.get("kernel_shape"):
        attrs["kernel_shape"] = [1] + list(attrs["kernel_shape"])
    return Node(node.op, node.inputs, node.outputs, attrs, node.name, node.domain)


def conv_window(node: Node, x: tuple[int, ...], w: tuple[int, ...]) -> Window:
    """The window of a Conv (1-D lifted to 2-D)."""
    if len(x) == 3:
        return window(lifted_node(node), (1, x[2]), (1, w[2]))
    if len(x) != 4:
        raise unsupported(node, f"supports 1-D and 2-D convolutions only, input shape {x}")
    return window(node, (x[2], x[3]), (w[2], w[3]))


def pool_window(node: Node, x: tuple[int, ...]) -> Window:
    """The window of a MaxPool/AveragePool (1-D lifted to 2-D)."""
    kernel = tuple(node.attr("kernel_shape") or ())
    ceil_mode = bool(node.attr("ceil_mode", 0))
    if len(x) == 3 and len(kernel) == 1:
        return window(lifted_node(node), (1, x[2]), (1, kernel[0]), ceil_mode)
    if len(x) != 4 or len(kernel) != 2:
        raise unsupported(node, f"supports 1-D and 2-D pooling only, input shape {x}")
    return window(node, (x[2], x[3]), kernel, ceil_mode)


def const_ints(graph: Graph, node: Node, value: str) -> list[int]:
    """A compile-time integer list (Reshape's shape); a runtime value is unsupported."""
    if value not in graph.constants:
        raise unsupported(node, f"needs '{value}' to be a constant")
    return [int(v) for v in np.asarray(graph.constants[value]).reshape(-1)]


def _input(node: Node, k: int) -> str:
    return node.inputs[k] if len(node.inputs) > k else ""


def _text(value, default: str) -> str:
    value = default if value is None else value
    return value.decode() if isinstance(value, bytes) else str(value)


def slice_params(graph: Graph, node: Node, x: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """(start, step, count) per axis of a Slice (geometry.slice_ranges): inputs from opset 10,
    attributes before (and in the Slice nodes Split lowers to)."""
    if len(node.inputs) > 1:
        starts, ends = const_ints(graph, node, node.inputs[1]), const_ints(graph, node, node.inputs[2])
        axes = const_ints(graph, node, _input(node, 3)) if _input(node, 3) else list(range(len(starts)))
        steps = const_ints(graph, node, _input(node, 4)) if _input(node, 4) else [1] * len(starts)
    else:
        starts, ends = list(node.attr("starts")), list(node.attr("ends"))
        axes = list(node.attr("axes") or range(len(starts)))
        steps = [1] * len(starts)
    try:
        return geometry.slice_ranges(x, starts, ends, axes, steps)
    except geometry.GeometryError as err:
        raise unsupported(node, str(err)) from None


def pad_params(graph: Graph, node: Node, x: tuple[int, ...]) -> tuple[list[int], list[int], str, float]:
    """(begin pads, end pads, mode, constant value) of a Pad; pads and value must be compile-time."""
    mode = _text(node.attr("mode"), "constant")
    if len(node.inputs) > 1:
        pads = const_ints(graph, node, node.inputs[1])
        value = 0.0
        if _input(node, 2):
            if node.inputs[2] not in graph.constants:
                raise unsupported(node, f"needs '{node.inputs[2]}' to be a constant")
            value = float(np.asarray(graph.constants[node.inputs[2]]).reshape(-1)[0])
        axes = const_ints(graph, node, _input(node, 3)) if _input(node, 3) else list(range(len(x)))
    else:
        pads, value, axes = list(node.attr("pads")), float(node.attr("value", 0.0)), list(range(len(x)))
    try:
        begin, end = geometry.pad_amounts(len(x), pads, axes)
    except geometry.GeometryError as err:
        raise unsupported(node, str(err)) from None
    if mode not in ("constant", "reflect", "edge"):
        raise unsupported(node, f"has no kernel for Pad mode '{mode}'")
    if mode != "constant" and any(d == 0 for d in x):
        raise unsupported(node, f"cannot {mode}-pad an empty tensor")
    return begin, end, mode, value


def reduce_axes(graph: Graph, node: Node, x: tuple[int, ...]) -> tuple[list[int], bool]:
    """Reduced axes (sorted, non-negative) and keepdims of a Reduce*: axes an attribute before
    opset 18 (ReduceSum: 13), an input from then on."""
    if _input(node, 1):
        axes = const_ints(graph, node, node.inputs[1])
    else:
        axes = list(node.attr("axes") or [])
    if not axes:
        if node.attr("noop_with_empty_axes", 0):
            return [], bool(node.attr("keepdims", 1))
        axes = list(range(len(x)))
    return sorted({a % len(x) for a in axes}), bool(node.attr("keepdims", 1))


def squeeze_shape(graph: Graph, node: Node, x: tuple[int, ...]) -> tuple[int, ...]:
    """Output shape of Squeeze/Unsqueeze (axes an attribute before opset 13, an input from then on)."""
    axes = const_ints(graph, node, node.inputs[1]) if _input(node, 1) else list(node.attr("axes") or [])
    try:
        return (geometry.squeeze_shape if node.op == "Squeeze" else geometry.unsqueeze_shape)(x, axes)
    except geometry.GeometryError as err:
        raise unsupported(node, str(err)) from None


RESIZE_MODES = ("half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel", "tf_half_pixel_for_nearest",
                "half_pixel_symmetric")


def resize_tables(graph: Graph, node: Node, x: tuple[int, ...]):
    """Output shape and, per resized axis (the last two only), source indices i0, i1 and the weight of
    i1, following the ONNX coordinate transforms; raises for modes the C kernel lacks."""
    mode = _text(node.attr("mode"), "nearest")
    ctm = _text(node.attr("coordinate_transformation_mode"), "half_pixel" if graph.opset >= 11 else "asymmetric")
    nearest = _text(node.attr("nearest_mode"), "round_prefer_floor")
    if mode not in ("nearest", "linear") or ctm not in RESIZE_MODES or node.attr("antialias", 0) \
            or node.attr("axes") is not None or _text(node.attr("keep_aspect_ratio_policy"), "stretch") != "stretch":
        raise unsupported(node, f"has no Resize kernel for mode '{mode}', coordinates '{ctm}'")
    if graph.opset < 11 or len(node.inputs) == 2:
        scales_in, sizes_in = node.inputs[1], ""
    else:
        scales_in, sizes_in = _input(node, 2), _input(node, 3)
    if sizes_in:
        sizes = const_ints(graph, node, sizes_in)
        scales = [s / d for s, d in zip(sizes, x)]
    else:
        if scales_in not in graph.constants:
            raise unsupported(node, "needs constant Resize scales or sizes")
        scales = [float(v) for v in np.asarray(graph.constants[scales_in], np.float32).reshape(-1)]
        sizes = [int(math.floor(d * s)) for d, s in zip(x, scales)]
    if len(sizes) != len(x) or any(s != d for s, d in zip(sizes[:-2], x[:-2])) or len(x) < 3:
        raise unsupported(node, "resizes only the last two axes of a rank 3+ tensor")
    tables = []
    for d in range(max(len(x) - 2, 0), len(x)):
        n, m, s = x[d], sizes[d], scales[d]
        r = np.arange(m, dtype=np.float64)
        if ctm == "asymmetric":
            src = r / s
        elif ctm == "align_corners":
            src = r * (n - 1) / (m - 1) if m > 1 else np.zeros(m)
        elif ctm == "pytorch_half_pixel":
            src = (r + 0.5) / s - 0.5 if m > 1 else np.zeros(m)
        elif ctm == "tf_half_pixel_for_nearest":
            src = (r + 0.5) / s
        elif ctm == "half_pixel_symmetric":
            adj = m / (s * n)
            src = n / 2 * (1 - adj) + (r + 0.5) / s - 0.5
        else:
            src = (r + 0.5) / s - 0.5
        if mode == "nearest":
            fl = np.floor(src)
            frac = src - fl
            i0 = {"round_prefer_floor": np.where(frac <= 0.5, fl, fl + 1),
                  "round_prefer_ceil": np.where(frac < 0.5, fl, fl + 1),
                  "floor": fl, "ceil": np.ceil(src)}.get(nearest)
            if i0 is None:
                raise unsupported(node, f"has no Resize kernel for nearest_mode '{nearest}'")
            i0 = np.clip(i0, 0, n - 1).astype(np.int64)
            tables.append((i0, i0, np.zeros(m)))
        else:
            src = np.clip(src, 0, n - 1)
            i0 = np.floor(src).astype(np.int64)
            i1 = np.minimum(i0 + 1, n - 1)
            tables.append((i0, i1, src - i0))
    return tuple(sizes), mode, tables


def gather_view(graph: Graph, node: Node, x: tuple[int, ...]) -> tuple[int, int, int, tuple[int, ...]]:
    """(axis, first index, step, output shape) of a Gather whose constant indices step evenly (a class
    token x[:, 0], every other row): a strided view; other index patterns are the interpreter's."""
    if node.inputs[1] not in graph.constants:
        raise unsupported(node, f"needs '{node.inputs[1]}' to be a constant")
    idx = np.asarray(graph.constants[node.inputs[1]])
    axis = int(node.attr("axis", 0)) % len(x)
    flat = idx.reshape(-1).astype(np.int64)
    if flat.size == 0 or np.any(flat < -x[axis]) or np.any(flat >= x[axis]):
        raise unsupported(node, f"got Gather indices out of range for axis {axis} of {x}")
    flat = np.where(flat < 0, flat + x[axis], flat)
    steps = np.diff(flat)
    if steps.size and np.any(steps != steps[0]):
        raise unsupported(node, "gathers only evenly spaced indices")
    return axis, int(flat[0]), int(steps[0]) if steps.size else 1, x[:axis] + tuple(idx.shape) + x[axis + 1:]


# Index dtypes a C kernel reads at run time (OpDef.c_indices); they enter C as floats of their values, exact below
# 2^24: an axis of at most MAX_INDEXED entries, so an index too large for a float's exact range is out of range
# too and never lands on a valid row.
INDEX_DTYPES = ("int32", "int64")
MAX_INDEXED = 1 << 24


def runtime_indices(graph: Graph, node: Node) -> str | None:
    """The value a node's kernel reads as indices at run time (its c_indices input, when not a constant)."""
    entry = lookup(node.op, node.domain)
    k = entry.c_indices if entry is not None else None
    if k is None or k >= len(node.inputs) or not node.inputs[k] or node.inputs[k] in graph.constants:
        return None
    return node.inputs[k]


def gather_rows(node: Node, x: tuple[int, ...], idx: tuple[int, ...]) -> tuple[int, int, int, tuple[int, ...]]:
    """(axis, its size, elements after it, output shape) of a Gather on indices known at run time only (token
    ids into an embedding table): rows copied by index, each index checked against the axis when it runs."""
    if not x:
        raise unsupported(node, "cannot gather from a scalar")
    axis = int(node.attr("axis", 0))
    if not -len(x) <= axis < len(x):
        raise unsupported(node, f"got Gather axis {axis} for data of rank {len(x)}")
    axis %= len(x)
    if x[axis] > MAX_INDEXED:
        raise unsupported(node, f"gathers by run-time indices along axes of at most {MAX_INDEXED} entries "
                                f"(axis {axis} of {x})")
    return axis, x[axis], math.prod(x[axis + 1:]), x[:axis] + tuple(idx) + x[axis + 1:]


def _gather_shape(graph: Graph, node: Node, ins: list) -> tuple[int, ...]:
    if runtime_indices(graph, node):
        return gather_rows(node, ins[0], ins[1])[3]
    return gather_view(graph, node, ins[0])[3]


def infer_shapes(graph: Graph, input_shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """Static shape of every value the graph computes; raises for ops the backend lacks."""
    shapes: dict[str, tuple[int, ...]] = {k: tuple(int(d) for d in v.shape) for k, v in graph.constants.items()}
    shapes.update(input_shapes)
    for node in graph.nodes:
        if not runs_in_c(node):
            raise unsupported(node, f"has no kernel for op '{node.op}'")
        ins = [shapes[i] if i else None for i in node.inputs]
        shapes[node.outputs[0]] = _out_shape(graph, node, ins)
        for extra in node.outputs[1:]:
            if extra:
                raise unsupported(node, f"supports only the first output of '{node.op}'")
    return shapes


def _out_shape(graph: Graph, node: Node, ins: list) -> tuple[int, ...]:
    """The output shape of a node C runs: its entry's `c_shape` hook (the kernels', attached
    below), else the input's for pointwise ops, views and same-shape ops, the broadcast for
    binary ones; raises for what the kernels cannot take."""
    op, x = node.op, ins[0]
    entry = lookup(op, node.domain)
    if entry is None or entry.c is None:
        raise unsupported(node, f"has no kernel for op '{op}'")
    if entry.c_shape is not None:
        return entry.c_shape(graph, node, ins)
    if entry.c == "binary":
        if len(node.inputs) != 2:
            raise unsupported(node, f"runs {op} on two inputs only")
        try:
            return tuple(np.broadcast_shapes(ins[0], ins[1]))
        except ValueError:
            raise unsupported(node, f"cannot broadcast shapes {ins[0]} and {ins[1]}") from None
    if entry.c in ("unary", "view") or entry.same_shape:
        return x
    raise unsupported(node, f"has no kernel for op '{op}'")


def _rank_at_most_8(node: Node, x: tuple[int, ...]) -> None:
    if len(x) > 8:
        raise unsupported(node, f"supports {node.op} up to rank 8")


def _cast_shape(graph: Graph, node: Node, ins: list) -> tuple[int, ...]:
    if int(node.attr("to", 1)) != 1:
        raise unsupported(node, "casts to float32 only")
    return ins[0]


def _layer_norm_shape(graph: Graph, node: Node, ins: list) -> tuple[int, ...]:
    x = ins[0]
    norm = x[int(node.attr("axis", -1)) % len(x):]
    for p, v in zip(ins[1:], node.inputs[1:]):
        if v and v not in graph.constants and p != norm:
            raise unsupported(node, f"needs scale and bias of shape {norm}, got {p}")
    return x


def _expand_shape(graph: Graph, node: Node, ins: list) -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(ins[0], tuple(const_ints(graph, node, node.inputs[1]))))
    except ValueError:
        raise unsupported(node, f"cannot expand shape {ins[0]}") from None


def _pad_shape(graph: Graph, node: Node, ins: list) -> tuple[int, ...]:
    x = ins[0]
    _rank_at_most_8(node, x)
    begin, end, _, _ = pad_params(graph, node, x)
    out = tuple(d + b + e for d, b, e in zip(x, begin, end))
    if any(d < 0 for d in out):
        raise unsupported(node, f"pads {begin + end} crop {x} below zero")
    return out


def _reduce_shape(graph: Graph, node: Node, ins: list) -> tuple[int, ...]:
    x = ins[0]
    _rank_at_most_8(node, x)
    axes, keep = reduce_axes(graph, node, x)
    return tuple(1 if d in axes else n for d, n in enumerate(x) if keep or d not in axes)


def _conv_shape(graph: Graph, node: Node, ins: list) -> tuple[int, ...]:
    x = ins[0]
    w = ins[1] if node.op == "Conv" else ins[3]
    win = conv_window(node, x, w)
    if x[1] != w[1] * int(node.attr("group", 1)):
        raise unsupported(node, f"got input channels {x[1]} for weights {w}")
    return (x[0], w[0], win.ow) if len(x) == 3 else (x[0], w[0], win.oh, win.ow)


def _pool_shape(graph: Graph, node: Node, ins: list) -> tuple[int, ...]:
    x = ins[0]
    win = pool_window(node, x)
    return (x[0], x[1], win.ow) if len(x) == 3 else (x[0], x[1], win.oh, win.ow)


def _gemm_shape(graph: Graph, node: Node, ins: list) -> tuple[int, ...]:
    a, b = ins[0], ins[1]
    return (a[1] if node.attr("transA", 0) else a[0], b[0] if node.attr("transB", 0) else b[1])


def _matmul_shape(graph: Graph, node: Node, ins: list) -> tuple[int, ...]:
    a, b = ins[0], ins[1]
    a2 = (1,) + a if len(a) == 1 else a
    b2 = b + (1,) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise unsupported(node, f"cannot multiply shapes {a} and {b}")
    try:
        out = tuple(np.broadcast_shapes(a2[:-2], b2[:-2])) + (a2[-2], b2[-1])
    except ValueError:
        raise unsupported(node, f"cannot broadcast the batches of {a} and {b}") from None
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return out


def _reshape_shape(graph: Graph, node: Node, ins: list) -> tuple[int, ...]:
    x = ins[0]
    target = const_ints(graph, node, node.inputs[1])
    allow0 = node.attr("allowzero", 0)
    dims = [x[i] if (t == 0 and not allow0) else t for i, t in enumerate(target)]
    if -1 in dims:
        known = math.prod(d for d in dims if d != -1)
        dims[dims.index(-1)] = math.prod(x) // max(known, 1)
    if math.prod(dims) != math.prod(x):
        raise unsupported(node, f"cannot reshape {x} to {target}")
    return tuple(dims)


def _flatten_shape(graph: Graph, node: Node, ins: list) -> tuple[int, ...]:
    x = ins[0]
    axis = int(node.attr("axis", 1))
    # ONNX's axis lies in [-r, r]: a negative one counts from the end (-r is 0, not r + 1 - r).
    axis += len(x) if axis < 0 else 0
    if not 0 <= axis <= len(x):
        raise unsupported(node, f"axis {node.attr('axis', 1)} outside [-{len(x)}, {len(x)}]")
    return (math.prod(x[:axis]), math.prod(x[axis:]))


def _transpose_shape(graph: Graph, node: Node, ins: list) -> tuple[int, ...]:
    x = ins[0]
    perm = node.attr("perm") or list(reversed(range(len(x))))
    return tuple(x[p] for p in perm)


def _concat_shape(graph: Graph, node: Node, ins: list) -> tuple[int, ...]:
    x = ins[0]
    axis = node.attr("axis") % len(x)
    return x[:axis] + (sum(s[axis] for s in ins),) + x[axis + 1:]


def _where_shape(graph: Graph, node: Node, ins: list) -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(*ins))
    except ValueError:
        raise unsupported(node, f"cannot broadcast shapes {', '.join(map(str, ins))}") from None


# The largest integer below which float32 holds every integer exactly.
EXACT_INT = 2**24


def _where_dtype(graph: Graph, node: Node, dtypes: list) -> str:
    """Where in C: a bool condition, and operands of one dtype C holds exactly (HELD), or integer constants
    every element of which float32 holds exactly; the output has the operands' dtype."""
    cond, x, y = dtypes
    if cond != "bool":
        raise unsupported(node, f"needs a bool condition, got {cond}")
    if x != y:
        raise unsupported(node, f"got operands of two dtypes, {x} and {y}")
    if x not in HELD:
        for v in node.inputs[1:]:
            arr = graph.constants.get(v)
            if arr is None or arr.dtype.kind not in "iu" or np.any(np.abs(arr.astype(np.float64)) > EXACT_INT):
                raise unsupported(node, f"runs Where on float32, bool and integers float32 holds exactly only "
                                        f"('{v}' is {x})")
    return x


attach("Where", c_shape=_where_shape, c_dtype=_where_dtype)


def _isnan_dtype(graph: Graph, node: Node, dtypes: list) -> str:
    """IsNaN in C: of a float32 input, a bool output (held as 0.0f and 1.0f)."""
    if dtypes[0] != "float32":
        raise unsupported(node, f"runs IsNaN on float32 only (got {dtypes[0]})")
    return "bool"


attach("IsNaN", c_dtype=_isnan_dtype)
attach("Gather", c_indices=1)


# The shapes the C kernels compute, and what they refuse: hooks of the ops' registry entries.
_C_SHAPES = {
    "Cast": _cast_shape, "LayerNormalization": _layer_norm_shape,
    "Squeeze": lambda graph, node, ins: squeeze_shape(graph, node, ins[0]),
    "Unsqueeze": lambda graph, node, ins: squeeze_shape(graph, node, ins[0]),
    "Slice": lambda graph, node, ins: tuple(c for _, _, c in slice_params(graph, node, ins[0])),
    "Expand": _expand_shape, "Pad": _pad_shape,
    **{op: _reduce_shape for op in ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceSumSquare",
                                     "ReduceL2")},
    "Resize": lambda graph, node, ins: resize_tables(graph, node, ins[0])[0],
    "Gather": _gather_shape,
    "QLinearMatMul": lambda graph, node, ins: _matmul_shape(graph, node, ins[::3]),
    "Conv": _conv_shape, "QLinearConv": _conv_shape, "MaxPool": _pool_shape, "AveragePool": _pool_shape,
    "GlobalAveragePool": lambda graph, node, ins: (ins[0][0], ins[0][1]) + (1,) * (len(ins[0]) - 2),
    "Gemm": _gemm_shape, "MatMul": _matmul_shape, "Reshape": _reshape_shape, "Flatten": _flatten_shape,
    "Transpose": _transpose_shape, "Concat": _concat_shape,
}
for _op, _fn in _C_SHAPES.items():
    attach(_op, c_shape=_fn)
