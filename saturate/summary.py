"""A model's size in numbers, as onnxsim's table shows it: nodes per op, parameters, bytes, MACs.

`saturate optimize` prints the numbers of its input and its result side by side; the API gives
them for any model (saturate.model_summary)."""

from __future__ import annotations

import math
from dataclasses import field
from typing import Any, Sequence

import numpy as np

from saturate.core.errors import SaturateError
from saturate.core.ir import Graph, Node
from saturate.core.values import value_class

# The ops whose multiply-accumulates are counted (the work of most models). A convolution's
# weight is its input 1, or 3 when quantized; a product's left operand, input 0, holds K.
_CONV = {"Conv": 1, "ConvInteger": 1, "QLinearConv": 3}
_MATMUL = ("MatMul", "MatMulInteger", "QLinearMatMul", "Gemm")
COUNTED_OPS = (*_CONV, "ConvTranspose", *_MATMUL)


@value_class
class ModelSummary:
    """What a model holds: nodes per op type, parameters (elements of its constants), the bytes of
    the .onnx file saturate writes for it (None when it cannot be written), and the multiply-
    accumulates of one inference in COUNTED_OPS (None where a shape they need is symbolic or unknown;
    both None for a partitioned graph that cannot be inlined)."""

    ops: dict[str, int] = field(default_factory=dict)
    parameters: int | None = 0
    size: int | None = None
    macs: int | None = None

    @property
    def nodes(self) -> int:
        return sum(self.ops.values())

    def to_json(self) -> dict[str, Any]:
        return {"nodes": self.nodes, "ops": dict(sorted(self.ops.items())), "parameters": self.parameters,
                "size_bytes": self.size, "macs": self.macs}


def summarize(graph: Graph, size: int | None = None) -> ModelSummary:
    """The summary of `graph`; `size` is its file's bytes when the caller wrote it (by default, the
    bytes of the .onnx saturate would write, measured without writing it)."""
    if size is None:
        size = serialized_size(graph)
    # A partitioned graph's nodes are counted as they are (calls of its composites), its
    # parameters and MACs in the inlined model: a function body may hold constants.
    flat = inlined(graph)
    parameters = None if flat is None else sum(int(np.asarray(a).size) for a in flat.constants.values())
    return ModelSummary(dict(sorted(graph.op_counts().items())), parameters, size,
                        None if flat is None else graph_macs(flat))


def model_summary(model: Any) -> ModelSummary:
    """The summary of an onnx.ModelProto, a path (.onnx, text graph, example:NAME) or a Graph."""
    if isinstance(model, Graph):
        return summarize(model)
    import onnx

    if isinstance(model, onnx.ModelProto):
        from saturate.frontend.onnx_io import import_model

        return summarize(import_model(model), model.ByteSize())
    import os

    if isinstance(model, (str, os.PathLike)):
        from saturate.frontend import load_graph

        return summarize(load_graph(os.fspath(model)))
    raise SaturateError(f"model_summary takes an onnx.ModelProto, a path or a Graph, not {type(model).__name__}")


def serialized_size(graph: Graph) -> int | None:
    """Bytes of the .onnx saturate writes for `graph` (None when it would refuse to write it)."""
    from saturate.frontend.onnx_io import model_pieces
    from saturate.partition import FUNCTIONS_KEY, to_model

    try:
        if graph.meta.get(FUNCTIONS_KEY):
            return to_model(graph).ByteSize()
        return sum(len(piece) for piece in model_pieces(graph))
    except SaturateError:
        return None


def inlined(graph: Graph) -> Graph | None:
    """`graph`, or for a partitioned one (its composites called as ONNX functions) the model as
    written imported again: import inlines each call, typed at its own shapes, constants kept in
    a body among them. None if that fails."""
    from saturate.partition import FUNCTIONS_KEY

    if not graph.meta.get(FUNCTIONS_KEY):
        return graph
    from saturate.frontend.onnx_io import import_model
    from saturate.partition import to_model

    try:
        return import_model(to_model(graph))
    except SaturateError:
        return None


def graph_macs(graph: Graph) -> int | None:
    """Multiply-accumulates of one inference in COUNTED_OPS, from the static shapes the graph's
    values carry; None if one of those nodes has a symbolic or unknown shape. The calls of a
    partitioned graph's functions count what their bodies do."""
    graph = inlined(graph)
    if graph is None:
        return None
    total = 0
    for node in graph.nodes:
        if node.domain not in ("", "ai.onnx") or node.op not in COUNTED_OPS:
            continue
        macs = node_macs(node, [graph.info(i).shape if i else None for i in node.inputs],
                         graph.info(node.outputs[0]).shape)
        if macs is None:
            return None
        total += macs
    return total


def node_macs(node: Node, inputs: Sequence[tuple | None], output: tuple | None) -> int | None:
    """Multiply-accumulates of one node of COUNTED_OPS, or None when a shape it needs is not static."""
    def static(shape: tuple | None) -> tuple[int, ...] | None:
        return shape if shape is not None and all(isinstance(d, int) for d in shape) else None

    def operand(k: int) -> tuple[int, ...] | None:
        return static(inputs[k]) if k < len(inputs) else None

    out = static(output)
    if node.op in _CONV:
        # Each output element is a dot product over the weight's (C_in / group) x kernel window.
        weight = operand(_CONV[node.op])
        return None if out is None or not weight else math.prod(out) * math.prod(weight[1:])
    if node.op == "ConvTranspose":
        # Each input element is scattered over the weight's (C_out / group) x kernel window.
        x, weight = operand(0), operand(1)
        return None if x is None or not weight else math.prod(x) * math.prod(weight[1:])
    a = operand(0)
    if out is None or not a:
        return None
    k = a[0] if node.op == "Gemm" and node.attrs.get("transA", 0) else a[-1]
    return math.prod(out) * k


def format_summary(before: ModelSummary, after: ModelSummary) -> str:
    """Two columns, before and after: nodes and the op types whose count changed, parameters,
    size and MACs; "?" for what is not known."""
    changed = [op for op in sorted(set(before.ops) | set(after.ops))
               if before.ops.get(op, 0) != after.ops.get(op, 0)]
    rows = [("nodes", str(before.nodes), str(after.nodes))]
    rows += [(f"  {op}", str(before.ops.get(op, 0)), str(after.ops.get(op, 0))) for op in changed]
    rows += [("parameters", _count(before.parameters), _count(after.parameters)),
             ("model size", _bytes(before.size), _bytes(after.size)),
             ("MACs", _count(before.macs), _count(after.macs))]
    width = max(len(r[0]) for r in rows)
    cols = [max(len("before"), *(len(r[1]) for r in rows)), max(len("after"), *(len(r[2]) for r in rows))]
    lines = [f"{'':<{width}}  {'before':>{cols[0]}}  {'after':>{cols[1]}}"]
    lines += [f"{name:<{width}}  {b:>{cols[0]}}  {a:>{cols[1]}}" for name, b, a in rows]
    return "\n".join(lines)


def _count(n: int | None) -> str:
    """1,234 up to a million; 11.69 M, 1.82 G past it."""
    if n is None:
        return "?"
    for scale, unit in ((1e12, "T"), (1e9, "G"), (1e6, "M")):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:,}"


def _bytes(n: int | None) -> str:
    if n is None:
        return "?"
    for scale, unit in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"
