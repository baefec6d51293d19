"""Frontend stage: ONNX ModelProto <-> saturate.core.ir.Graph (import with shape inference, export)."""

from __future__ import annotations

import functools
import math
import re
from typing import Any, Iterable

import numpy as np
import onnx
import onnx.inliner
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from saturate.core.errors import SaturateError
from saturate.core.ir import Graph, Node, OpaqueAttr, ValueInfo
from saturate.core.limits import check_allocation, element_count, max_memory_bytes
from saturate.core.mapped import Arena, file_slice, input_slice

# The engine's rules and the interpreter's numpy kernels are written for the forms ops take from
# opset 14 (Softmax on one axis and Squeeze's axes as an input from 13; the rules match
# BatchNormalization's training_mode and Reshape's allowzero, both new at 14): older models are
# converted up to MIN_OPSET on import. Anything up to the newest opset onnx defines is read as is.
MIN_OPSET = 14
MAX_OPSET = onnx.defs.onnx_opset_version()
_DEFAULT_DOMAINS = ("", "ai.onnx")
_OPAQUE_KINDS = {AttributeProto.GRAPH: "GRAPH", AttributeProto.GRAPHS: "GRAPHS",
                 AttributeProto.SPARSE_TENSOR: "SPARSE_TENSOR", AttributeProto.SPARSE_TENSORS: "SPARSE_TENSORS",
                 AttributeProto.TYPE_PROTO: "TYPE_PROTO", AttributeProto.TYPE_PROTOS: "TYPE_PROTOS"}


# ---- import ---------------------------------------------------------------------------------
def import_model(model: onnx.ModelProto, mapped: dict[str, np.ndarray] | None = None) -> Graph:
    """Convert an ONNX model into a Graph: constants, inferred value types, typed attributes.

    A model older than MIN_OPSET is first converted to it with the ONNX version converter.
    `mapped` holds the arrays of initializers left external in `model` (see `mappable`), by name.
    """
    mapped = mapped or {}
    opset, extra = _opsets(model)
    # Before anything reads a weight or a shape (the checker, inference, the converter).
    check_tensors(model)
    _check_text(model)
    _check_declared_shapes(model.graph)
    skeleton = _without_weights(model)
    _check(skeleton)
    if model.functions:
        # Model-local functions (a partitioned model, say) are expanded into their bodies, as
        # ONNX Runtime does: every stage then sees standard ops, and export stays self-contained.
        function_domains = {f.domain for f in model.functions}
        model = onnx.inliner.inline_local_functions(model)
        used = {n.domain for n in model.graph.node}
        extra = {d: v for d, v in extra.items() if d in used or d not in function_domains}
        skeleton = _without_weights(model)
    # Read before conversion, which drops node metadata.
    marks = preserve_marks(model)
    weights: list[TensorProto] = []  # large initializers a conversion left in the original model
    if opset < MIN_OPSET:
        # After inlining: the converter drops model-local functions too.
        skeleton, model, weights = _convert(model, skeleton, opset)
        opset = MIN_OPSET
    try:
        # Strict: a node whose inputs contradict its op (an Add of [2, 64] and [64, 128]) is refused
        # here, naming the node and op, rather than optimized into a model ONNX Runtime refuses.
        inferred = infer_strictly(skeleton)[0].graph
    except Exception as err:  # inference failures are the model's fault, not ours
        raise SaturateError(f"invalid ONNX model: shape inference failed: {_first_line(err)}") from None
    og = model.graph
    g = Graph(name=og.name or "graph", opset=opset)
    if extra:
        g.meta["opset_imports"] = extra
    g.meta.update(model_fields(model))
    if marks:
        g.meta["preserve"] = sorted(marks)

    for init in list(og.initializer) + weights:
        if init.name in mapped and init.data_location == TensorProto.EXTERNAL:
            g.constants[init.name] = mapped[init.name]
        else:
            g.constants[init.name] = _array(init, f"initializer '{init.name}'")
    if og.sparse_initializer:
        raise SaturateError("sparse initializers are not supported")
    for vi in list(inferred.input) + list(inferred.value_info) + list(inferred.output):
        info = _value_info(vi)
        if info is not None and vi.name not in g.constants:
            g.values[vi.name] = info
    # An initializer also listed as an input is an input with a default value (ONNX spec,
    # `keep_initializers_as_inputs`): it stays an input, in `inputs` and in `constants`.
    g.inputs = [vi.name for vi in og.input]
    g.outputs = [vi.name for vi in og.output]

    for k, on in enumerate(og.node):
        if on.op_type == "Constant" and on.domain in _DEFAULT_DOMAINS and len(on.attribute) == 1:
            value = _constant_node_value(on.attribute[0], on)
            if value is not None:
                g.constants[on.output[0]] = value
                g.values.pop(on.output[0], None)
                continue
        inputs = list(on.input)
        while inputs and not inputs[-1]:
            inputs.pop()   # a trailing '' omits an optional input exactly as leaving it out does
        node = Node(on.op_type, inputs, list(on.output), name=on.name,
                    domain="" if on.domain == "ai.onnx" else on.domain)
        node.attrs = {a.name: _attr_value(a, node) for a in on.attribute}
        g.nodes.append(node)
    # A graph output that is directly a constant or an input needs no node; keep it as is.
    g.validate()
    return g


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


