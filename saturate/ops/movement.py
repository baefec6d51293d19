"""Op registry, data movement family: reshapes, transposes, concatenation, gathers, casts."""

from __future__ import annotations

import numpy as np
from onnx.helper import tensor_dtype_to_np_dtype

from saturate.core import geometry
from saturate.core.ir import ValueInfo
from saturate.ops.schema import VARIADIC
from saturate.interp import kernels as k
from saturate.interp.reference import pad_crops_first, resize_as_specified
from saturate.ops.cost import no_flops
from saturate.ops.registry import define

_MOVE = dict(flops=no_flops)
# Views of their input in C, whose shape and values pass through; they also take integers.
_VIEW = dict(c="view", int_move=True, empty_safe=True, flops=no_flops)
# Copies of their input's values in C: they also take integers.
_COPY = dict(c="kernel", int_move=True)


def _concat_shape(attrs: dict, ins: list) -> ValueInfo | None:
    shapes = [i.shape for i in ins]
    if len({len(sh) for sh in shapes}) != 1 or not shapes[0]:
        return None
    rank = len(shapes[0])
    axis = int(attrs.get("axis", 0))
    axis = axis + rank if axis < 0 else axis
    if not 0 <= axis < rank or any(not isinstance(sh[axis], int) for sh in shapes):
        return None
    return ValueInfo(ins[0].dtype, (*shapes[0][:axis], sum(sh[axis] for sh in shapes), *shapes[0][axis + 1:]))


def _transpose_shape(attrs: dict, ins: list) -> ValueInfo | None:
    shape = ins[0].shape
    perm = attrs.get("perm")
    perm = list(range(len(shape)))[::-1] if perm is None else [int(p) for p in perm]
    if sorted(perm) != list(range(len(shape))):
        return None
    return ValueInfo(ins[0].dtype, tuple(shape[p] for p in perm))


def _cast_shape(attrs: dict, ins: list) -> ValueInfo | None:
    return ValueInfo(np.dtype(tensor_dtype_to_np_dtype(int(attrs["to"]))).name, ins[0].shape)


def _cast_like_shape(attrs: dict, ins: list) -> ValueInfo | None:
    return ValueInfo(ins[1].dtype, ins[0].shape) if len(ins) > 1 else None


def _slice_by_data(attrs: dict, x: ValueInfo, ints, n: int, output: int, outputs: int) -> ValueInfo | None:
    if n < 3 or output != 0:
        return None
    starts, ends, axes, steps = (ints(k) for k in range(1, 5))
    if starts is None or ends is None or axes is None or steps is None:
        return None
    out = tuple(c for _, _, c in geometry.slice_ranges(tuple(x.shape), starts, ends, axes or None, steps or None))
    return ValueInfo(x.dtype, out)


def _axes_by_data(shape_of):
    def by_data(attrs: dict, x: ValueInfo, ints, n: int, output: int, outputs: int) -> ValueInfo | None:
        if output != 0:
            return None
        axes = ints(1) if n > 1 else [int(a) for a in attrs.get("axes") or ()]
        return None if axes is None else ValueInfo(x.dtype, shape_of(tuple(x.shape), axes))
    return by_data


def _split_by_data(attrs: dict, x: ValueInfo, ints, n: int, output: int, outputs: int) -> ValueInfo | None:
    shape = tuple(x.shape)
    if not shape:
        return None
    axis = int(attrs.get("axis", 0))
    if not -len(shape) <= axis < len(shape) or not isinstance(shape[axis % len(shape)], int):
        return None
    axis %= len(shape)
    split = ints(1) if n > 1 else attrs.get("split")
    if split is None:
        return None
    sizes = geometry.split_sizes(shape[axis], outputs, split or None, attrs.get("num_outputs"))
    return ValueInfo(x.dtype, (*shape[:axis], sizes[output], *shape[axis + 1:]))


