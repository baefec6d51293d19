"""What an ONNX model says about itself beside its graph: producer, doc strings, metadata (kept
through import and written back on export) and the nodes it marks as preserved."""

from __future__ import annotations

from typing import Any, Iterable

import onnx
from onnx import helper

from saturate.core.ir import Graph

# The names of ONNX's default operator domain.
_DEFAULT_DOMAINS = ("", "ai.onnx")


# What the input model said about itself beside its graph, kept in graph.meta under these keys
# (flat, printable values, so the text form keeps them too) and written back on export:
# model field -> meta key. `producer` (producer_name) predates the others.
_MODEL_FIELDS = {"producer_name": "producer", "producer_version": "producer_version", "domain": "model_domain",
                 "doc_string": "model_doc", "model_version": "model_version"}


def model_fields(model: onnx.ModelProto) -> dict[str, Any]:
    """The meta entries of a model's IR version, producer, domain, version, doc strings, metadata
    and named nodes' doc strings: those that are set. A string protobuf hands over as bytes (not
    UTF-8) is left out."""
    meta: dict[str, Any] = {"ir_version": int(model.ir_version)}
    for f, key in _MODEL_FIELDS.items():
        value = getattr(model, f)
        if value and isinstance(value, (str, int)):
            meta[key] = value
    if model.graph.doc_string and isinstance(model.graph.doc_string, str):
        meta["graph_doc"] = model.graph.doc_string
    props = [s for p in model.metadata_props if isinstance(p.key, str) and isinstance(p.value, str)
             for s in (p.key, p.value)]
    if props:
        meta["metadata"] = props
    docs = [s for n in model.graph.node if n.name and n.doc_string
            and all(isinstance(v, str) for v in (n.name, n.op_type, n.doc_string))
            for s in (n.name, n.op_type, n.doc_string)]
    if docs:
        meta["node_docs"] = docs
    return meta


def _strings(value: Any, group: int) -> list[tuple[str, ...]]:
    """A flat list of strings (as model_fields writes it, or a text graph's meta) in tuples of
    `group`; anything else, nothing."""
    if not isinstance(value, (list, tuple)) or len(value) % group or not all(isinstance(v, str) for v in value):
        return []
    return [tuple(value[k:k + group]) for k in range(0, len(value), group)]


def _restore_model_fields(model: onnx.ModelProto, graph: Graph) -> None:
    """Write back what import recorded of the input model (model_fields): producer, domain, doc
    strings, metadata and node doc strings (where a node kept its name and op); its IR version,
    within what the installed onnx knows and at least what the opsets need."""
    meta = graph.meta
    for f, key in _MODEL_FIELDS.items():
        value = meta.get(key)
        if isinstance(value, str) and f != "model_version":
            setattr(model, f, value)
        elif f == "model_version" and type(value) is int and 0 <= value < 2**63:
            model.model_version = value
    if isinstance(meta.get("graph_doc"), str):
        model.graph.doc_string = meta["graph_doc"]
    for key, value in _strings(meta.get("metadata"), 2):
        model.metadata_props.add(key=key, value=value)
    docs = {name: (op, doc) for name, op, doc in _strings(meta.get("node_docs"), 3)}
    if docs:
        for node in model.graph.node:
            doc = docs.get(node.name)
            if doc and doc[0] == node.op_type:
                node.doc_string = doc[1]
    ir = meta.get("ir_version")
    if type(ir) is int and ir > 0:
        needed = helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True)
        model.ir_version = max(min(ir, onnx.IR_VERSION), needed)


# A node is marked in an ONNX model by a metadata entry on the node (`saturate.preserve` = `1`),
# or the model lists node names under the same key (comma-separated). No rewrite may change it.
PRESERVE_KEY = "saturate.preserve"


_TRUE = {"1", "true", "yes"}


def preserve_marks(model: onnx.ModelProto) -> set[str]:
    """Names (node name, else first output) of the nodes the model marks as preserved."""
    names: set[str] = set()
    for prop in model.metadata_props:
        if prop.key == PRESERVE_KEY:
            names.update(n.strip() for n in prop.value.split(",") if n.strip())
    for node in model.graph.node:
        if any(p.key == PRESERVE_KEY and p.value.strip().lower() in _TRUE for p in node.metadata_props):
            names.add(node.name or node.output[0])
    return names


def mark_nodes(model: onnx.ModelProto, names: Iterable[str]) -> onnx.ModelProto:
    """Mark nodes of `model` as preserved (in place), by node name or first output."""
    wanted = set(names)
    for node in model.graph.node:
        if node.name in wanted or (node.output and node.output[0] in wanted):
            node.metadata_props.add(key=PRESERVE_KEY, value="1")
    return model
