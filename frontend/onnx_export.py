"""Frontend stage, export: saturate.core.ir.Graph -> ONNX ModelProto, checked as ONNX checks it,
and its bytes in pieces (weights written file to file, external data beside the model)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from saturate.core.errors import SaturateError
from saturate.core.ir import Graph, Node, OpaqueAttr, ValueInfo
from saturate.core.mapped import Arena, file_slice, input_slice
from saturate.frontend.onnx_scope import (GRAPH_KINDS, bind_subgraphs, has_subgraphs, outer_names_before,
                                         parse_attribute)
from saturate.frontend.onnx_meta import _DEFAULT_DOMAINS, _restore_model_fields, _strings
from saturate.frontend.onnx_tensors import (_RAW_DTYPES, _SKELETON_ELEMENTS, _first_line, container_type, elem_type,
                                           type_info)


def _declare_io_rank_free(model: onnx.ModelProto) -> None:
    """Give every graph input and output without a shape an empty (rank-free) one."""
    for vi in list(model.graph.input) + list(model.graph.output):
        if vi.type.HasField("tensor_type"):
            vi.type.tensor_type.shape.SetInParent()


def export_model(graph: Graph, weights: bool = True) -> onnx.ModelProto:
    """Convert a Graph to an ONNX model, node for node (constants as initializers). With
    `weights=False` the initializers and the shapes inferred for graph inputs and outputs that
    lack one are left out (see `model_pieces`)."""
    g = graph
    scopes = _subgraph_scopes(g)
    nodes = [node_proto(n, g.opset, scopes.get(id(n))) for n in g.nodes]
    kept = dict(_strings(g.meta.get("value_types"), 2))
    inputs = [_export_value_info(g, v, kept) for v in g.inputs]
    outputs = [_export_value_info(g, v, kept) for v in g.outputs]
    internal = set(g.inputs) | set(g.outputs) | set(g.constants)
    value_info = [_export_value_info(g, o) for n in g.nodes for o in n.outputs
                  if o and o not in internal and o in g.values]
    opsets = [helper.make_opsetid("", g.opset)]
    opsets += [helper.make_opsetid(d, v) for d, v in g.meta.get("opset_imports", {}).items()]
    model = helper.make_model(helper.make_graph(nodes, g.name or "graph", inputs, outputs, value_info=value_info),
                              opset_imports=opsets, producer_name="saturate")
    # Keep the IR version within what the installed ONNX Runtime accepts, but at least what the
    # opset needs (opset 23 and later came with IR versions 11 and up).
    model.ir_version = max(min(model.ir_version, 10), helper.find_min_ir_version_for(opsets, ignore_unknown=True))
    _restore_model_fields(model, g)
    if weights:
        # Weights go straight into the model's graph: make_graph and make_model would copy each
        # of them twice more.
        for name, arr in g.constants.items():
            _fill_tensor(model.graph.initializer.add(), name, arr)
        _fill_io_shapes(model)
    return model


def infer_strictly(model: onnx.ModelProto) -> tuple[onnx.ModelProto, bool]:
    """`model` with its value types inferred in ONNX's strict mode, which refuses a node whose
    inputs contradict its op (their shapes, and with check_type their element types: an Add of
    float and int64, an If on a float condition); and whether strict mode held. ONNX's strict
    inference fails on some valid ops defined by a function body (MeanVarianceNormalization at
    every opset): a failure whose first node is such an op, failing inside that body, falls back
    to ordinary inference, which still refuses element types an op does not take. A failure of
    the op itself (a Relu, which has a body too, declared to give int64) is not the body's fault."""
    try:
        return onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True), True
    except onnx.shape_inference.InferenceError as err:
        if "already exists" in str(err):
            # ONNX's data propagation keeps one entry per value name across subgraphs, and fails
            # where two subgraphs (two Ifs' branches) each define the same name, as ONNX allows:
            # infer as strictly without it.
            return onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True), True
        # The body's own failure is nested in the node's: "(op_type:Op...): [...] Inference
        # error(s): (op_type:Constant): ...".
        op = re.search(r"\(op_type:([A-Za-z0-9_]+)[^)]*\): \[\w+\] Inference error\(s\): \(op_type:", str(err))
        if op is None or not _defined_by_function(op.group(1), model):
            raise
    return onnx.shape_inference.infer_shapes(model, check_type=True, data_prop=True), False


def _defined_by_function(op: str, model: onnx.ModelProto) -> bool:
    opset = next((o.version for o in model.opset_import if o.domain in _DEFAULT_DOMAINS), None)
    try:
        schema = onnx.defs.get_schema(op, opset) if opset else onnx.defs.get_schema(op)
    except onnx.defs.SchemaError:
        return False
    return schema.has_function or schema.has_context_dependent_function


