"""Reference interpreter, fallback: every standard op without a numpy kernel runs on `onnx.reference`."""

from __future__ import annotations

import functools
from typing import Any, Sequence

import numpy as np
import onnx
import onnx.defs
from onnx import AttributeProto, helper, numpy_helper

from saturate.core.errors import SaturateError
from saturate.core.ir import Node, OpaqueAttr
from saturate.interp.control_flow import CONTROL_FLOW_OPS
from saturate.interp.sequences import OPTIONAL_OPS, SEQUENCE_OPS
from saturate.ops.registry import lookup

__all__ = ["reference_ops", "run_reference", "unsupported_reason"]

# Constructing an op (NodeProto, attribute parsing, class lookup) costs far more than running a
# small one, so each distinct node signature (op, opset, attributes, input dtypes) builds once.
# Equal signatures mean equal behaviour, so nodes share; unlike a cache keyed by node identity
# this never goes stale when a node is edited in place or freed.
_OPS: dict[tuple, Any] = {}
_MAX_CACHED = 20_000
_NON_TENSOR = ("seq(", "optional(", "map(", "sparse_tensor(")


def _evaluator() -> tuple[Any, Any, Any]:
    """onnx.reference's ReferenceEvaluator, RuntimeContextError and load_op, imported on first
    use: importing them takes longer than a command that runs no op here takes to start."""
    from onnx.reference import ReferenceEvaluator
    from onnx.reference.op_run import RuntimeContextError
    from onnx.reference.ops import load_op

    return ReferenceEvaluator, RuntimeContextError, load_op


def _run_params(opset: int) -> dict[str, Any]:
    # What ReferenceEvaluator hands every op it builds; function-bodied ops run their body on
    # a nested evaluator of the same class.
    return {"log": lambda pattern, *args: None, "opsets": {"": opset}, "verbose": 0,
            "new_ops": {}, "existing_functions": {}, "evaluator_cls": _evaluator()[0]}


@functools.lru_cache(maxsize=None)
def _schema(op: str, opset: int) -> onnx.defs.OpSchema | None:
    try:
        return onnx.defs.get_schema(op, opset, "")
    except onnx.defs.SchemaError:
        return None


def _tensor_only_in_places(schema: onnx.defs.OpSchema) -> bool:
    """False when some input or output can only be a sequence, optional or map (not a tensor)."""
    allowed = {c.type_param_str: c.allowed_type_strs for c in schema.type_constraints}
    for param in list(schema.inputs) + list(schema.outputs):
        types = allowed.get(param.type_str, [param.type_str])
        if types and all(t.startswith(_NON_TENSOR) for t in types):
            return False
    return True


@functools.lru_cache(maxsize=None)
def unsupported_reason(op: str, opset: int) -> str | None:
    """Why a default-domain op cannot run at this opset (None: it can): on its registry entry's
    numpy kernel, else on onnx.reference. The sequence ops run on the interpreter's own kernels
    (saturate/interp/sequences.py) but are refused here: what they make is no tensor a graph can
    hold as a constant, and the constant folder asks this. Control flow runs on the interpreter's own
    code (control_flow.py); the folder leaves it alone for its subgraph attributes."""
    if op in CONTROL_FLOW_OPS and _schema(op, opset) is not None:
        return None
    entry = lookup(op)
    if entry is not None and entry.evaluate is not None and _schema(op, opset) is not None:
        return None
    return reference_reason(op, opset)


def reference_reason(op: str, opset: int) -> str | None:
    """Why onnx.reference cannot run a default-domain op at this opset (None: it can), judged
    from its schema."""
    schema = _schema(op, opset)
    if schema is None:
        return "ONNX defines no such op at this opset"
    if any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for a in schema.attributes.values()):
        if op in CONTROL_FLOW_OPS:
            return ("ops with subgraph attributes (control flow) run on the interpreter's own code only: "
                    "they are not folded or drawn")
        return "ops with subgraph attributes other than If, Loop, Scan and SequenceMap are not supported"
    if not _tensor_only_in_places(schema):
        if op in SEQUENCE_OPS or op in OPTIONAL_OPS:
            return ("a sequence or optional op, run on the interpreter's own kernels only (a graph holds no "
                    "sequence or optional constant)")
        return "map values are not supported (tensors, sequences and optionals only)"
    ReferenceEvaluator, RuntimeContextError, load_op = _evaluator()
    try:
        load_op("", op, opset, evaluator_cls=ReferenceEvaluator)
    except RuntimeContextError:
        return None  # a function body built per input types, on first use
    except Exception:
        return "onnx.reference has no implementation"
    return None


@functools.lru_cache(maxsize=None)
def reference_ops(opset: int) -> frozenset[str]:
    """The default-domain ops of this opset that the onnx.reference fallback can run."""
    names = {s.name for s in onnx.defs.get_all_schemas_with_history()
             if s.domain in ("", "ai.onnx") and not s.deprecated}
    return frozenset(n for n in names if reference_reason(n, opset) is None)


def _attr_key(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, (list, tuple)):
        return tuple(_attr_key(v) for v in value)
    return value


def _attribute(node: Node, key: str, value: Any, schema: onnx.defs.OpSchema | None) -> AttributeProto:
    if isinstance(value, OpaqueAttr):
        a = AttributeProto()
        a.ParseFromString(value.payload)
        return a
    if isinstance(value, np.ndarray):
        return helper.make_attribute(key, numpy_helper.from_array(value))
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, np.ndarray) for v in value):
        return helper.make_attribute(key, [numpy_helper.from_array(v) for v in value])
    if isinstance(value, (bool, np.integer)):
        value = int(value)
    elif isinstance(value, np.floating):
        value = float(value)
    elif isinstance(value, tuple):
        value = list(value)
    # The schema knows the element type an empty list or an int written for a float has.
    declared = schema.attributes.get(key) if schema is not None else None
    attr_type = int(declared.type) if declared is not None else None
    return helper.make_attribute(key, value, attr_type=attr_type)


