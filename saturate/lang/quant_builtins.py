"""Rule builtins for quantized graphs (rules/quant.rules): quantizing constants, the int32 bias of
QLinearConv, and the guards that say when a QuantizeLinear/DequantizeLinear pair cancels.

Registered into CONST_FUNCS and GUARDS by saturate.lang.builtins and guard_builtins; the arithmetic is the
interpreter's own (saturate.interp.quant), so a folded constant equals what running the node gives.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from saturate.lang.builtin_kinds import ConstFn, GuardFn, Shape

# The element types QLinearConv and QLinearMatMul take for their quantized inputs and outputs.
_EIGHT_BIT = ("int8", "uint8")


def _axis_of(axis: Any, rank: int) -> int | None:
    a = 1 if axis is None else int(axis)     # QuantizeLinear/DequantizeLinear's default axis
    return a % rank if rank and -rank <= a < rank else None


def quantize(x: Any, scale: Any, zero_point: Any, axis: Any) -> np.ndarray:
    """ONNX QuantizeLinear of a constant: saturate(round_half_even(x / scale) + zero_point),
    per tensor or along `axis`, in the zero point's type."""
    from saturate.interp.quant import quantize_array

    return quantize_array(np.asarray(x), np.asarray(scale), np.asarray(zero_point), _axis_or_default(axis))


def dequantize(x: Any, scale: Any, zero_point: Any, axis: Any) -> np.ndarray:
    """ONNX DequantizeLinear of a constant: (x - zero_point) * scale, in the scale's type."""
    from saturate.interp.quant import dequantize_array

    return dequantize_array(np.asarray(x), np.asarray(scale), np.asarray(zero_point), _axis_or_default(axis))


def _axis_or_default(axis: Any) -> int:
    return 1 if axis is None else int(axis)


def quantize_bias(b: Any, x_scale: Any, w_scale: Any) -> np.ndarray:
    """A float bias as QLinearConv's int32 bias, as ONNX Runtime's quantizer writes it:
    round(b / (x_scale * w_scale)) (one w_scale per output channel, or one for all), saturated."""
    b = np.asarray(b, np.float64).reshape(-1)
    step = (np.asarray(x_scale, np.float32).reshape(()) * np.asarray(w_scale, np.float32).reshape(-1))
    q = np.rint(b / step.astype(np.float64))
    info = np.iinfo(np.int32)
    return np.clip(q, info.min, info.max).astype(np.int32)


# ---- guards ---------------------------------------------------------------------------------------

def quantized(dtype: Any) -> bool:
    """The value is int8 or uint8 (what the QLinear ops compute on)."""
    return str(dtype) in _EIGHT_BIT


def quant_axis(scale: Shape, axis: int | None, rank: int, want: int) -> bool:
    """A scale of one element (per tensor), or 1-D along axis `want` of a value of rank `rank`
    (per channel), given the node's `axis` attribute (absent: 1)."""
    if all(d == 1 for d in scale):
        return True
    return len(scale) == 1 and _axis_of(axis, rank) == want % max(rank, 1)


def unblocked(block_size: int | None) -> bool:
    """No block quantization (block_size absent or 0, as before opset 21)."""
    return not block_size


def same_quant(scale: Any, zero_point: Any, scale2: Any, zero_point2: Any) -> bool:
    """Two (scale, zero point) pairs are the same quantization (equal shapes, values and types)
    whose dequantized values are exact enough that QuantizeLinear undoes DequantizeLinear."""
    s, z, s2, z2 = (np.asarray(v) for v in (scale, zero_point, scale2, zero_point2))
    return (s.shape == s2.shape and z.shape == z2.shape and s.dtype == s2.dtype and z.dtype == z2.dtype
            and bool(np.all(s == s2)) and bool(np.all(z == z2)) and bool(np.all(s > 0))
            and _dequantized_exactly(s, z))


# How far DequantizeLinear's product and QuantizeLinear's quotient, computed in float32 (or
# float64), may stray beyond the rounding to the scale's own type: 2**-24 each.
_WORK_ERROR = 2.0 ** -23


