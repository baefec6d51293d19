"""Reference interpreter, quantized ops: QuantizeLinear, DequantizeLinear and the integer forms
(QLinearConv, QLinearMatMul, ConvInteger, MatMulInteger) as numpy code, at every opset from 10.

Rounding follows the spec and ONNX Runtime: a quotient rounds half to even, then the zero point is
added and the result saturates to the output type. Requantization (QLinear ops) multiplies the
int32 accumulator, as float32, by x_scale * w_scale / y_scale computed in float32, as ONNX Runtime
does, so integer outputs agree with it bit for bit away from float32 ties.

Types numpy cannot hold (int4, float8) are left to onnx.reference (which has them from opset 19),
except bfloat16 inputs and scales: computed in float32 as float16 ones are (ONNX Runtime has no
bfloat16 quantization; onnx.reference divides in bfloat16, so it can land one step away).
"""

from __future__ import annotations

import numpy as np

from saturate.core.ir import Node
from saturate.interp.window import Unhandled, conv, fail

# The integer types these kernels write; others (int4, float8) raise Unhandled.
_QTYPES = {np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16, np.int32)}
# TensorProto element types of QuantizeLinear's output_dtype attribute (opset 21) numpy holds.
_OUTPUT_DTYPES = {2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16}


def _saturate(q: np.ndarray, dtype: np.dtype) -> np.ndarray:
    info = np.iinfo(dtype)
    return np.clip(q, info.min, info.max).astype(dtype)