def _build(node: Node, opset: int, args: Sequence[np.ndarray | None]) -> Any:
    schema = _schema(node.op, opset)
    proto = helper.make_node(node.op, list(node.inputs), list(node.outputs), name=node.name or None)
    proto.attribute.extend(_attribute(node, k, v, schema) for k, v in node.attrs.items())
    ReferenceEvaluator, RuntimeContextError, load_op = _evaluator()
    try:
        cls = load_op("", node.op, opset, evaluator_cls=ReferenceEvaluator)
    except RuntimeContextError:
        # A context-dependent function body (its expansion depends on the input types).
        types = [onnx.TypeProto() if a is None else
                 helper.make_tensor_type_proto(helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
                 for a in args]
        cls = load_op("", node.op, opset, node=proto, input_types=types, evaluator_cls=ReferenceEvaluator)
    return cls(proto, _run_params(opset))


def run_reference(node: Node, args: Sequence[np.ndarray | None], opset: int) -> list[np.ndarray]:
    """Run one default-domain node with onnx.reference; one array per output."""
    reason = reference_reason(node.op, opset)
    if reason is not None:
        raise SaturateError(f"{node.where()}: {reason} (opset {opset})")
    entry = lookup(node.op)
    if entry is not None and entry.reference_args is not None:
        args = entry.reference_args(node, args)
    key = (node.op, opset, len(node.inputs), len(node.outputs),
           tuple(sorted((k, _attr_key(v)) for k, v in node.attrs.items())),
           tuple(None if a is None else (a.dtype.str, a.ndim) for a in args))
    op = _OPS.get(key)
    try:
        if op is None:
            op = _build(node, opset, args)
            if len(_OPS) >= _MAX_CACHED:
                _OPS.clear()
            _OPS[key] = op
        with np.errstate(all="ignore"):
            results = op.run(*args)
    except SaturateError:
        raise
    except Exception as err:  # onnx.reference raises every kind; the user sees one line
        raise SaturateError(f"{node.where()}: {_first_line(err)}") from None
    outputs = []
    for k, r in enumerate(results):
        if isinstance(r, (list, dict)):
            raise SaturateError(f"{node.where()}: output {k} is a sequence or map, "
                                f"which the interpreter does not support (tensors only)")
        outputs.append(None if r is None else np.asarray(r))
    return outputs


def resize_as_specified(node: Node, args: Sequence[np.ndarray | None]) -> list[np.ndarray | None]:
    """Resize's inputs with each axis resized to length 1 under pytorch_half_pixel cut to its first
    element first. ONNX's spec reads source 0 for such an axis (ONNX Runtime and the C backend too);
    onnx.reference asks whether length * scale is 1 as a float (3 * 0.5 = 1.5 is not) and reads
    0.5 / scale - 0.5 instead: x[1] for 3 -> 1. Cut to one element, every mode reads that element."""
    args = list(args)
    mode = node.attrs.get("coordinate_transformation_mode", "half_pixel")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    policy = node.attrs.get("keep_aspect_ratio_policy", "stretch")
    policy = policy.decode() if isinstance(policy, bytes) else policy
    x = args[0] if args else None
    if mode != "pytorch_half_pixel" or x is None or x.ndim == 0:
        return args
    axes = [int(a) % x.ndim for a in node.attrs.get("axes") or range(x.ndim)]
    scales = args[2] if len(args) > 2 and args[2] is not None and args[2].size else None
    sizes = args[3] if len(args) > 3 and args[3] is not None and args[3].size else None
    if sizes is not None and policy == "stretch" and sizes.size == len(axes):
        lengths = [int(v) for v in sizes.ravel()]
    elif sizes is None and scales is not None and scales.size == len(axes):
        lengths = [int(np.floor(x.shape[a] * float(v))) for a, v in zip(axes, scales.ravel())]
    else:
        return args
    cut = [k for k, (a, n) in enumerate(zip(axes, lengths)) if n == 1 and x.shape[a] > 1]
    if not cut:
        return args
    for k in cut:
        x = x.take([0], axis=axes[k])
    args[0] = x
    if sizes is None:
        scales = scales.ravel().copy()
        scales[cut] = 1.0
        args[2] = scales
    return args


def pad_crops_first(node: Node, args: Sequence[np.ndarray | None]) -> list[np.ndarray | None]:
    """Pad's inputs with negative pads done as crops first (the spec: a negative pad removes
    elements), leaving non-negative pads: onnx.reference refuses negative pads."""
    args = list(args)
    if len(args) < 2 or args[0] is None or args[1] is None or not (np.asarray(args[1]) < 0).any():
        return args
    x, pads = args[0], np.asarray(args[1]).astype(np.int64).ravel()
    axes = args[3] if len(args) > 3 and args[3] is not None else None
    axes = [int(a) % max(x.ndim, 1) for a in np.asarray(axes).ravel()] if axes is not None else list(range(x.ndim))
    n = len(axes)
    if pads.size != 2 * n:
        return args  # onnx.reference reports the mismatch
    index = [slice(None)] * x.ndim
    for k, a in enumerate(axes):
        begin, end = max(-int(pads[k]), 0), max(-int(pads[n + k]), 0)
        index[a] = slice(begin, x.shape[a] - end if end else None)
    args[0] = x[tuple(index)]
    args[1] = np.maximum(pads, 0)
    return args


def _first_line(err: BaseException) -> str:
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    return lines[0] if lines else type(err).__name__
