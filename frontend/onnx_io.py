"""Frontend stage, import: ONNX ModelProto -> saturate.core.ir.Graph, with shape inference. Export
(onnx_export), tensors (onnx_tensors) and model fields (onnx_meta) are beside it; their names are
importable from here too."""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import onnx
import onnx.inliner
from onnx import AttributeProto, TensorProto, helper

from saturate.core.errors import SaturateError
from saturate.core.ir import Graph, Node, OpaqueAttr, ValueInfo
from saturate.frontend.onnx_export import (
    _declare_io_rank_free, _fill_tensor, check_exported, export_model, external_pieces, infer_strictly, model_pieces,
    name_unnamed_nodes, node_proto, type_proto, unnamed_nodes)
from saturate.frontend.infer import fill_types
from saturate.frontend.onnx_scope import check_scopes, free_names, has_subgraphs, subgraph_reads
from saturate.frontend.onnx_meta import PRESERVE_KEY, _DEFAULT_DOMAINS, mark_nodes, model_fields, preserve_marks
from saturate.frontend.onnx_tensors import (
    _SKELETON_ELEMENTS, _array, _first_line, _short_float, _text, check_tensor, check_tensors, container_type_text,
    describe, dtype_name, elem_type, mappable, raw_dtype, raw_size, type_info)

# Names of this module and of the modules split from it, importable from here as before.
__all__ = ['check_exported', 'check_tensor', 'check_tensors', 'describe', 'dtype_name', 'elem_type',
           'export_model', 'external_pieces', 'import_model', 'import_subgraph', 'infer_strictly', 'mappable',
           'mark_nodes', 'MAX_OPSET', 'MIN_OPSET', 'model_fields', 'model_pieces', 'node_proto', 'PRESERVE_KEY',
           'preserve_marks', 'raw_dtype', 'raw_size', 'type_info', 'type_proto', '_fill_tensor']

# The engine's rules and the interpreter's numpy kernels are written for the forms ops take from
# opset 14 (Softmax on one axis and Squeeze's axes as an input from 13; the rules match
# BatchNormalization's training_mode and Reshape's allowzero, both new at 14): older models are
# converted up to MIN_OPSET on import. Anything up to the newest opset onnx defines is read as is.
MIN_OPSET = 14
MAX_OPSET = onnx.defs.onnx_opset_version()
_OPAQUE_KINDS = {AttributeProto.GRAPH: "GRAPH", AttributeProto.GRAPHS: "GRAPHS",
                 AttributeProto.SPARSE_TENSOR: "SPARSE_TENSOR", AttributeProto.SPARSE_TENSORS: "SPARSE_TENSORS",
                 AttributeProto.TYPE_PROTO: "TYPE_PROTO", AttributeProto.TYPE_PROTOS: "TYPE_PROTOS"}


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
        inferred = infer_strictly(_inference_defaults(skeleton))[0].graph
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
    # An input that is also a graph output keeps its input's type: the output's declaration (no
    # shape, say) would otherwise replace the dims the input is fed with, in the model written too.
    for vi in list(inferred.value_info) + list(inferred.output) + list(inferred.input):
        info = _value_info(vi)
        if info is not None and vi.name not in g.constants:
            g.values[vi.name] = info
    # An initializer also listed as an input is an input with a default value (ONNX spec,
    # `keep_initializers_as_inputs`): it stays an input, in `inputs` and in `constants`.
    g.inputs = [vi.name for vi in og.input]
    g.outputs = [vi.name for vi in og.output]
    # A sequence or optional input or output has no ValueInfo: its type is kept for export.
    kept = {vi.name: container_type_text(vi.type) for vi in list(og.input) + list(og.output)
            if not vi.type.HasField("tensor_type")}
    if any(kept.values()):
        g.meta["value_types"] = [s for name, text in kept.items() if text for s in (name, text)]


    _import_nodes(og.node, g)
    # ONNX's inference stops at an op it does not know; a registered one (saturate.ops) types on.
    fill_types(g)
    # A graph output that is directly a constant or an input needs no node; keep it as is.
    g.validate()
    return g


def _import_nodes(nodes, g: Graph) -> None:
    """Append `nodes` (NodeProtos in order) to `g`: Constant nodes as constants, a node with
    subgraphs listing the outer values they read after its own inputs (frontend.onnx_scope)."""
    for on in nodes:
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
        node.attrs = {a.name: _attr_value(a, node) for a in on.attribute} | _omitted_defaults(on)
        if has_subgraphs(node):
            node.inputs += subgraph_reads(node)
        g.nodes.append(node)


def import_subgraph(sub: onnx.GraphProto, opset: int) -> Graph:
    """The Graph of a subgraph (If's branch, Loop's or Scan's body) as the interpreter runs it: its
    own inputs, then the names it reads from enclosing graphs as further inputs (the caller feeds
    their values); its initializers and Constant nodes as constants. Its inputs keep their element
    types and no shape: a loop-carried value may change shape from one iteration to the next."""
    g = Graph(name=sub.name or "subgraph", opset=opset)
    for init in sub.initializer:
        g.constants[init.name] = _array(init, f"initializer '{init.name}' of subgraph '{g.name}'")
    if sub.sparse_initializer:
        raise SaturateError(f"subgraph '{g.name}': sparse initializers are not supported")
    for vi in sub.input:
        info = _value_info(vi)
        if info is not None and info.dtype != "unknown":
            g.values[vi.name] = ValueInfo(info.dtype, None)
    g.inputs = [vi.name for vi in sub.input] + [n for n in free_names(sub) if n]
    g.outputs = [vi.name for vi in sub.output]
    _import_nodes(sub.node, g)
    return g


