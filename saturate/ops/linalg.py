"""Op registry, linear algebra family: MatMul and Gemm."""

from __future__ import annotations

from saturate.core.ir import ValueInfo
from saturate.interp import kernels as k
from saturate.ops.cost import dot_flops
from saturate.ops.infer import broadcast_shape
from saturate.ops.registry import define


def _matmul_shape(attrs: dict, ins: list) -> ValueInfo | None:
    if len(ins) < 2:
        return None
    a, b = ins[0].shape, ins[1].shape
    if len(a) < 2 or len(b) < 2:
        return None
    batch = broadcast_shape(a[:-2], b[:-2])
    return None if batch is None else ValueInfo(ins[0].dtype, (*batch, a[-2], b[-1]))


def _gemm_shape(attrs: dict, ins: list) -> ValueInfo | None:
    if len(ins) < 2:
        return None
    a, b = ins[0].shape, ins[1].shape
    if len(a) != 2 or len(b) != 2:
        return None
    return ValueInfo(ins[0].dtype, (a[1] if attrs.get("transA") else a[0], b[0] if attrs.get("transB") else b[1]))


define("MatMul", engine=True, evaluate=k.matmul, arity=(2, 2), shape=_matmul_shape,
       flops=dot_flops(lambda attrs, a: a[-1]), c="kernel")
define("Gemm", engine=True, evaluate=k.gemm, arity=(2, 3), shape=_gemm_shape,
       flops=dot_flops(lambda attrs, a: a[0] if attrs.get("transA", 0) else a[-1]), c="kernel")
