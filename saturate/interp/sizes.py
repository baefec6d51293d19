"""Reference interpreter, sizes: the shape of what a node is about to allocate, worked out from its
inputs and attributes before the kernel runs, so that a model which asks for terabytes from small
inputs (a ConstantOfShape of [1 << 20, 1 << 20], an outer-product broadcast, a Tile, a Range) fails
in one line instead of exhausting the machine.

Only ops whose output can be much larger than their inputs are sized here; an upper bound is fine
(padding counted as if every stride were 1). Anything the kernel would refuse anyway (incompatible
shapes, negative sizes) is left to the kernel, which names the problem better.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from saturate.core.ir import Node, ValueInfo, dtype_name
from saturate.core.limits import check_allocation
from saturate.ops.registry import lookup

Shape = tuple[int, ...]
# Bytes per element of the dtypes inference names (strings and the like are not sized).
_ITEMSIZES = {d: np.dtype(d).itemsize for d in ("float16", "float32", "float64", "int8", "uint8", "int16",
                                                "uint16", "int32", "uint32", "int64", "uint64", "bool",
                                                "complex64", "complex128")}
# op -> function(node, inputs) -> (shape, itemsize) per output it sizes, or None when it cannot tell.
_SIZERS: dict[str, Callable[[Node, Sequence[np.ndarray | None]], list[tuple[Shape, int]] | None]] = {}


def check_output_sizes(node: Node, args: Sequence[np.ndarray | None]) -> None:
    """One line naming the node, its output and the size, when an output would be over the limit."""
    sizer = _SIZERS.get(node.op) if node.domain in ("", "ai.onnx") else None
    if sizer is None:
        return
    try:
        sized = sizer(node, args)
    except (ValueError, TypeError, IndexError, KeyError, OverflowError):
        return  # malformed inputs or attributes: the kernel reports them
    for k, (shape, itemsize) in enumerate(sized or ()):
        if any(d < 0 for d in shape):
            continue
        name = node.outputs[k] if k < len(node.outputs) and node.outputs[k] else str(k)
        check_allocation(shape, itemsize, f"{node.where()}: output '{name}' {list(shape)}")


# Ops whose outputs hold no more elements than their inputs (or a rank's worth more): inference
# has nothing to add for them, and it costs about a millisecond a node.
_BOUNDED = frozenset({
    "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Slice", "Concat", "Split", "Identity",
    "Shape", "Size", "Cast", "CastLike", "Softmax", "LogSoftmax", "Hardmax", "LayerNormalization",
    "BatchNormalization", "InstanceNormalization", "GroupNormalization", "RMSNormalization",
    "LpNormalization", "MeanVarianceNormalization", "Dropout", "DepthToSpace", "SpaceToDepth", "TopK",
    "NonZero", "Compress", "ReverseSequence", "ScatterND", "ScatterElements", "Scatter",
    "GatherElements", "ArgMax", "ArgMin", "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin",
    "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare",
    "GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool", "CumSum", "Trilu", "EyeLike", "Unique",
    "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "Det"})


def check_inferred_sizes(node: Node, args: Sequence[np.ndarray | None], opset: int) -> None:
    """For a node no sizer above covers: ONNX's inference of the node on the actual inputs, small
    integer ones as data, so that an output sized by a value (HannWindow's size, DFT's length,
    Col2Im's image shape...) is refused in one line before the kernel allocates it, whatever a
    graph declared (a declared shape holds for the values it was inferred from). What inference
    cannot tell is left to the kernel."""
    if node.op in _SIZERS or node.op in _BOUNDED or node.domain not in ("", "ai.onnx"):
        return
    entry = lookup(node.op)
    if entry is not None and (entry.elementwise or entry.same_shape):
        return
    from saturate.frontend.infer import DATA_ELEMENTS, onnx_infer

    ins = [None if a is None else ValueInfo(dtype_name(a.dtype), tuple(a.shape)) for a in args]
    data = {k: a for k, a in enumerate(args)
            if a is not None and a.dtype.kind in "iub" and a.size <= DATA_ELEMENTS}
    for k, out in enumerate(node.outputs):
        info = onnx_infer(node.op, node.attrs, ins, data, k, opset, len(node.outputs)) if out else None
        if info is not None and info.is_static() and info.dtype in _ITEMSIZES:
            check_allocation(info.shape, _ITEMSIZES[info.dtype], f"{node.where()}: output '{out}' {info.dtype}{list(info.shape)}")


def _ints(a: np.ndarray | None) -> list[int]:
    return [] if a is None else [int(v) for v in np.asarray(a).reshape(-1)]


def _sizer(*ops: str):
    def register(fn):
        for op in ops:
            _SIZERS[op] = fn
        return fn
    return register


def _itemsize(node: Node, args, default: int = 4) -> int:
    return max((a.dtype.itemsize for a in args if a is not None), default=default)


@_sizer("ConstantOfShape")
def _constant_of_shape(node, args):
    value = node.attrs.get("value")
    itemsize = value.dtype.itemsize if isinstance(value, np.ndarray) else 4
    return [(tuple(_ints(args[0])), itemsize)]


@_sizer("Expand")
def _expand(node, args):
    return [(np.broadcast_shapes(args[0].shape, tuple(_ints(args[1]))), args[0].dtype.itemsize)]


@_sizer("Tile")
def _tile(node, args):
    repeats = _ints(args[1])
    if len(repeats) != args[0].ndim:
        return None
    return [(tuple(d * r for d, r in zip(args[0].shape, repeats)), args[0].dtype.itemsize)]


@_sizer("Range")
def _range(node, args):
    start, limit, delta = (float(np.asarray(a).reshape(-1)[0]) for a in args[:3])
    if delta == 0 or not all(map(math.isfinite, (start, limit, delta))):
        return None
    return [((max(math.ceil((limit - start) / delta), 0),), args[0].dtype.itemsize)]


_COMPARISONS = {"Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual", "And", "Or", "Xor", "Not"}


@_sizer("Add", "Sub", "Mul", "Div", "Pow", "Mod", "Max", "Min", "Sum", "Mean", "Where", "PRelu",
        "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor", *_COMPARISONS)
def _broadcast(node, args):
    present = [a for a in args if a is not None]
    values = present[1:] if node.op == "Where" else present  # Where's condition is bool
    itemsize = 1 if node.op in _COMPARISONS else _itemsize(node, values)
    return [(np.broadcast_shapes(*(a.shape for a in present)), itemsize)]


@_sizer("MatMul", "MatMulInteger", "QLinearMatMul")
def _matmul(node, args):
    a, b = (args[0], args[1]) if node.op != "QLinearMatMul" else (args[0], args[3])
    if a.ndim < 1 or b.ndim < 1:
        return None
    rows = a.shape[-2:-1] if a.ndim > 1 else ()
    cols = b.shape[-1:] if b.ndim > 1 else ()
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return [(tuple(batch) + tuple(rows) + tuple(cols), max(a.dtype.itemsize, 4))]


@_sizer("Gemm")
def _gemm(node, args):
    a, b = args[0], args[1]
    if a.ndim != 2 or b.ndim != 2:
        return None
    m = a.shape[1] if int(node.attrs.get("transA", 0)) else a.shape[0]
    n = b.shape[0] if int(node.attrs.get("transB", 0)) else b.shape[1]
    return [((m, n), a.dtype.itemsize)]


@_sizer("Gather")
def _gather(node, args):
    data, indices = args[0], args[1]
    axis = int(node.attrs.get("axis", 0)) % max(data.ndim, 1)
    return [(data.shape[:axis] + indices.shape + data.shape[axis + 1:], data.dtype.itemsize)]


@_sizer("OneHot")
def _one_hot(node, args):
    indices, depth = args[0], int(np.asarray(args[1]).reshape(-1)[0])
    axis = int(node.attrs.get("axis", -1))
    shape = list(indices.shape)
    shape.insert(axis % (len(shape) + 1) if axis < 0 else axis, depth)
    return [(tuple(shape), args[2].dtype.itemsize if len(args) > 2 and args[2] is not None else 4)]


@_sizer("Pad")
def _pad(node, args):
    x = args[0]
    pads = _ints(args[1]) if len(args) > 1 and args[1] is not None else _ints(node.attrs.get("pads"))
    axes = _ints(args[3]) if len(args) > 3 and args[3] is not None else list(range(x.ndim))
    if len(pads) != 2 * len(axes):
        return None
    shape = list(x.shape)
    for k, axis in enumerate(axes):
        shape[axis % x.ndim] += pads[k] + pads[k + len(axes)]
    return [(tuple(shape), x.dtype.itemsize)]


@_sizer("Resize", "Upsample")
def _resize(node, args):
    x = args[0]
    if node.op == "Upsample":
        scales = [float(s) for s in (args[1] if len(args) > 1 else node.attrs.get("scales", []))]
        sizes = []
    else:
        scales = [float(s) for s in np.asarray(args[2]).reshape(-1)] if len(args) > 2 and args[2] is not None else []
        sizes = _ints(args[3]) if len(args) > 3 and args[3] is not None else []
    axes = _ints(node.attrs.get("axes")) or list(range(x.ndim))
    shape = list(x.shape)
    if sizes and len(sizes) == len(axes):
        for axis, n in zip(axes, sizes):
            shape[axis % x.ndim] = n
    elif scales and len(scales) == len(axes) and all(map(math.isfinite, scales)):
        for axis, s in zip(axes, scales):
            shape[axis % x.ndim] = math.floor(shape[axis % x.ndim] * s)
    else:
        return None
    return [(tuple(shape), x.dtype.itemsize)]


@_sizer("RandomNormal", "RandomUniform")
def _random(node, args):
    return [(tuple(_ints(node.attrs.get("shape"))), 8)]


@_sizer("Multinomial")
def _multinomial(node, args):
    # The uniform draws behind the samples are float64, one per sample.
    return [((args[0].shape[0], int(node.attrs.get("sample_size", 1))), 8)]


@_sizer("Conv", "ConvTranspose", "MaxPool", "AveragePool", "LpPool")
def _window(node, args):
    x = args[0]
    if x.ndim < 3:
        return None
    spatial = x.ndim - 2
    pads = _ints(node.attrs.get("pads")) or [0] * (2 * spatial)
    if len(pads) != 2 * spatial:
        return None
    channels = x.shape[1]
    if node.op == "Conv":
        channels = args[1].shape[0]
    elif node.op == "ConvTranspose":
        channels = args[1].shape[1] * int(node.attrs.get("group", 1))
    dims = []
    for k in range(spatial):
        n = x.shape[2 + k] + pads[k] + pads[k + spatial]
        if node.op == "ConvTranspose":
            strides = _ints(node.attrs.get("strides")) or [1] * spatial
            kernel = args[1].shape[2 + k]
            dilations = _ints(node.attrs.get("dilations")) or [1] * spatial
            out = _ints(node.attrs.get("output_shape"))
            n = out[k] if len(out) == spatial else (
                strides[k] * max(x.shape[2 + k] - 1, 0) + (kernel - 1) * dilations[k] + 1
                + (_ints(node.attrs.get("output_padding")) or [0] * spatial)[k])
        dims.append(n)
    return [((x.shape[0], channels, *dims), x.dtype.itemsize)]