def unnamed_nodes(g: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """The nodes of `g` and of its subgraphs, at any depth, that have no name but an output."""
    for n in g.node:
        if not n.name and any(n.output):
            yield n
        for a in n.attribute:
            for sub in ([a.g] if a.type == AttributeProto.GRAPH else list(a.graphs)):
                yield from unnamed_nodes(sub)


def name_unnamed_nodes(g: onnx.GraphProto) -> None:
    """Name each unnamed node by its first output, as saturate's messages call it: ONNX's inference
    and checker name a failing node only by its name."""
    for n in list(unnamed_nodes(g)):
        n.name = next(o for o in n.output if o)


def check_exported(graph: Graph, model: onnx.ModelProto,
                   refusal: str = "the result is not a valid ONNX model, so it was not written") -> None:
    """Refuse to write a model the ONNX checker would refuse, with types and shapes inferred
    strictly (what its full check adds), in one line: `refusal`, then the checker's reason.
    `model` is `export_model(graph, weights=False)`; the check sees small constants whole (shape
    arithmetic reads them) and large ones as typed inputs, as on import."""
    probe = _light(graph, model)
    name_unnamed_nodes(probe.graph)
    # Inference takes a declared value type over what it would infer (a Tile reading float
    # repeats passes when its output is declared): infer every value afresh.
    probe.graph.ClearField("value_info")
    try:
        # The full check wants a shape on every graph output: take those inference finds.
        inferred, strict = infer_strictly(probe)
        for vi, found in zip(probe.graph.output, inferred.graph.output):
            if vi.type.HasField("tensor_type") and not vi.type.tensor_type.HasField("shape"):
                vi.type.CopyFrom(found.type)
        if strict and all(vi.type.tensor_type.HasField("shape") for vi in probe.graph.output
                          if vi.type.HasField("tensor_type")):
            onnx.checker.check_model(probe, full_check=True)     # also each op's type constraints
        else:
            _declare_io_rank_free(probe)
            onnx.checker.check_model(probe)
    except Exception as err:  # the checker's own error types differ between onnx versions
        raise SaturateError(f"{refusal}: {_first_line(err)}") from None


def check_types(graph: Graph) -> None:
    """Refuse a graph whose nodes get types their ops refuse (an Add of float and int64, a Relu of
    strings), or whose declared element types contradict what their nodes give, in one line
    naming the node and op, as import refuses such an ONNX model. Every value is inferred afresh
    from the graph's inputs and constants, then compared with its declaration: a declared type
    given to inference would hide what its node makes of the types it reads. An input the graph
    leaves untyped is not taken for float: inference then runs in ONNX's ordinary mode, which
    skips the nodes that read it and still refuses the types the others are given."""
    probe = _light(graph, export_model(graph, weights=False))
    name_unnamed_nodes(probe.graph)
    # A text graph may use another domain's op without importing the domain: inference skips
    # an op it has no schema for, once its domain is imported.
    imported = {o.domain for o in probe.opset_import}
    for domain in sorted({n.domain for n in graph.nodes} - imported - set(_DEFAULT_DOMAINS)):
        probe.opset_import.append(helper.make_opsetid(domain, 1))
    probe.graph.ClearField("value_info")
    for vi in probe.graph.output:
        vi.ClearField("type")
    # Typed as the text states: in values, as constants, or (a sequence) in meta value_types.
    stated = {*graph.values, *graph.constants, *(name for name, _ in _strings(graph.meta.get("value_types"), 2))}
    for vi in probe.graph.input:
        if vi.name not in stated:
            vi.ClearField("type")
    try:
        if all(vi.HasField("type") for vi in probe.graph.input):
            inferred = infer_strictly(probe)[0].graph
        else:
            inferred = onnx.shape_inference.infer_shapes(probe, check_type=True, data_prop=True).graph
    except Exception as err:  # inference failures are the graph's fault, not ours
        raise SaturateError(f"invalid graph: shape inference failed: {_first_line(err)}") from None
    found = {vi.name: type_info(vi.type) for vi in list(inferred.value_info) + list(inferred.output)}
    for node in graph.nodes:
        for out in node.outputs:
            declared, got = graph.values.get(out), found.get(out)
            if declared is None or got is None or "unknown" in (declared.dtype, got.dtype):
                continue
            if declared.dtype != got.dtype:
                raise SaturateError(f"invalid graph: {node.where()}: output '{out}' is declared {declared.dtype}, "
                                    f"but the op gives {got.dtype}")


def _light(graph: Graph, model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` (made without weights) with the graph's small constants as initializers
    and its large ones as typed inputs, as the skeleton on import: what checks and inference need."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    for name, arr in graph.constants.items():
        arr = np.asarray(arr)
        if arr.size <= _SKELETON_ELEMENTS:
            _fill_tensor(probe.graph.initializer.add(), name, arr)
        elif name not in graph.inputs:
            probe.graph.input.append(helper.make_tensor_value_info(name, elem_type(str(arr.dtype)), arr.shape))
    return probe


# Weights of at least this many bytes go to the data file of a model saved with external data
# (as onnx's own writer does), each at an offset a multiple of _DATA_ALIGN (a page: a reader can
# map each weight on its own, and a copy between files can share their blocks).
_EXTERNAL_MIN_BYTES = 1024


_DATA_ALIGN = 4096


def external_pieces(graph: Graph, data_name: str, arena: Arena | None = None,
                    keep_in: Path | None = None) -> tuple[list[bytes], list[bytes | np.ndarray], bool]:
    """The ONNX model `export_model` makes of `graph` with its weights in a data file named
    `data_name` beside it (for a model past protobuf's 2 GB): the model's bytes, the data file's
    pieces to write one after another, each weight the array itself (a weight still in its input
    file is copied file to file when written: `core.mapped.write_pieces`), and whether the data
    file is `arena`'s, the pieces to be appended to it: when each weight folded into the arena
    is one of the graph's, those stay where they are. With `keep_in` (the output's folder), a
    weight still in an input's data file in that folder is not copied: the model refers to it
    there."""
    model = export_model(graph, weights=False)
    check_exported(graph, model)
    io = _io_without_shapes(model)
    if io:
        # The shapes inference finds on the light probe (large weights as typed inputs), not by
        # handing it every weight.
        try:
            inferred = onnx.shape_inference.infer_shapes(_light(graph, model)).graph
        except Exception:
            inferred = onnx.GraphProto()
        known = {vi.name: vi for vi in list(inferred.value_info) + list(inferred.output)}
        for vi in io:
            if vi.name in known and known[vi.name].type.tensor_type.HasField("shape"):
                vi.type.CopyFrom(known[vi.name].type)
    placed = _placed_in(graph, arena)
    data: list[bytes | np.ndarray] = []
    offset = arena.size() if placed else 0
    for name, arr in graph.constants.items():
        arr = np.asarray(arr)
        proto = model.graph.initializer.add()
        dtype = _fill_tensor_head(proto, name, arr)
        if dtype is None:
            continue
        if arr.nbytes < _EXTERNAL_MIN_BYTES and name not in placed:
            proto.raw_data = _raw_bytes(arr, dtype)
            continue
        raw = np.asarray(arr, dtype=dtype, order="C").reshape(-1).view(np.uint8)
        where, location = placed.get(name), data_name
        kept = input_slice(raw) if keep_in is not None and where is None else None
        if kept is not None and kept[0].parent == keep_in:
            location, where = kept[0].name, kept[1]
        elif where is None:
            if offset % _DATA_ALIGN:
                data.append(bytes(_DATA_ALIGN - offset % _DATA_ALIGN))
                offset += len(data[-1])
            where = offset
            data.append(raw)
            offset += raw.nbytes
        proto.data_location = TensorProto.EXTERNAL
        for key, value in (("location", location), ("offset", str(where)), ("length", str(raw.nbytes))):
            proto.external_data.add(key=key, value=value)
    return [model.SerializeToString()], data, bool(placed)


def _placed_in(graph: Graph, arena: Arena | None) -> dict[str, int]:
    """Offsets in `arena`'s file of the constants folded into it, when every weight the arena
    holds is (exactly) one of them, in the byte order raw_data wants; else nothing (a weight no
    constant uses would be dead bytes in the data file)."""
    if arena is None or not arena.regions:
        return {}
    placed, used = {}, set()
    for name, arr in graph.constants.items():
        where = file_slice(np.asarray(arr))
        if where is not None and where[0] is arena.file:
            if np.asarray(arr).dtype != np.asarray(arr).dtype.newbyteorder("<"):
                return {}
            placed[name] = where[1]
            used.add(where[1:])
    return placed if used == set(arena.regions) else {}


def model_pieces(graph: Graph) -> list[bytes | memoryview | np.ndarray]:
    """The ONNX model `export_model` makes of `graph`, serialized, as pieces to write one after
    another: the model's other fields, then its graph, whose initializers follow its other fields,
    each weight's bytes read from the array itself. Fields may come in any order in the encoding,
    so a reader sees exactly the model `export_model` returns. Serializing that model whole copied
    every weight twice more: 0.25-0.6 s and twice the weights' memory for convnext_tiny's 114 MB."""
    model = export_model(graph, weights=False)
    check_exported(graph, model)
    if _io_without_shapes(model):
        # Inferring those shapes reads the weights (a Reshape's target, say): the whole model.
        return [export_model(graph).SerializeToString()]
    body = model.graph.SerializeToString()
    model.ClearField("graph")
    weights: list[bytes | np.ndarray] = []
    for name, arr in graph.constants.items():
        arr = np.asarray(arr)
        proto = TensorProto()
        dtype = _fill_tensor_head(proto, name, arr)
        head, data = proto.SerializeToString(), b""
        if dtype is not None:
            # Little-endian and C order as raw_data wants; the array's own memory (or mapped
            # file: core.mapped.write_pieces copies that file to file) when it is so.
            data = np.asarray(arr, dtype=dtype, order="C").reshape(-1).view(np.uint8)
            head += _RAW_DATA_TAG + _varint(len(data))
        weights += [_INITIALIZER_TAG + _varint(len(head) + len(data)) + head, data]
    size = len(body) + sum(len(w) for w in weights)        # bytes, and arrays of bytes
    return [model.SerializeToString(), _GRAPH_TAG + _varint(size) + body, *weights]


def _field_tag(message: Any, field: str) -> bytes:
    """The key of a length-delimited field of `message` (wire type 2), as it precedes its bytes."""
    return _varint(message.DESCRIPTOR.fields_by_name[field].number << 3 | 2)


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_GRAPH_TAG = _field_tag(onnx.ModelProto, "graph")


_INITIALIZER_TAG = _field_tag(onnx.GraphProto, "initializer")


_RAW_DATA_TAG = _field_tag(onnx.TensorProto, "raw_data")


def _io_without_shapes(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    return [vi for vi in list(model.graph.input) + list(model.graph.output)
            if vi.type.HasField("tensor_type") and not vi.type.tensor_type.HasField("shape")]


def _fill_io_shapes(model: onnx.ModelProto) -> None:
    # The checker wants a shape on every graph input and output; infer the ones the IR lacks.
    io = _io_without_shapes(model)
    if not io:
        return
    try:
        inferred = onnx.shape_inference.infer_shapes(model).graph
    except Exception:
        return
    known = {vi.name: vi for vi in list(inferred.value_info) + list(inferred.output)}
    for vi in io:
        if vi.name in known and known[vi.name].type.tensor_type.HasField("shape"):
            vi.type.CopyFrom(known[vi.name].type)


def _subgraph_scopes(g: Graph) -> dict[int, tuple[set[str], set[str]]]:
    """For each node with subgraphs (by id): the names defined before it and every name of the graph,
    which its subgraphs' own values must not take (onnx_scope.bind_subgraphs)."""
    if not any(has_subgraphs(n) for n in g.nodes):
        return {}
    taken = set(g.inputs) | set(g.constants) | {o for n in g.nodes for o in n.outputs if o}
    return {id(n): (visible, taken) for n, visible in outer_names_before(g.nodes, [*g.inputs, *g.constants])}


def node_proto(n: Node, opset: int, scope: tuple[set[str], set[str]] | None = None) -> onnx.NodeProto:
    """The NodeProto of one node, its attributes typed as the op's schema at `opset` wants. A node
    with subgraphs lists its own inputs only, its subgraphs reading the outer values its trailing
    inputs name (onnx_scope); `scope` holds the names of the graph around it, when known."""
    # Filled field by field: onnx.helper's make_node and make_attribute check every value on the
    # way and took 20 us a node (7 ms of densenet121's export).
    proto = onnx.NodeProto()
    proto.op_type = n.op
    proto.input.extend(n.inputs)
    proto.output.extend(n.outputs)
    if n.name:
        proto.name = n.name
    if n.domain:
        proto.domain = n.domain
    subgraphs = False
    for key, value in n.attrs.items():
        a = proto.attribute.add()
        if type(value) is int:
            a.name, a.type, a.i = key, AttributeProto.INT, value
        elif type(value) is float:
            a.name, a.type, a.f = key, AttributeProto.FLOAT, value
        elif type(value) is str:
            a.name, a.type, a.s = key, AttributeProto.STRING, value.encode()
        elif type(value) in (list, tuple) and value and all(type(v) is int for v in value):
            a.name, a.type = key, AttributeProto.INTS
            a.ints.extend(value)
        else:
            a.CopyFrom(_export_attr(n, key, value, opset))
            subgraphs = subgraphs or isinstance(value, OpaqueAttr) and value.kind in GRAPH_KINDS
    if subgraphs:
        bind_subgraphs(n, proto, *(scope or ((), ())))
    return proto


def _export_attr(n: Node, key: str, value: Any, opset: int) -> AttributeProto:
    if isinstance(value, OpaqueAttr):
        try:
            return parse_attribute(value.payload)
        except SaturateError as err:
            raise SaturateError(f"{n.where()}: attribute '{key}': {err}") from None
    if isinstance(value, np.ndarray):
        return helper.make_attribute(key, _tensor("", value))
    if isinstance(value, (list, tuple)):
        if value and all(isinstance(v, np.ndarray) for v in value):
            return helper.make_attribute(key, [_tensor("", v) for v in value])
        if not value:
            return helper.make_attribute(key, [], attr_type=_schema_attr_type(n, key, opset))
        if any(isinstance(v, float) for v in value) and all(isinstance(v, (int, float)) for v in value):
            return helper.make_attribute(key, [float(v) for v in value])
        return helper.make_attribute(key, list(value))
    if isinstance(value, (bool, np.integer)):
        value = int(value)
    elif isinstance(value, np.floating):
        value = float(value)
    try:
        return helper.make_attribute(key, value)
    except Exception as err:
        raise SaturateError(f"{n.where()}: cannot export attribute '{key}': {_first_line(err)}") from None


def _schema_attr_type(n: Node, key: str, opset: int) -> int:
    # An empty list carries no element type in Python; the op schema knows it.
    try:
        schema = onnx.defs.get_schema(n.op, opset, n.domain or "")
        return int(schema.attributes[key].type)
    except Exception:
        return AttributeProto.INTS


def _fill_tensor_head(proto: TensorProto, name: str, arr: np.ndarray) -> np.dtype | None:
    """Fill `proto` with all of `arr` but its raw_data, and return the little-endian dtype those
    bytes are to have; an array whose elements do not go to raw_data fills it whole (None)."""
    code = next((c for c, d in _RAW_DTYPES.items() if d == arr.dtype.newbyteorder("<")), None)
    if code is None:
        proto.CopyFrom(_tensor(name, arr))
        return None
    proto.name = name
    proto.data_type = code
    proto.dims.extend(arr.shape)
    return _RAW_DTYPES[code]


def _fill_tensor(proto: TensorProto, name: str, arr: np.ndarray) -> None:
    arr = np.asarray(arr)
    dtype = _fill_tensor_head(proto, name, arr)
    if dtype is not None:
        proto.raw_data = _raw_bytes(arr, dtype)


def _raw_bytes(arr: np.ndarray, dtype: np.dtype) -> bytes:
    # An imported weight is a view of the bytes its TensorProto held (_array): those bytes are
    # written back as they are. Copying them first took as long as writing them (0.37 s of
    # VGG-11's 0.8 s export).
    base = arr.base
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, bytes) and arr.dtype == dtype and arr.flags.c_contiguous and arr.nbytes == len(base):
        return base
    return np.ascontiguousarray(arr, dtype=dtype).tobytes()


def _tensor(name: str, arr: np.ndarray) -> TensorProto:
    arr = np.asarray(arr)
    if arr.dtype == object:
        return helper.make_tensor(name, TensorProto.STRING, arr.shape,
                                  [s if isinstance(s, bytes) else str(s).encode() for s in arr.flat])
    return numpy_helper.from_array(arr, name)


def type_proto(info: ValueInfo) -> onnx.TypeProto:
    """The tensor TypeProto of a ValueInfo: int dims as values, named dims as params, None as unknown."""
    shape = None if info.shape is None else [d if isinstance(d, (int, str)) else None for d in info.shape]
    return helper.make_tensor_type_proto(elem_type(info.dtype), shape)


def _export_value_info(g: Graph, name: str, kept: dict[str, str] | None = None) -> onnx.ValueInfoProto:
    """A value's ValueInfoProto: its tensor type, or the sequence or optional type import kept
    (graph.meta["value_types"]) for a graph input or output the IR holds no ValueInfo for."""
    container = container_type(kept[name]) if kept and name in kept else None
    if container is not None:
        return helper.make_value_info(name, container)
    info = g.info(name)
    if info.dtype == "unknown":
        return helper.make_empty_tensor_value_info(name)
    shape = None if info.shape is None else [d if d is not None else None for d in info.shape]
    return helper.make_tensor_value_info(name, elem_type(info.dtype), shape)
