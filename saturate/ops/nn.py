"""Op registry, neural network family: convolutions, pools, normalizations, softmaxes, dropout."""

from __future__ import annotations

import math

from saturate.core.geometry import conv_output_shape
from saturate.core.ir import ValueInfo
from saturate.interp import kernels as k
from saturate.interp.window import average_pool, conv, global_average_pool, global_lp_pool, max_pool, max_roi_pool
from saturate.ops.cost import conv_flops, numel
from saturate.ops.registry import define


def _conv_shape(attrs: dict, ins: list) -> ValueInfo | None:
    x, w = ins[0].shape, ins[1].shape if len(ins) > 1 else None
    if w is None or len(x) < 3 or len(w) != len(x):
        return None
    out = conv_output_shape(attrs, x, w)
    return None if out is None else ValueInfo(ins[0].dtype, tuple(out))


def _pool_flops(attrs: dict, ins: list, out: ValueInfo) -> int:
    return numel(out) * math.prod(attrs.get("kernel_shape") or [1])


def _global_pool_flops(attrs: dict, ins: list, out: ValueInfo) -> int:
    return numel(ins[0]) if ins else numel(out)


def _bn_expr(node, a, operand, graph) -> str:
    return f"v * {operand(('bn_scale', node))} + {operand(('bn_shift', node))}"


def _bn_vec(node, a, operand, graph) -> str | None:
    scale, shift = operand(("bn_scale", node)), operand(("bn_shift", node))
    return None if scale is None or shift is None else f"_mm256_add_ps(_mm256_mul_ps(v, {scale}), {shift})"


define("Conv", engine=True, evaluate=conv, arity=(2, 3), shape=_conv_shape, flops=conv_flops(1, 2), draw="window",
       c="kernel")
define("MaxPool", engine=True, evaluate=max_pool, arity=(1, 1), flops=_pool_flops, draw="window", c="kernel")
define("AveragePool", engine=True, evaluate=average_pool, arity=(1, 1), flops=_pool_flops, draw="window",
       c="kernel")
define("GlobalAveragePool", engine=True, evaluate=global_average_pool, arity=(1, 1), flops=_global_pool_flops,
       c="kernel")
define("GlobalLpPool", evaluate=global_lp_pool, arity=(1, 1), flops=_global_pool_flops)
define("MaxRoiPool", evaluate=max_roi_pool, arity=(2, 2),
       flops=lambda attrs, ins, out: numel(ins[0]) if ins else numel(out))
# A C kernel of its own, and pointwise (a scale and a shift per channel) inside a fused chain.
define("BatchNormalization", same_shape=True, engine=True, evaluate=k.batch_norm, arity=(5, 5),
       flops=lambda attrs, ins, out: 2 * numel(out), domains={4: "nonnegative"}, c="kernel", param_inputs=True,
       c_expr=_bn_expr, c_vec=_bn_vec)
define("RoiAlign", enums={"mode": ("avg", "max"),
                          "coordinate_transformation_mode": ("half_pixel", "output_half_pixel")})
define("LayerNormalization", same_shape=True, c="kernel", droppable_outputs=True)
for _name in ("InstanceNormalization", "GroupNormalization", "LpNormalization", "MeanVarianceNormalization",
              "LogSoftmax", "Hardmax"):
    define(_name, same_shape=True)
define("Softmax", same_shape=True, engine=True, evaluate=k.softmax, arity=(1, 1), draw="unary", c="kernel")
# Inference: the identity (a view, copied only if it becomes a graph output); random in training
# mode, so never folded.
define("Dropout", same_shape=True, nondeterministic=True, evaluate=k.dropout, arity=(1, 3), draw="unary", c="view",
       droppable_outputs=True)
