"""Op registry, cost: element counts, bytes and arithmetic of one node, from shapes alone."""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from saturate.core.ir import ValueInfo
from saturate.ops.registry import find, lookup


def numel(info: ValueInfo | None) -> int:
    """Element count; unknown or symbolic dimensions count as 1 (a batch of one)."""
    if info is None or info.shape is None:
        return 1
    return math.prod(d if isinstance(d, int) and d > 0 else 1 for d in info.shape)


def nbytes(info: ValueInfo | None) -> int:
    """Bytes of a value of this type."""
    try:
        size = np.dtype(info.dtype).itemsize if info is not None else 4
    except TypeError:
        size = 4
    return numel(info) * size


def flops(op: str, attrs: dict[str, Any], input_infos: Sequence[ValueInfo], output_info: ValueInfo,
          domain: str = "") -> int:
    """Arithmetic operations of one node: its entry's count, else one per output element."""
    d = lookup(op, domain) if domain else find(op)
    if d is not None and d.flops is not None:
        return d.flops(attrs, list(input_infos), output_info)
    return numel(output_info)


def no_flops(attrs: dict, ins: list, out: ValueInfo) -> int:
    """Data movement: no arithmetic."""
    return 0


def dot_flops(k_of) -> Any:
    """Flops of a product whose output elements are each a dot product of length k_of(attrs, ins)."""
    def count(attrs: dict, ins: list, out: ValueInfo) -> int:
        if not ins or not ins[0].shape:
            return numel(out)
        k = k_of(attrs, ins[0].shape)
        return 2 * numel(out) * (k if isinstance(k, int) else 1)
    return count


def conv_flops(weight: int, bias: int | None) -> Any:
    """Flops of a convolution whose weight is input `weight` and bias input `bias`: each output
    element is a dot product over (C_in / group) * kernel window."""
    def count(attrs: dict, ins: list, out: ValueInfo) -> int:
        n = numel(out)
        if len(ins) <= weight or ins[weight].shape is None:
            return n
        window = math.prod(d if isinstance(d, int) else 1 for d in ins[weight].shape[1:])
        at = len(ins) if bias is None else bias
        return 2 * n * window + (n if len(ins) > at and ins[at] else 0)
    return count
