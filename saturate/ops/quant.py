"""Op registry, quantization family: quantize, dequantize and the integer convolutions and products."""

from __future__ import annotations

from saturate.interp import quant as q
from saturate.ops.cost import conv_flops, dot_flops
from saturate.ops.registry import define


# Pointwise in C; their C expressions are the backend's (backend/pointwise.py attaches them).
define("QuantizeLinear", quant=True, evaluate=q.quantize_linear, arity=(2, 3), c="unary")
define("DequantizeLinear", quant=True, evaluate=q.dequantize_linear, arity=(2, 3), c="unary")
# The integer forms do the same multiply-adds as Conv and MatMul on 8-bit values.
define("QLinearConv", quant=True, evaluate=q.qlinear_conv, arity=(8, 9), flops=conv_flops(3, 8), c="kernel")
define("QLinearMatMul", quant=True, evaluate=q.qlinear_matmul, arity=(8, 8), flops=dot_flops(lambda attrs, a: a[-1]),
       c="kernel")
define("ConvInteger", quant=True, evaluate=q.conv_integer, arity=(2, 4), flops=conv_flops(1, None))
define("MatMulInteger", quant=True, evaluate=q.matmul_integer, arity=(2, 4), flops=dot_flops(lambda attrs, a: a[-1]))