# Initializers up to this many elements keep their data for checking and shape inference
# (Reshape's target shape, Clip's bounds); larger ones only need their types.
_SKELETON_ELEMENTS = 4096


def mappable(t: TensorProto) -> bool:
    """Whether an initializer can stay in its external data file, imported as a view of the
    file's mapping: one the skeleton leaves out (`_without_weights`, so no checker or inference
    sees it without its data) whose raw bytes are a plain little-endian array."""
    return math.prod(t.dims) > _SKELETON_ELEMENTS and t.data_type in _RAW_DTYPES


def raw_dtype(t: TensorProto) -> np.dtype:
    """The numpy dtype of a `mappable` tensor's raw bytes."""
    return _RAW_DTYPES[t.data_type]


def _without_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy whose large initializers are typed graph inputs without data.

    The checker and shape inference serialize the model they get: for a ResNet that copied
    45 MB twice, more time than the whole optimization. They need the weights' types only.
    """
    g = model.graph
    big = [t for t in g.initializer if math.prod(t.dims) > _SKELETON_ELEMENTS]
    if not big:
        return model
    # Field by field, leaving the large initializers out: copying the model whole and clearing
    # them would copy every weight once more (530 MB for VGG-11).
    skeleton = onnx.ModelProto()
    _copy_fields(model, skeleton, skip="graph")
    sg = skeleton.graph
    _copy_fields(g, sg, skip="initializer")
    large = {t.name for t in big}
    sg.initializer.extend(t for t in g.initializer if t.name not in large)
    declared = {vi.name for vi in g.input}
    sg.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                    for t in big if t.name not in declared)
    return skeleton


def _check_text(model: onnx.ModelProto) -> None:
    """Refuse a name that is not UTF-8. Protobuf hands such a string field over as bytes, which
    every later stage would take for text (printing it, writing it to JSON or C)."""
    def bad(value) -> bool:
        return isinstance(value, bytes)

    def graph(g: onnx.GraphProto, where: str) -> None:
        if bad(g.name):
            raise SaturateError(f"invalid ONNX model: the name of {where} is not UTF-8")
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            if bad(vi.name):
                raise SaturateError(f"invalid ONNX model: a value name of {where} is not UTF-8")
        for t in g.initializer:
            if bad(t.name):
                raise SaturateError(f"invalid ONNX model: an initializer name of {where} is not UTF-8")
        for k, n in enumerate(g.node):
            node = f"node {k} ({n.op_type if not bad(n.op_type) else '?'}) of {where}"
            if any(bad(v) for v in (n.name, n.op_type, n.domain, *n.input, *n.output)):
                raise SaturateError(f"invalid ONNX model: a name of {node} is not UTF-8")
            for a in n.attribute:
                if bad(a.name):
                    raise SaturateError(f"invalid ONNX model: an attribute name of {node} is not UTF-8")
                for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                    graph(sub, f"a subgraph of {node}")

    if any(bad(v) for v in (model.producer_name, model.producer_version, model.domain)):
        raise SaturateError("invalid ONNX model: the producer or domain is not UTF-8")
    graph(model.graph, "the graph")


def _check_declared_shapes(g: onnx.GraphProto) -> None:
    """Refuse a graph input, output or value declared with a negative dimension or an element type
    ONNX does not define (before shape inference, whose message would not name the value)."""
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        if vi.type.HasField("tensor_type"):
            _value_info(vi)
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape"):
            dims = [d.dim_value for d in vi.type.tensor_type.shape.dim if d.HasField("dim_value")]
            if any(d < 0 for d in dims):
                raise SaturateError(f"invalid ONNX model: value '{vi.name}' is declared with a negative "
                                    f"dimension {min(dims)}")


def _copy_fields(src, dst, skip: str) -> None:
    for fd, value in src.ListFields():
        if fd.name == skip:
            continue
        if fd.is_repeated:
            getattr(dst, fd.name).extend(value)
        elif fd.message_type is not None:
            getattr(dst, fd.name).CopyFrom(value)
        else:
            setattr(dst, fd.name, value)


def _check(model: onnx.ModelProto) -> None:
    # The checker insists on a shape for every graph input and output; exporters often leave
    # one out and ONNX Runtime does not mind, so check a copy that declares them rank-free.
    probe = model
    if any(vi.type.HasField("tensor_type") and not vi.type.tensor_type.HasField("shape")
           for vi in list(model.graph.input) + list(model.graph.output)):
        probe = onnx.ModelProto()
        probe.CopyFrom(model)
        _declare_io_rank_free(probe)
    _check_dataflow(model.graph)
    try:
        onnx.checker.check_model(probe)
    except onnx.checker.ValidationError as err:
        raise SaturateError(f"invalid ONNX model: {_first_line(err)}") from None
    except UnicodeDecodeError as err:  # a name or attribute string that is not UTF-8
        raise SaturateError(f"invalid ONNX model: a string is not UTF-8 ({err.reason} at byte {err.start})") from None


def _declare_io_rank_free(model: onnx.ModelProto) -> None:
    """Give every graph input and output without a shape an empty (rank-free) one."""
    for vi in list(model.graph.input) + list(model.graph.output):
        if vi.type.HasField("tensor_type"):
            vi.type.tensor_type.shape.SetInParent()


def _check_dataflow(g: onnx.GraphProto) -> None:
    """Name the node of a value nothing defines, or of a cycle (the checker's message for both is
    "must be topologically sorted", cut off before the node)."""
    defined = {vi.name for vi in g.input} | {t.name for t in g.initializer} | {""}
    seen = set(defined)
    for n in g.node:
        if not seen.issuperset(n.input):
            break
        seen.update(n.output)
    else:
        return          # every node reads only what is defined before it: no cycle, nothing missing
    produced = {o: n for n in g.node for o in n.output if o}
    for n in g.node:
        missing = [i for i in n.input if i not in defined and i not in produced]
        if missing:
            raise SaturateError(f"invalid ONNX model: node '{n.name or n.output[0]}' ({n.op_type}) reads "
                                f"'{missing[0]}', which no node, graph input or initializer defines")
    # Kahn's algorithm: whatever is never ready lies on (or behind) a cycle.
    waiting = {id(n): len({i for i in n.input if i in produced}) for n in g.node}
    readers: dict[str, list] = {}
    for n in g.node:
        for i in {i for i in n.input if i in produced}:
            readers.setdefault(i, []).append(n)
    ready = [n for n in g.node if waiting[id(n)] == 0]
    while ready:
        for o in ready.pop().output:
            for r in readers.get(o, ()):
                waiting[id(r)] -= 1
                if waiting[id(r)] == 0:
                    ready.append(r)
    stuck = [n for n in g.node if waiting[id(n)] > 0]
    if stuck:
        n = stuck[0]
        raise SaturateError(f"invalid ONNX model: node '{n.name or n.output[0]}' ({n.op_type}) is on a cycle "
                            f"({len(stuck)} nodes depend on each other's outputs)")
    seen = set(defined)
    for n in g.node:
        late = [i for i in n.input if i not in seen]
        if late:
            raise SaturateError(f"invalid ONNX model: node '{n.name or n.output[0]}' ({n.op_type}) reads "
                                f"'{late[0]}' before the node that computes it (ONNX wants nodes in "
                                f"topological order)")
        seen.update(n.output)


def _opsets(model: onnx.ModelProto) -> tuple[int, dict[str, int]]:
    opset, extra = None, {}
    for imp in model.opset_import:
        if imp.domain in _DEFAULT_DOMAINS:
            opset = imp.version
        else:
            extra[imp.domain] = imp.version
    if opset is None:
        raise SaturateError("ONNX model imports no default-domain opset")
    if not 1 <= opset <= MAX_OPSET:
        raise SaturateError(f"unsupported ONNX opset {opset}: saturate supports opsets 1 to {MAX_OPSET} "
                            f"(below {MIN_OPSET} converted on import)")
    return opset, extra


def _convert(model: onnx.ModelProto, skeleton: onnx.ModelProto,
             opset: int) -> tuple[onnx.ModelProto, onnx.ModelProto, list[TensorProto]]:
    """The model converted from `opset` to MIN_OPSET by onnx.version_converter, or one line why not.

    Returns the converted skeleton (for shape inference), the converted model without its large
    weights and those weights, the original model's own initializers.
    """
    import onnx.version_converter

    try:
        converted = onnx.version_converter.convert_version(skeleton, MIN_OPSET)
    except Exception as err:
        # The converter's messages often name no op (`Input i is undefined!`) or print a C++
        # assertion: name the node it most likely stopped at.
        text = _first_line(err)
        text = text.split(" failed: ", 1)[-1]
        culprit = _conversion_culprit(model, opset, text)
        where = f" at node '{culprit.name or culprit.output[0]}' ({culprit.op_type})" if culprit else ""
        raise SaturateError(f"cannot convert the model from opset {opset} to {MIN_OPSET}{where}: {text}") from None
    if skeleton is model:
        return converted, converted, []
    # The converter serializes what it converts, so it got the skeleton (the weights as typed
    # inputs, which no adapter reads); the weights are then read from the original model, never
    # copied, and the graph lists the inputs the original did.
    kept = {t.name for t in skeleton.graph.initializer}
    big = [t for t in model.graph.initializer if t.name not in kept]
    moved = {t.name for t in big} - {vi.name for vi in model.graph.input}
    graph_model = onnx.ModelProto()
    graph_model.CopyFrom(converted)
    inputs = [vi for vi in graph_model.graph.input if vi.name not in moved]
    del graph_model.graph.input[:]
    graph_model.graph.input.extend(inputs)
    return converted, graph_model, big


def _conversion_culprit(model: onnx.ModelProto, opset: int, message: str) -> onnx.NodeProto | None:
    nodes = [n for n in model.graph.node if n.domain in _DEFAULT_DOMAINS]
    for n in nodes:  # an op ONNX does not define at that opset cannot be converted
        try:
            onnx.defs.get_schema(n.op_type, opset, "")
        except onnx.defs.SchemaError:
            return n

    def mentioned(word: str) -> bool:
        return bool(word) and re.search(rf"\b{re.escape(word)}\b", message) is not None

    # The op's name, else an attribute it has (`Attribute spatial must have value 1`), else a
    # value it reads (`Input i is undefined!`).
    for named in ([n for n in nodes if mentioned(n.op_type)],
                  [n for n in nodes if any(mentioned(a.name) for a in n.attribute)],
                  [n for n in nodes if any(mentioned(v) for v in n.input)]):
        if named:
            return named[0]
    return None


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[0] if lines else type(err).__name__


@functools.lru_cache(maxsize=None)
def dtype_name(elem_type: int) -> str:
    """Numpy spelling of an ONNX tensor element type ("float32", "int64", "bfloat16", ...)."""
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).name
    except Exception:
        return TensorProto.DataType.Name(elem_type).lower()


@functools.lru_cache(maxsize=None)
def elem_type(dtype: str) -> int:
    """ONNX tensor element type of a numpy dtype name."""
    try:
        return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    except Exception:
        try:
            return TensorProto.DataType.Value(dtype.upper())
        except ValueError:
            raise SaturateError(f"dtype '{dtype}' has no ONNX equivalent") from None


_ELEM_TYPES = frozenset(TensorProto.DataType.values())


def _value_info(vi: onnx.ValueInfoProto) -> ValueInfo | None:
    try:
        return type_info(vi.type)
    except SaturateError as err:
        raise SaturateError(f"value '{vi.name}': {err}") from None


def type_info(tp: onnx.TypeProto) -> ValueInfo | None:
    """The ValueInfo of a tensor TypeProto (None for sequences, maps and optionals)."""
    if not tp.HasField("tensor_type"):
        return None
    tt = tp.tensor_type
    if tt.elem_type and tt.elem_type not in _ELEM_TYPES:
        raise SaturateError(f"unknown tensor element type {tt.elem_type}")
    dtype = dtype_name(tt.elem_type) if tt.elem_type else "unknown"
    if not tt.HasField("shape"):
        return ValueInfo(dtype, None)
    dims: list[Any] = []
    for d in tt.shape.dim:
        if d.HasField("dim_value"):
            # A negative dim can only come from inference on an invalid node (an Expand to -3):
            # unknown here, the node itself fails if it is run. Declared ones are refused on import.
            dims.append(int(d.dim_value) if d.dim_value >= 0 else None)
        elif d.HasField("dim_param"):
            dims.append(d.dim_param)
        else:
            dims.append(None)
    return ValueInfo(dtype, tuple(dims))


def _constant_node_value(a: AttributeProto, on: onnx.NodeProto) -> np.ndarray | None:
    if a.name == "value" and a.type == AttributeProto.TENSOR:
        return _array(a.t, f"node '{on.name or on.output[0]}' (Constant): attribute 'value'")
    scalar = {"value_float": lambda: np.array(a.f, np.float32),
              "value_floats": lambda: np.array(list(a.floats), np.float32),
              "value_int": lambda: np.array(a.i, np.int64),
              "value_ints": lambda: np.array(list(a.ints), np.int64)}
    return scalar[a.name]() if a.name in scalar else None


def _attr_value(a: AttributeProto, node: Node) -> Any:
    t = a.type
    if t == AttributeProto.FLOAT:
        return _short_float(a.f)
    if t == AttributeProto.INT:
        return int(a.i)
    if t == AttributeProto.STRING:
        return _text(a.s)
    if t == AttributeProto.TENSOR:
        return _array(a.t, f"{node.where()}: attribute '{a.name}'")
    if t == AttributeProto.FLOATS:
        return [_short_float(v) for v in a.floats]
    if t == AttributeProto.INTS:
        return [int(v) for v in a.ints]
    if t == AttributeProto.STRINGS:
        return [_text(s) for s in a.strings]
    if t == AttributeProto.TENSORS:
        return [_array(x, f"{node.where()}: attribute '{a.name}'") for x in a.tensors]
    if t in _OPAQUE_KINDS:
        return OpaqueAttr(_OPAQUE_KINDS[t], a.SerializeToString())
    raise SaturateError(f"{node.where()}: attribute '{a.name}' has an unsupported type {t}")


def _array(t: TensorProto, what: str | None = None) -> np.ndarray:
    """The tensor's data as an array, once check_tensors has passed it: its raw_data must hold
    exactly the bytes its dims and type need."""
    what = what or f"tensor '{t.name}'"
    if t.HasField("raw_data"):
        # Each read of the field copies the bytes out of the protobuf: read it once, check its
        # length, and (plain little-endian types) keep that one copy as the array's memory; the
        # IR treats constants as immutable, so read-only is fine.
        raw = t.raw_data
        needed = raw_size(t, what)
        if needed is None:
            raise SaturateError(f"{what}: string tensors cannot hold raw_data")
        if len(raw) != needed:
            raise SaturateError(f"{what}: raw_data holds {len(raw)} bytes; {describe(t)} needs {needed}")
        dtype = _RAW_DTYPES.get(t.data_type)
        if dtype is not None:
            return np.frombuffer(raw, dtype=dtype).reshape(tuple(t.dims))
        del raw
    try:
        arr = np.array(numpy_helper.to_array(t), copy=True)
    except Exception as err:  # onnx raises ValueError, TypeError, KeyError... for malformed data
        raise SaturateError(f"{what}: cannot decode its data ({_first_line(err)})") from None
    if arr.shape != tuple(t.dims):
        raise SaturateError(f"{what}: its data holds {arr.size} values; {describe(t)} needs "
                            f"{math.prod(t.dims)}")
    return arr


# Elements of these types are packed into fewer than 8 bits in raw_data.
_PACKED_BITS = {getattr(TensorProto, name): bits for name, bits in
                (("INT4", 4), ("UINT4", 4), ("FLOAT4E2M1", 4), ("INT2", 2), ("UINT2", 2),
                 ("FLOAT6E2M3", 6), ("FLOAT6E3M2", 6)) if hasattr(TensorProto, name)}
# The repeated field each type's values go to when not in raw_data, and values per element there.
_TYPED_FIELDS = {TensorProto.FLOAT: ("float_data", 1), TensorProto.COMPLEX64: ("float_data", 2),
                 TensorProto.DOUBLE: ("double_data", 1), TensorProto.COMPLEX128: ("double_data", 2),
                 TensorProto.INT64: ("int64_data", 1), TensorProto.UINT32: ("uint64_data", 1),
                 TensorProto.UINT64: ("uint64_data", 1), TensorProto.STRING: ("string_data", 1)}
_TYPED_FIELDS.update({code: ("int32_data", 1) for code in
                      (TensorProto.INT32, TensorProto.INT16, TensorProto.INT8, TensorProto.UINT16,
                       TensorProto.UINT8, TensorProto.BOOL, TensorProto.FLOAT16, TensorProto.BFLOAT16)})


def describe(t: TensorProto) -> str:
    """`float32[3, 4]`: a tensor's type and dims as errors show them."""
    return f"{dtype_name(t.data_type)}{list(t.dims)}"