# Attributes whose ONNX shape inference reads another default than the op's schema gives: STFT's
# `onesided` is 1 by the schema and 0 to its inference, so a model omitting it (an audio front end)
# was refused for declaring the onesided frequency bins it computes. Imported nodes state them, so
# the written model (checked by the same inference) does too; the meaning is the same.
_INFERENCE_DEFAULTS = {"STFT": {"onesided": 1}}


def _omitted_defaults(node: onnx.NodeProto) -> dict:
    """The attributes of _INFERENCE_DEFAULTS that `node` leaves out, with their schema values."""
    defaults = _INFERENCE_DEFAULTS.get(node.op_type, {}) if node.domain in _DEFAULT_DOMAINS else {}
    given = {a.name for a in node.attribute}
    return {k: v for k, v in defaults.items() if k not in given}


def _inference_defaults(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model`, or a copy whose nodes state the defaults of _INFERENCE_DEFAULTS they omit and
    whose unnamed nodes, subgraphs' too, are named by their first output: ONNX's inference names
    a failing node only by its name, and saturate names an unnamed node by its output."""
    if not any(_omitted_defaults(n) for n in model.graph.node) and next(unnamed_nodes(model.graph), None) is None:
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for node in copy.graph.node:
        node.attribute.extend(helper.make_attribute(k, v) for k, v in _omitted_defaults(node).items())
    name_unnamed_nodes(copy.graph)
    return copy


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
            # Op types and domains are identifiers (ONNX's IR): every summary prints them as they
            # are, where a line break or terminal escape in one would act.
            if not (n.op_type.isprintable() and n.domain.isprintable()):
                raise SaturateError(f"invalid ONNX model: node {k} of {where} is op {n.op_type!r} of domain "
                                    f"{n.domain!r}: control characters in an op or domain")
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
    check_scopes(model.graph)
    try:
        onnx.checker.check_model(probe)
    except onnx.checker.ValidationError as err:
        raise SaturateError(f"invalid ONNX model: {_first_line(err)}") from None
    except UnicodeDecodeError as err:  # a name or attribute string that is not UTF-8
        raise SaturateError(f"invalid ONNX model: a string is not UTF-8 ({err.reason} at byte {err.start})") from None


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
        # A domain stamped twice with two versions says nothing of which one its ops are:
        # ONNX Runtime takes one, saturate took the other.
        before = opset if imp.domain in _DEFAULT_DOMAINS else extra.get(imp.domain)
        if before is not None and before != imp.version:
            raise SaturateError(f"invalid ONNX model: domain '{imp.domain or 'ai.onnx'}' is imported twice, "
                                f"at opsets {before} and {imp.version}")
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
    _check_same_io(skeleton.graph, converted.graph, opset)
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


def _check_same_io(before: onnx.GraphProto, after: onnx.GraphProto, opset: int) -> None:
    """Refuse a conversion that changed a graph input's or output's type: the converter's adapter of
    opset 8's batched Scan drops the batch axis from the graph's inputs, so the model converted would
    want other inputs than the one given."""
    types = {vi.name: vi.type for vi in list(before.input) + list(before.output)}
    for vi in list(after.input) + list(after.output):
        old = types.get(vi.name)
        if old is not None and _contradicts(old, vi.type):
            raise SaturateError(f"cannot convert the model from opset {opset} to {MIN_OPSET}: the conversion "
                                f"changes the type of graph input or output '{vi.name}' "
                                f"({_type_text(old)} to {_type_text(vi.type)})")


def _contradicts(a: onnx.TypeProto, b: onnx.TypeProto) -> bool:
    """Two types differ in kind, element type, rank or a dimension both know (a shape one of them
    leaves out is no contradiction), in their elements for sequences and optionals."""
    kind = a.WhichOneof("value")
    if kind != b.WhichOneof("value"):
        return kind is not None and b.WhichOneof("value") is not None
    if kind in ("sequence_type", "optional_type"):
        return _contradicts(getattr(a, kind).elem_type, getattr(b, kind).elem_type)
    if kind != "tensor_type":
        return a != b
    x, y = a.tensor_type, b.tensor_type
    if x.elem_type != y.elem_type:
        return True
    if not (x.HasField("shape") and y.HasField("shape")):
        return False
    if len(x.shape.dim) != len(y.shape.dim):
        return True
    return any(d.HasField("dim_value") and e.HasField("dim_value") and d.dim_value != e.dim_value
               for d, e in zip(x.shape.dim, y.shape.dim))


def _type_text(tp: onnx.TypeProto) -> str:
    kind = tp.WhichOneof("value")
    if kind in ("sequence_type", "optional_type"):
        return f"{kind.split('_')[0]}({_type_text(getattr(tp, kind).elem_type)})"
    info = type_info(tp) if kind == "tensor_type" else None
    if info is None or info.shape is None:
        return "a tensor" if info is None else info.dtype
    return f"{info.dtype}[{', '.join('?' if d is None else str(d) for d in info.shape)}]"


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


def _value_info(vi: onnx.ValueInfoProto) -> ValueInfo | None:
    try:
        return type_info(vi.type)
    except SaturateError as err:
        raise SaturateError(f"value '{vi.name}': {err}") from None


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
