"""Folding any op: the rule schema `op(xs:const...) => evaluate(op, xs...)`, its guards and its
constant function.

A rule whose left side is an op variable applied to a list of constants matches a node of every
op whose inputs are all constants (saturate.engine.fold_any compiles it once per op and input
count the e-graph holds). Its right side evaluates the node with the interpreter's kernel for
that op and opset (saturate.interp.eval_node), in the fold stage like every constant expression.
Its guards read the matched node: `foldable(op)` (an op whose value is a function of its inputs,
in the standard domain, that the interpreter runs) and `fold_fits(op, xs)` (a result whose size,
known from shape inference before anything is computed, is within the run's --max-fold-bytes or
no larger than the constant inputs it replaces).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from saturate.core.values import FACTORY
from saturate.lang.ast import Call, Rule
from saturate.ops.registry import ops_with

# What a fold may add to the model unless its inputs were as large: a result larger than this and
# than the constants it reads stays a node. onnxsim's own threshold (--no-large-tensor, 1.5 GB
# unless given, only for Tile, ConstantOfShape and Expand) would let one Expand grow a model by
# gigabytes; this one lets a relative-position table (a few hundred KiB) fold and keeps an
# Expand to a whole activation's size.
DEFAULT_MAX_FOLD_BYTES = 1 << 20

# A quantized model stores its weights as DequantizeLinear of 8-bit integers: folded, each would
# be stored four times as large in float, which is what quantizing it was to avoid (ONNX Runtime's
# constant folding leaves it too). rules/quant.rules turns the weight's readers into integer ops.
KEPT_QUANTIZED = frozenset({"DequantizeLinear"})

EVALUATE = "evaluate"       # the constant function of the schema's right side
SPEC = "matched_node"       # its first argument: the matched node, computed per match
_PLAIN = (bool, int, float, str, bytes, np.ndarray)


def check_fold_bytes(value: Any) -> int:
    """A --max-fold-bytes value (bytes as an int, or a size such as 512K, 16M) as bytes; None is
    the default. A SaturateError names a value that is no size."""
    import re

    from saturate.core.errors import SaturateError
    from saturate.core.limits import _UNITS

    if value is None:
        return DEFAULT_MAX_FOLD_BYTES
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 0:
        return int(value)
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([a-zA-Z]*)\s*", value) if isinstance(value, str) else None
    if m is not None and m.group(2).lower() in _UNITS:
        size = float(m.group(1)) * _UNITS[m.group(2).lower()]
        if math.isfinite(size):
            return int(size)
    raise SaturateError(f"--max-fold-bytes {str(value)[:40]!r}: expected a size in bytes such as 0, 4096, 512K or 16M")


# A dataclass with its methods written out, as saturate.core.ir's (dataclass compiles them at
# every import); tests/test_startup.py holds it against @dataclass of the same fields.
@dataclass(init=False, repr=False, eq=False)
class Matched:
    """The node a schema rule matched, as its guards and its right side read it."""

    op: str
    attrs: dict[str, Any]
    output: int = 0             # which output of the node the match's root is
    outputs: int = 1            # how many outputs the node lists
    opset: int = 0
    domain: str = ""
    preserved: bool = False     # named by --preserve: the user keeps it as it is
    max_bytes: int = DEFAULT_MAX_FOLD_BYTES
    inputs: list[Any] = field(default_factory=list)   # constant values (None: an omitted input)

    def __init__(self, op: str, attrs: dict[str, Any], output: int = 0, outputs: int = 1, opset: int = 0,
                 domain: str = "", preserved: bool = False, max_bytes: int = DEFAULT_MAX_FOLD_BYTES,
                 inputs: list[Any] = FACTORY) -> None:
        self.op = op
        self.attrs = attrs
        self.output = output
        self.outputs = outputs
        self.opset = opset
        self.domain = domain
        self.preserved = preserved
        self.max_bytes = max_bytes
        self.inputs = [] if inputs is FACTORY else inputs

    def _values(self) -> tuple:
        return (self.op, self.attrs, self.output, self.outputs, self.opset, self.domain, self.preserved,
                self.max_bytes, self.inputs)

    def __repr__(self) -> str:
        return (f"{self.__class__.__qualname__}(op={self.op!r}, attrs={self.attrs!r}, output={self.output!r}, "
                f"outputs={self.outputs!r}, opset={self.opset!r}, domain={self.domain!r}, "
                f"preserved={self.preserved!r}, max_bytes={self.max_bytes!r}, inputs={self.inputs!r})")

    def __eq__(self, other: object) -> bool:
        if other.__class__ is self.__class__:
            return self._values() == other._values()
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    @property
    def spec(self) -> tuple:
        """What `evaluate` needs of the node, as a literal (hashable, compared by value)."""
        return (self.op, tuple(sorted((k, _literal(v)) for k, v in self.attrs.items())),
                self.output, self.outputs, self.opset, self.domain)


def _literal(v: Any) -> Any:
    return tuple(_literal(x) for x in v) if isinstance(v, list) else v


def _plain_attr(v: Any) -> bool:
    if isinstance(v, (list, tuple)):
        return all(_plain_attr(x) for x in v)
    return isinstance(v, _PLAIN) or v is None


# ---- guards -------------------------------------------------------------------------------------

def foldable(m: Matched) -> bool:
    """The op is deterministic, in the standard domain, not kept by --preserve, with plain
    attributes (no subgraph: no If, Loop or Scan) and tensors only (no sequence or optional
    values), and the interpreter runs it at the model's opset."""
    from saturate.ops.schema import spec
    from saturate.interp.reference import unsupported_reason

    if m.domain not in ("", "ai.onnx") or m.preserved or m.op in KEPT_QUANTIZED \
            or m.op in ops_with("nondeterministic"):
        return False
    if not all(_plain_attr(v) for v in m.attrs.values()):
        return False
    if spec(m.op, m.opset) is None:
        return False
    return unsupported_reason(m.op, m.opset) is None or m.op in ops_with("evaluates")


