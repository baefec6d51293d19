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
    from saturate.frontend.onnx_export import node_proto, type_proto
    from saturate.frontend.onnx_tensors import type_info

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


def fill_types(graph: Any) -> int:
    """Type the values ONNX's whole-graph inference left unknown behind an op it does not know
    (a registered op of another domain, saturate.ops): in graph order, such a node's first
    output gets its type from the op's entry, and a standard node whose inputs are now typed
    gets its outputs from ONNX's inference of that node. Returns how many values it typed; a
    graph with no registered op outside ONNX is left as it is."""
    from saturate.ops.infer import infer_type
    from saturate.ops.registry import lookup

    if not any(n.domain not in ("", "ai.onnx") and lookup(n.op, n.domain) is not None for n in graph.nodes):
        return 0
    typed = 0
    for node in graph.nodes:
        missing = [k for k, o in enumerate(node.outputs) if o and o not in graph.values and o not in graph.constants]
        if not missing:
            continue
        ins = [graph.info(i) if i else None for i in node.inputs]
        if any(i is not None and i.shape is None for i in ins):
            continue                    # an input still untyped: so is what it feeds
        for k in missing:
            if node.domain not in ("", "ai.onnx"):
                info = (infer_type(node.op, node.attrs, ins, node.domain)
                        if k == 0 and lookup(node.op, node.domain) is not None else None)
            else:
                data = {j: graph.constants[i] for j, i in enumerate(node.inputs) if i in graph.constants}
                info = onnx_infer(node.op, node.attrs, ins, data, k, graph.opset, len(node.outputs))
            if info is not None and info.shape is not None:
                graph.values[node.outputs[k]] = info
                typed += 1
    return typed