def _itemsize(t: TensorProto, what: str) -> int:
    size = _itemsize_of(t.data_type)
    if size is None:
        raise SaturateError(f"{what}: unknown element type {t.data_type}")
    return size


@functools.lru_cache(maxsize=None)
def _itemsize_of(code: int) -> int | None:
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(code)).itemsize
    except Exception:
        return None


def raw_size(t: TensorProto, what: str) -> int | None:
    """Bytes the tensor's values take as raw_data (None for strings, which have no raw form)."""
    count = element_count(t.dims, what)
    if t.data_type == TensorProto.STRING:
        return None
    bits = _PACKED_BITS.get(t.data_type)
    if bits is not None:
        return (count * bits + 7) // 8
    return count * _itemsize(t, what)


def check_tensor(t: TensorProto, what: str, limit: int | None = None) -> None:
    """Refuse a tensor whose dims are negative or too large for the memory limit, or whose typed
    data fields do not hold exactly what its dims and type need: before anything is decoded or
    allocated, trusting no size the file declares. (raw_data's length is checked where it is
    read, _array: reading the field copies it.)"""
    if t.HasField("segment"):
        raise SaturateError(f"{what}: segmented tensors are not supported")
    itemsize = _itemsize(t, what)
    limit = max_memory_bytes() if limit is None else limit
    if any(d < 0 for d in t.dims) or math.prod(t.dims) * itemsize > limit:
        check_allocation(t.dims, itemsize, f"{what} ({describe(t)})")
    if t.data_location == TensorProto.EXTERNAL or t.HasField("raw_data"):
        return  # external bytes are checked against the dims when they are read (load_graph)
    count = math.prod(t.dims)
    field, per = _TYPED_FIELDS.get(t.data_type, (None, 1))
    if field is not None and len(getattr(t, field)) != count * per:
        raise SaturateError(f"{what}: {field} holds {len(getattr(t, field))} values; {describe(t)} "
                            f"needs {count * per}")