def plausible(op: str, opset: int) -> bool:
    """What `foldable` says of an op from its schema alone (no interpreter loaded): whether a rule
    instance for it is worth compiling."""
    import onnx
    from onnx import AttributeProto

    if op in ops_with("nondeterministic") or op in KEPT_QUANTIZED:
        return False
    try:
        schema = onnx.defs.get_schema(op, opset, "")
    except onnx.defs.SchemaError:
        return False
    if any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for a in schema.attributes.values()):
        return False
    allowed = {c.type_param_str: c.allowed_type_strs for c in schema.type_constraints}
    return not any(all(t.startswith(("seq(", "optional(", "map(", "sparse_tensor("))
                       for t in allowed.get(p.type_str, [p.type_str]))
                   for p in [*schema.inputs, *schema.outputs])


def fold_fits(m: Matched, inputs: list[Any]) -> bool:
    """The folded result is at most the run's --max-fold-bytes, or no larger than the constant
    inputs it replaces. Its size comes from ONNX shape inference on the node with its constant
    inputs as data, before anything is computed; a size inference cannot tell is too large."""
    from saturate.core.ir import ValueInfo
    from saturate.frontend.infer import onnx_infer

    arrays = [None if v is None else np.asarray(v) for v in inputs]
    ins = [None if a is None else ValueInfo(a.dtype.name, tuple(a.shape)) for a in arrays]
    data = {k: a for k, a in enumerate(arrays) if a is not None}
    info = onnx_infer(m.op, m.attrs, ins, data, m.output, m.opset, m.outputs)
    if info is None or info.shape is None or info.dtype == "unknown":
        return False
    if not all(isinstance(d, int) and d >= 0 for d in info.shape):
        return False
    try:
        itemsize = np.dtype(info.dtype).itemsize
    except TypeError:
        return False
    size = math.prod(info.shape) * itemsize
    return size <= max(m.max_bytes, sum(a.nbytes for a in arrays if a is not None))


# ---- the constant function ----------------------------------------------------------------------

def evaluate(spec: tuple, inputs: list[Any]) -> Any:
    """The value of output `output` of the node `spec` describes, on constant `inputs`, with the
    interpreter's kernel for its op at its opset. Raises ValueError when the node cannot run."""
    from saturate.core.errors import SaturateError
    from saturate.core.ir import Node
    from saturate.interp.interpreter import eval_node

    op, attrs, output, outputs, opset, domain = spec
    names = ["" if v is None else f"i{k}" for k, v in enumerate(inputs)]
    node = Node(op, names, [f"o{k}" for k in range(outputs)],
                {k: list(v) if isinstance(v, tuple) else v for k, v in attrs}, name=f"fold/{op}", domain=domain)
    try:
        results = eval_node(node, [None if v is None else np.asarray(v) for v in inputs], opset)
    except SaturateError as err:
        raise ValueError(str(err)) from None
    if output >= len(results) or results[output] is None:
        raise ValueError(f"{op} gave no output {output}")
    return results[output]


# ---- load-time checks of a schema rule --------------------------------------------------------------

def is_schema(rule: Rule) -> bool:
    """Whether the rule's left side is an op variable applied to inputs (`op(xs:const...)`)."""
    return isinstance(rule.lhs, Call)