def _pad_by_data(attrs: dict, x: ValueInfo, ints, n: int, output: int, outputs: int) -> ValueInfo | None:
    if n < 2 or output != 0:
        return None
    pads, axes = ints(1), ints(3)
    if pads is None or axes is None:
        return None
    begin, end = geometry.pad_amounts(len(x.shape), pads, axes or None)
    return ValueInfo(x.dtype, tuple(d + b + e if isinstance(d, int) else d if b == e == 0 else None
                                    for d, b, e in zip(x.shape, begin, end)))


define("Reshape", shape_arith=True, engine=True, evaluate=k.reshape, arity=(2, 2), param_inputs=True, **_VIEW)
define("Flatten", engine=True, evaluate=k.flatten, arity=(1, 1), **_VIEW)
define("Squeeze", shape_arith=True, engine=True, evaluate=k.squeeze, arity=(1, 2), param_inputs=True,
       shape_by_data=_axes_by_data(geometry.squeeze_shape), **_VIEW)
define("Unsqueeze", shape_arith=True, engine=True, evaluate=k.unsqueeze, arity=(1, 2), param_inputs=True,
       shape_by_data=_axes_by_data(geometry.unsqueeze_shape), **_VIEW)
define("Cast", shape_arith=True, engine=True, evaluate=k.cast, arity=(1, 1), shape=_cast_shape, c="view",
       empty_safe=True)
define("CastLike", shape_arith=True, shape=_cast_like_shape, c="view", empty_safe=True)
define("Transpose", shape_arith=True, engine=True, evaluate=k.transpose, arity=(1, 1), shape=_transpose_shape,
       empty_safe=True, **_MOVE, **_COPY)
define("Concat", shape_arith=True, engine=True, evaluate=k.concat, arity=(1, VARIADIC), shape=_concat_shape,
       empty_safe=True, **_MOVE, **_COPY)
define("Expand", shape_arith=True, param_inputs=True, empty_safe=True, **_COPY)
define("Slice", shape_arith=True, param_inputs=True, shape_by_data=_slice_by_data, **_COPY)
define("Pad", shape_arith=True, c="kernel", param_inputs=True, reference_args=pad_crops_first,
       shape_by_data=_pad_by_data,
       enums={"mode": ("constant", "reflect", "edge", "wrap")})
define("Gather", shape_arith=True, engine=True, evaluate=k.gather, arity=(2, 2), param_inputs=True, **_COPY)
define("GatherElements", evaluate=k.gather_elements, arity=(2, 2))
define("Shape", shape_arith=True, engine=True, evaluate=k.shape, arity=(1, 1))
define("Range", shape_arith=True)
define("ConstantOfShape", shape_arith=True)
define("Constant", evaluate=k.constant, arity=(0, 0), **_MOVE)
define("Split", param_inputs=True, int_move=True, shape_by_data=_split_by_data)
define("Resize", c="kernel", param_inputs=True, reference_args=resize_as_specified, enums={
    "mode": ("nearest", "linear", "cubic"),
    "nearest_mode": ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil"),
    "coordinate_transformation_mode": ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                                       "asymmetric", "tf_crop_and_resize"),
    "keep_aspect_ratio_policy": ("stretch", "not_larger", "not_smaller")})
define("Upsample", enums={"mode": ("nearest", "linear")})
define("DepthToSpace", enums={"mode": ("DCR", "CRD")})
define("GridSample", enums={"mode": ("linear", "nearest", "cubic"), "padding_mode": ("zeros", "border", "reflection")})
for _name in ("ScatterElements", "ScatterND"):
    define(_name, enums={"reduction": ("none", "add", "mul", "max", "min")})
# Deprecated at opset 11, where ScatterElements took its place with the same semantics (onnx.reference
# has no Scatter); run, as the older form of ScatterElements, at any opset.
define("Scatter", evaluate=k.scatter_elements, arity=(3, 3))