def check_tensors(model: onnx.ModelProto) -> None:
    """check_tensor on every initializer and tensor attribute of the model (subgraphs included)."""
    graphs = [model.graph]
    limit = max_memory_bytes()
    while graphs:
        g = graphs.pop()
        for init in g.initializer:
            check_tensor(init, f"initializer '{init.name}'", limit)
        if g.sparse_initializer:
            raise SaturateError(f"sparse initializer '{g.sparse_initializer[0].values.name}': "
                                f"sparse initializers are not supported")
        for on in g.node:
            for a in on.attribute:
                if a.type in (AttributeProto.FLOAT, AttributeProto.INT, AttributeProto.STRING,
                              AttributeProto.FLOATS, AttributeProto.INTS, AttributeProto.STRINGS):
                    continue
                where = f"node '{on.name or (on.output[0] if on.output else '')}' ({on.op_type}): attribute '{a.name}'"
                for t in ([a.t] if a.HasField("t") else []) + list(a.tensors):
                    check_tensor(t, where, limit)
                # A sparse tensor is kept as it is (opaque), but whatever densifies it (onnx's
                # reference Constant) allocates its dims: those must fit too.
                for sp in ([a.sparse_tensor] if a.HasField("sparse_tensor") else []) + list(a.sparse_tensors):
                    check_allocation(sp.dims, _itemsize(sp.values, where), f"{where} (sparse, dims {list(sp.dims)})")
                graphs.extend(([a.g] if a.HasField("g") else []) + list(a.graphs))


