"""ONNX's shape inference for one node: the oracle the engine's facts and the rule of any op
(its size guard) ask for an output's type."""

from __future__ import annotations

from typing import Any

import numpy as np

from saturate.core.ir import ValueInfo

# Constant inputs larger than this are passed to shape inference by type only: the inputs whose
# values decide a shape (shapes, pads, axes, bounds) are small.
DATA_ELEMENTS = 4096


def onnx_infer(op: str, attrs: dict, ins: list[ValueInfo | None], data: dict[int, Any],
               output: int, opset: int, outputs: int = 1) -> ValueInfo | None:
    """Output `output`'s type as ONNX's shape inference for `op` at `opset` derives it, for a
    node with `outputs` outputs (Split's inference checks their number)."""
    import onnx
    import onnx.defs
    from onnx import numpy_helper
    from saturate.core.ir import Node
    from saturate.frontend.onnx_io import node_proto, type_info, type_proto

    if any(i is not None and i.dtype == "unknown" for i in ins):
        return None
    try:
        schema = onnx.defs.get_schema(op, opset, "")
        names = [f"i{k}" if i is not None else "" for k, i in enumerate(ins)]
        node = node_proto(Node(op, names, [f"o{k}" for k in range(max(outputs, output + 1))], dict(attrs)), opset)
        types = {n: type_proto(i) for n, i in zip(names, ins) if i is not None}
        tensors = {}
        for k, v in data.items():
            a = np.asarray(v)
            if names[k] and a.size <= DATA_ELEMENTS and a.dtype != object:
                tensors[names[k]] = numpy_helper.from_array(a, names[k])
        out = onnx.shape_inference.infer_node_outputs(
            schema, node, types, tensors, opset_imports=[onnx.helper.make_opsetid("", opset)])
    except Exception:  # noqa: BLE001 - what ONNX cannot infer stays unknown
        return None
    tp = out.get(f"o{output}")
    info = None if tp is None else type_info(tp)
    if info is None or info.shape is None:
        return info
    # Each call names the dims it cannot tell afresh (unk__0, unk__1...): such a name says
    # nothing, and two calls' names must never read as one dim.
    return ValueInfo(info.dtype, tuple(None if isinstance(d, str) and d.startswith("unk__") else d
                                       for d in info.shape))