def _dequantized_exactly(s: np.ndarray, z: np.ndarray) -> bool:
    """Every value DequantizeLinear makes, (q - z) * s rounded to the scale's type, quantizes back
    to q: each product is finite and normal (a subnormal loses precision), and its rounding
    error stays under half of q's step. A float16 or bfloat16 scale is too coarse for wide
    integers: 32766 * 0.5 in float16 is 16384, which quantizes to 32767."""
    import ml_dtypes

    if s.size == 0 or z.size == 0 or not (s.dtype.kind == "f" and s.dtype.isbuiltin == 1 or s.dtype.name == "bfloat16"):
        return False
    fs = np.finfo(s.dtype) if s.dtype.isbuiltin == 1 else ml_dtypes.finfo(s.dtype)
    error = 2.0 ** -(fs.nmant + 1) + _WORK_ERROR    # relative, of a product and its quotient
    s_lo, s_hi = float(s.min()), float(s.max())
    if z.dtype.kind in "iu" or z.dtype.name in ("int4", "uint4"):
        info = np.iinfo(z.dtype) if z.dtype.isbuiltin == 1 else ml_dtypes.iinfo(z.dtype)
        zf = z.astype(np.float64)
        far = max(info.max - float(zf.min()), float(zf.max()) - info.min)   # the largest |q - z|
        near = 1.0
        exact = far * error < 0.5
    elif z.dtype.name.startswith("float8") and not np.isinf(np.float32(np.inf).astype(z.dtype)):
        # Float quantized values come back by rounding to the nearest of their type, whose half step
        # is at least 2**-(nmant + 2) of the value. A type with infinities is left out: QuantizeLinear
        # saturates inf to the largest finite value.
        fz = ml_dtypes.finfo(z.dtype)
        far, near = float(fz.max), float(fz.smallest_subnormal)
        exact = error < 2.0 ** -(fz.nmant + 2) and not np.any(z.astype(np.float32))
    else:
        return False
    return exact and far * s_hi <= float(fs.max) and near * s_lo >= float(fs.tiny)


def zero_point_at_min(zero_point: Any) -> bool:
    """Every zero point is its type's lowest value (uint8 0, int8 -128): the quantized range
    starts at 0.0, so QuantizeLinear already clamps what a Relu would."""
    z = np.asarray(zero_point)
    return z.dtype.kind in "iu" and z.size > 0 and bool(np.all(z == np.iinfo(z.dtype).min))


def clip_saturates(lo: Any, hi: Any, scale: Any, zero_point: Any) -> bool:
    """Quantizing lo gives the type's lowest value and quantizing hi its highest: QuantizeLinear
    saturates whatever the Clip would have clamped, so the Clip changes nothing after it."""
    z = np.asarray(zero_point)
    if z.dtype.kind not in "iu" or np.asarray(lo).size != 1 or np.asarray(hi).size != 1:
        return False
    s = np.asarray(scale, np.float32)
    if s.size != 1 or not float(s.reshape(())) > 0:
        return False
    info = np.iinfo(z.dtype)
    q = [np.rint(np.float32(np.asarray(v).reshape(())) / s.reshape(())) + float(z.reshape(())) for v in (lo, hi)]
    return bool(q[0] <= info.min) and bool(q[1] >= info.max)


def fine_accumulator(x_scale: Any, w_scale: Any, y_scale: Any) -> bool:
    """Every x_scale * w_scale (the step of the int32 accumulator) is at most y_scale (the
    output's step): a bias rounded to accumulator steps moves the output by at most half a step."""
    acc = np.asarray(x_scale, np.float64) * np.asarray(w_scale, np.float64)
    return acc.size > 0 and bool(np.all(acc > 0)) and bool(np.all(acc <= np.asarray(y_scale, np.float64)))


def rounding_steps(steps: int) -> bool:
    """Always holds: the rule's integer outputs may differ from its left side's by up to `steps`
    (an integer op rounds once where the float ops it replaces round twice); `saturate check`
    compares them within that many steps."""
    return steps is not None and int(steps) >= 0


QUANT_FUNCS: dict[str, ConstFn] = {
    "quantize": ConstFn(4, quantize, quantize.__doc__, ("const", "const", "const", "int")),
    "dequantize": ConstFn(4, dequantize, dequantize.__doc__, ("const", "const", "const", "int")),
    "quantize_bias": ConstFn(3, quantize_bias, quantize_bias.__doc__, ("const", "const", "const")),
}

QUANT_GUARDS: dict[str, GuardFn] = {
    "quantized": GuardFn(1, quantized, quantized.__doc__, False, ("type",)),
    "quant_axis": GuardFn(4, quant_axis, quant_axis.__doc__, False, ("value", "int", "int", "int")),
    "unblocked": GuardFn(1, unblocked, unblocked.__doc__, False, ("int",)),
    "same_quant": GuardFn(4, same_quant, same_quant.__doc__, True, ("const", "const", "const", "const")),
    "zero_point_at_min": GuardFn(1, zero_point_at_min, zero_point_at_min.__doc__, True, ("const",)),
    "fine_accumulator": GuardFn(3, fine_accumulator, fine_accumulator.__doc__, True, ("const", "const", "const")),
    "rounding_steps": GuardFn(1, rounding_steps, rounding_steps.__doc__, False, ("int",)),
    "clip_saturates": GuardFn(4, clip_saturates, clip_saturates.__doc__, True, ("const", "const", "const", "const")),
}