def _spread(param: np.ndarray, x: np.ndarray, axis: int, block: int, name: str) -> np.ndarray:
    """A scale or zero point shaped to broadcast over x: one element per tensor, 1-D along
    `axis`, or (block > 0) a tensor of x's rank repeated in blocks of `block` along `axis`."""
    if block > 0:
        axis = _check_axis(axis, x.ndim)
        want = -(-x.shape[axis] // block)
        if param.ndim != x.ndim or param.shape[axis] != want or any(
                p != d for k, (p, d) in enumerate(zip(param.shape, x.shape)) if k != axis):
            raise ValueError(f"{name} shape {list(param.shape)} does not block input {list(x.shape)} "
                             f"by {block} along axis {axis}")
        return np.repeat(param, block, axis=axis).take(np.arange(x.shape[axis]), axis=axis)
    if param.size == 1:
        return param.reshape(())
    if param.ndim != 1:
        raise ValueError(f"{name} must be a scalar or 1-D, got shape {list(param.shape)}")
    axis = _check_axis(axis, x.ndim)
    if param.shape[0] != x.shape[axis]:
        raise ValueError(f"{name} has {param.shape[0]} elements, input axis {axis} has {x.shape[axis]}")
    return param.reshape((-1,) + (1,) * (x.ndim - axis - 1))


def _check_axis(axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise ValueError(f"axis {axis} is out of range for rank {rank}")
    return axis % rank


def _zero_point(zp: np.ndarray | None, scale: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if zp is None:
        return np.zeros(scale.shape, dtype)
    if zp.dtype != dtype:
        raise ValueError(f"zero point dtype {zp.dtype} differs from {dtype}")
    if zp.size != scale.size:
        raise ValueError(f"zero point shape {list(zp.shape)} differs from scale shape {list(scale.shape)}")
    return zp.reshape(scale.shape)


def _real(dtype: np.dtype) -> bool:
    """A floating type the kernels compute in float32: numpy's floats and bfloat16 (ml_dtypes')."""
    return dtype.kind == "f" and dtype.isbuiltin == 1 or dtype.name == "bfloat16"


def quantize_array(x: np.ndarray, scale: np.ndarray, zp: np.ndarray | None, axis: int = 1,
                   block: int = 0, dtype: np.dtype | None = None) -> np.ndarray:
    """saturate(round_half_even(x / scale) + zp) in zp's type (`dtype` when zp is None, else
    uint8), x / scale in float32 as ONNX Runtime computes it (float64 for float64 inputs)."""
    dtype = np.dtype(dtype or (zp.dtype if zp is not None else np.uint8))
    if dtype not in _QTYPES or not (x.dtype.kind in "iu" or _real(x.dtype)) or not _real(scale.dtype):
        raise TypeError(f"cannot quantize {x.dtype} by a {scale.dtype} scale to {dtype}")
    zp_full = _spread(_zero_point(zp, scale, dtype), x, axis, block, "zero point")
    s = _spread(scale, x, axis, block, "scale")
    work = np.float64 if x.dtype == np.float64 else np.float32
    q = np.rint(x.astype(work) / s.astype(work))
    return _saturate(q + zp_full.astype(np.float64), dtype)


def dequantize_array(x: np.ndarray, scale: np.ndarray, zp: np.ndarray | None, axis: int = 1,
                     block: int = 0) -> np.ndarray:
    """(x - zp) * scale in the scale's type."""
    if x.dtype not in _QTYPES or not _real(scale.dtype):
        raise TypeError(f"cannot dequantize {x.dtype} by a {scale.dtype} scale")
    if zp is not None and x.dtype == np.int32 and np.any(zp != 0):
        raise ValueError("an int32 input takes no zero point but 0")
    zp_full = _spread(_zero_point(zp, scale, x.dtype), x, axis, block, "zero point")
    s = _spread(scale, x, axis, block, "scale")
    work = np.float64 if scale.dtype == np.float64 else np.float32
    diff = x.astype(np.int64) - zp_full.astype(np.int64)
    return (diff.astype(work) * s.astype(work)).astype(scale.dtype)


def quantize_linear(node: Node, x: np.ndarray, scale: np.ndarray, zp: np.ndarray | None = None) -> np.ndarray:
    """QuantizeLinear: y = saturate(round_half_even(x / scale) + zero_point)."""
    out = int(node.attrs.get("output_dtype", 0))
    if int(node.attrs.get("precision", 0)) or (out and out not in _OUTPUT_DTYPES):
        raise Unhandled
    dtype = np.dtype(_OUTPUT_DTYPES[out]) if out else (zp.dtype if zp is not None else np.dtype(np.uint8))
    if dtype not in _QTYPES or (zp is not None and zp.dtype != dtype):
        raise Unhandled   # int4, float8: onnx.reference has them
    return quantize_array(x, scale, zp, int(node.attrs.get("axis", 1)), int(node.attrs.get("block_size", 0)), dtype)


def dequantize_linear(node: Node, x: np.ndarray, scale: np.ndarray, zp: np.ndarray | None = None) -> np.ndarray:
    """DequantizeLinear: y = (x - zero_point) * scale."""
    if x.dtype not in _QTYPES or int(node.attrs.get("output_dtype", 0)):
        raise Unhandled
    return dequantize_array(x, scale, zp, int(node.attrs.get("axis", 1)), int(node.attrs.get("block_size", 0)))


def _integer(node: Node, label: str, a: np.ndarray, *allowed: str) -> None:
    if a.dtype.name not in allowed:
        raise fail(node, f"{label} has dtype {a.dtype}, expected {' or '.join(allowed)}")


def _centred(node: Node, label: str, a: np.ndarray, zp: np.ndarray | None, axis: int | None) -> np.ndarray:
    """a - zero point as exact float64 integers; `axis` is where a 1-D zero point runs (None: scalar only)."""
    out = a.astype(np.float64)
    if zp is None:
        return out
    if zp.dtype != a.dtype:
        raise fail(node, f"{label} zero point dtype {zp.dtype} differs from its input's {a.dtype}")
    if zp.size == 1:
        return out - float(zp.reshape(()))
    if axis is None or zp.ndim != 1 or a.ndim == 0 or zp.shape[0] != a.shape[axis]:
        raise fail(node, f"{label} zero point of shape {list(zp.shape)} does not fit input {list(a.shape)}")
    return out - zp.astype(np.float64).reshape((-1,) + (1,) * (a.ndim - 1 - axis % a.ndim))


def _requantize(node: Node, acc: np.ndarray, multiplier: np.ndarray, zp: np.ndarray) -> np.ndarray:
    """saturate(round_half_even(float32(acc) * multiplier) + zp), the output in zp's type."""
    if zp.dtype.name not in ("int8", "uint8"):
        raise fail(node, f"output zero point dtype {zp.dtype} must be int8 or uint8")
    if zp.size != 1:
        raise fail(node, f"output zero point must be a scalar, got shape {list(zp.shape)}")
    scaled = np.rint(acc.astype(np.float32) * multiplier)
    return _saturate(scaled.astype(np.float64) + float(zp.reshape(())), zp.dtype)


def _scalar(node: Node, label: str, a: np.ndarray) -> np.ndarray:
    if a.size != 1:
        raise fail(node, f"{label} must be a scalar, got shape {list(a.shape)}")
    return a.reshape(()).astype(np.float32)


def _conv_accumulate(node: Node, x: np.ndarray, w: np.ndarray, x_zp, w_zp) -> np.ndarray:
    xc = _centred(node, "x", x, x_zp, None)
    wc = _centred(node, "w", w, w_zp, 0)
    return conv(node, xc, wc)


def qlinear_conv(node: Node, x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, bias=None) -> np.ndarray:
    _integer(node, "x", x, "int8", "uint8")
    _integer(node, "w", w, "int8", "uint8")
    acc = _conv_accumulate(node, x, w, x_zp, w_zp)
    m = w.shape[0]
    if bias is not None:
        _integer(node, "B", bias, "int32")
        if bias.shape != (m,):
            raise fail(node, f"bias shape {list(bias.shape)} != [{m}]")
        acc += bias.astype(np.float64).reshape((m,) + (1,) * (acc.ndim - 2))
    ws = w_scale.astype(np.float32)
    if ws.size not in (1, m):
        raise fail(node, f"w_scale has {ws.size} elements, expected 1 or {m}")
    multiplier = (_scalar(node, "x_scale", x_scale) * ws.reshape(-1)) / _scalar(node, "y_scale", y_scale)
    multiplier = multiplier.reshape((-1,) + (1,) * (acc.ndim - 2)) if ws.size == m and m > 1 \
        else multiplier.reshape(())
    return _requantize(node, acc, multiplier, y_zp)


def _matmul_accumulate(node: Node, a, b, a_zp, b_zp) -> np.ndarray:
    if a.ndim < 1 or b.ndim < 1:
        raise fail(node, "inputs must have rank >= 1")
    # A 1-D zero point runs along a's rows (axis -2) and b's columns (axis -1).
    ac = _centred(node, "A", a, a_zp, a.ndim - 2 if a.ndim >= 2 else None)
    bc = _centred(node, "B", b, b_zp, b.ndim - 1)
    try:
        return np.matmul(ac, bc)
    except ValueError:
        raise fail(node, f"shapes {list(a.shape)} and {list(b.shape)} do not multiply") from None


def qlinear_matmul(node: Node, a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp) -> np.ndarray:
    _integer(node, "a", a, "int8", "uint8")
    _integer(node, "b", b, "int8", "uint8")
    acc = _matmul_accumulate(node, a, b, a_zp, b_zp)
    bs = b_scale.astype(np.float32)
    n = b.shape[-1]
    if bs.size not in (1, n):
        raise fail(node, f"b_scale has {bs.size} elements, expected 1 or {n}")
    multiplier = (_scalar(node, "a_scale", a_scale) * bs.reshape(-1)) / _scalar(node, "y_scale", y_scale)
    return _requantize(node, acc, multiplier if bs.size == n and n > 1 else multiplier.reshape(()), y_zp)


def conv_integer(node: Node, x, w, x_zp=None, w_zp=None) -> np.ndarray:
    _integer(node, "x", x, "int8", "uint8")
    _integer(node, "w", w, "int8", "uint8")
    return _conv_accumulate(node, x, w, x_zp, w_zp).astype(np.int32)


def matmul_integer(node: Node, a, b, a_zp=None, b_zp=None) -> np.ndarray:
    _integer(node, "A", a, "int8", "uint8")
    _integer(node, "B", b, "int8", "uint8")
    return _matmul_accumulate(node, a, b, a_zp, b_zp).astype(np.int32)


QUANT_KERNELS = {
    "QuantizeLinear": (2, 3, quantize_linear),
    "DequantizeLinear": (2, 3, dequantize_linear),
    "QLinearConv": (8, 9, qlinear_conv),
    "QLinearMatMul": (8, 8, qlinear_matmul),
    "ConvInteger": (2, 4, conv_integer),
    "MatMulInteger": (2, 4, matmul_integer),
}