_RAW_DTYPES = {TensorProto.FLOAT: np.dtype("<f4"), TensorProto.DOUBLE: np.dtype("<f8"),
               TensorProto.INT64: np.dtype("<i8"), TensorProto.INT32: np.dtype("<i4"),
               TensorProto.FLOAT16: np.dtype("<f2"), TensorProto.INT8: np.dtype("i1"),
               TensorProto.UINT8: np.dtype("u1")}


def _short_float(v: float) -> float:
    # ONNX stores float32; the shortest decimal of that float32 (1e-05, not 9.9999997e-06) reads
    # back to the same bits on export and is what rules and users write.
    return float(str(np.float32(v)))


def _text(b: bytes) -> str | bytes:
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return b


# ---- export ---------------------------------------------------------------------------------
def export_model(graph: Graph, weights: bool = True) -> onnx.ModelProto:
    """Convert a Graph to an ONNX model, node for node (constants as initializers). With
    `weights=False` the initializers and the shapes inferred for graph inputs and outputs that
    lack one are left out (see `model_pieces`)."""
    g = graph
    nodes = [node_proto(n, g.opset) for n in g.nodes]
    inputs = [_export_value_info(g, v) for v in g.inputs]
    outputs = [_export_value_info(g, v) for v in g.outputs]
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
    inputs contradict its op; and whether strict mode held. ONNX's strict inference fails on some
    valid ops defined by a function body (MeanVarianceNormalization at every opset): a failure
    whose first node is such an op falls back to ordinary inference."""
    try:
        return onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True), True
    except onnx.shape_inference.InferenceError as err:
        op = re.search(r"\(op_type:([A-Za-z0-9_]+)", str(err))
        if op is None or not _defined_by_function(op.group(1), model):
            raise
    return onnx.shape_inference.infer_shapes(model, data_prop=True), False


def _defined_by_function(op: str, model: onnx.ModelProto) -> bool:
    opset = next((o.version for o in model.opset_import if o.domain in _DEFAULT_DOMAINS), None)
    try:
        schema = onnx.defs.get_schema(op, opset) if opset else onnx.defs.get_schema(op)
    except onnx.defs.SchemaError:
        return False
    return schema.has_function or schema.has_context_dependent_function


def check_exported(graph: Graph, model: onnx.ModelProto) -> None:
    """Refuse to write a model the ONNX checker would refuse, with types and shapes inferred
    strictly (what its full check adds). `model` is `export_model(graph, weights=False)`; the
    check sees small constants whole (shape arithmetic reads them) and large ones as typed
    inputs, as on import."""
    probe = _light(graph, model)
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
        raise SaturateError(f"the result is not a valid ONNX model, so it was not written: "
                            f"{_first_line(err)}") from None


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


def node_proto(n: Node, opset: int) -> onnx.NodeProto:
    """The NodeProto of one node, its attributes typed as the op's schema at `opset` wants."""
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
    return proto


def _export_attr(n: Node, key: str, value: Any, opset: int) -> AttributeProto:
    if isinstance(value, OpaqueAttr):
        a = AttributeProto()
        a.ParseFromString(value.payload)
        return a
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


def _export_value_info(g: Graph, name: str) -> onnx.ValueInfoProto:
    info = g.info(name)
    if info.dtype == "unknown":
        return helper.make_empty_tensor_value_info(name)
    shape = None if info.shape is None else [d if d is not None else None for d in info.shape]
    return helper.make_tensor_value_info(name, elem_type(info.dtype), shape)
