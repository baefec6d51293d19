"""Op registry: one `OpDef` per op, which every stage reads for what the op means.

An entry holds the op's flags (elementwise, commutative, ...), its shape function, its numpy
kernel, its cost, how `saturate check` draws it and the C backend's hooks. Schema facts of a
standard op (inputs, attributes, defaults) come from `onnx.defs` (saturate.ops.schema); an op of
another domain states them in its entry. The families (saturate/ops/elementwise.py, ...) define
the entries and load on the first lookup, so that importing the registry imports no stage.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

STANDARD_DOMAINS = ("", "ai.onnx")
# The modules that define entries, one per op family.
FAMILIES = ("elementwise", "movement", "nn", "linalg", "reduce", "quant", "random")


@dataclass(frozen=True)
class OpDef:
    """What the project knows of one op beyond its ONNX schema."""

    name: str
    domain: str = ""
    # Schema facts of an op outside ONNX's default domain: (min, max) inputs, attribute defaults.
    inputs: tuple[int, int] | None = None
    attrs: dict[str, Any] = field(default_factory=dict)
    # The output is the multidirectional broadcast of the inputs (unary ops: the input's shape).
    elementwise: bool = False
    # The first output has the first input's shape and dtype, whatever the other inputs are.
    same_shape: bool = False
    # Shape arithmetic (Shape -> Gather -> Concat -> Reshape) carries int64 data as often as
    # floats: rules over the op see integers too.
    shape_arith: bool = False
    # Makes or reads quantized integer tensors: rules over the op see int8/uint8 values.
    quant: bool = False
    # The engine encodes the op as a rewritable term even when no rule names it.
    engine: bool = False
    # Binary and its two inputs may swap (composite patterns match both orders).
    commutative: bool = False
    # Its value is not a function of its inputs: never folded.
    nondeterministic: bool = False
    # Output type from the input types and attributes: (attrs, ins) -> ValueInfo | None.
    shape: Callable[[dict, list], Any] | None = None
    # Inputs as onnx.reference should get them where it departs from the spec: (node, args) -> args.
    reference_args: Callable[..., list] | None = None
    # Output type from constant inputs that decide it (Slice's bounds, Squeeze's axes):
    # (attrs, x, ints, n_inputs, output, outputs) -> ValueInfo | None, `x` the first input's type,
    # `ints(k)` input k's elements ([] when omitted, None when not all known).
    shape_by_data: Callable[..., Any] | None = None
    # Numpy kernel, f(node, *inputs) -> array or tuple; `arity` the (required, most) inputs it takes.
    evaluate: Callable[..., Any] | None = None
    arity: tuple[int, int] | None = None
    # Arithmetic operations of one node: (attrs, ins, out) -> int; None: one per output element.
    flops: Callable[[dict, list, Any], int] | None = None
    # How `saturate check` draws the op: "unary", "binary", "variadic", "broadcast", "window".
    draw: str | None = None
    # Allowed strings of its enum attributes (ONNX states them in prose only), the default first.
    enums: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # Inputs the op defines on part of the reals only: input index -> "positive" / "nonnegative".
    domains: dict[int, str] = field(default_factory=dict)
    # Its drawing rule makes empty tensors soundly.
    empty_safe: bool = False
    # How the C backend runs it: "unary" or "binary" (pointwise, `c_expr`; "binary" reads every
    # input, broadcast: Add's two, Where's three), "view" (shares its input's storage), "kernel"
    # (a kernel of the C library).
    c: str | None = None
    # Output shape in C, and what the kernel refuses: (graph, node, input shapes) -> shape, raising
    # the backend's SaturateError; None: the input's (pointwise, views), the broadcast (binary).
    c_shape: Callable[..., tuple] | None = None
    # Scalar C expression: (node, args, operand, graph) -> str, `args` the C expressions of the
    # inputs (the chain value is `v`), `operand(key)` loads a named side input.
    c_expr: Callable[..., str] | None = None
    # Vector (8-lane AVX) form of c_expr, same arguments; None when the op has none.
    c_vec: Callable[..., str | None] | None = None
    # What the C kernel takes beyond float32 data: (graph, node, input dtypes) -> the output's
    # dtype, raising the backend's SaturateError for what it refuses (Where's bool condition); None:
    # float32 data (int_move: the integers C holds as floats too) and a float32 output.
    c_dtype: Callable[..., str] | None = None
    # Inputs after the first are parameters the C emitter reads at compile time.
    param_inputs: bool = False
    # The input a C kernel may also read at run time as integer indices (int32 or int64, entering C as floats
    # of their values: Gather's token ids), though the op's other inputs after the first are parameters.
    c_indices: int | None = None
    # Only moves its input's values (a view or a copy, no arithmetic), so it also takes the integers the C
    # backend holds as floats (a quantized transformer's int8 activations), keeping its input's dtype.
    int_move: bool = False
    # Extra outputs a C kernel may drop when nothing reads them.
    droppable_outputs: bool = False

    @property
    def standard(self) -> bool:
        return self.domain in STANDARD_DOMAINS


_DEFS: dict[tuple[str, str], OpDef] = {}
# Flag or field value -> names of the standard-domain ops that have it, kept up to date by
# register/unregister so that a set handed out once stays current.
_INDEX: dict[tuple[str, Any], set[str]] = {}
# Op name -> its domain, for the ops outside ONNX's default one.
_OTHER_DOMAIN: dict[str, str] = {}
_INDEXED = ("elementwise", "same_shape", "shape_arith", "quant", "engine", "commutative",
            "nondeterministic", "param_inputs", "int_move", "droppable_outputs", "empty_safe")
_loaded = False


def _key(domain: str) -> str:
    return "" if domain in STANDARD_DOMAINS else domain


# The entries as the families define them: what a fresh process (a check worker) sees.
_LOADED: dict[tuple[str, str], OpDef] = {}
# The fields that give an op its meaning (what `saturate check` tests a rule against), unlike
# the C hooks a stage may attach.
_MEANING = ("inputs", "attrs", "elementwise", "same_shape", "shape_arith", "quant", "nondeterministic",
            "shape", "reference_args", "shape_by_data", "evaluate", "arity", "draw", "domains",
            "empty_safe", "enums")


def _load() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        for family in FAMILIES:
            importlib.import_module(f"saturate.ops.{family}")
        _LOADED.update(_DEFS)


def defined_here(ops: Iterable[str]) -> set[str]:
    """The ops of `ops` whose meaning this process registered or changed at run time: another
    process importing saturate.ops would not see them as they are here."""
    _load()
    here = set()
    for op in ops:
        d = find(op)
        if d is None:
            continue
        first = _LOADED.get((_key(d.domain), d.name))
        if first is None or any(getattr(d, f) is not getattr(first, f) and getattr(d, f) != getattr(first, f)
                                for f in _MEANING):
            here.add(op)
    return here


def _labels(d: OpDef) -> list[tuple[str, Any]]:
    labels = [(f, True) for f in _INDEXED if getattr(d, f)]
    labels += [("draw", d.draw), ("c", d.c)] + [("evaluates", True)] * (d.evaluate is not None)
    return labels


def register(d: OpDef) -> OpDef:
    """Add an op (an op of that name and domain already there is an error: unregister it first)."""
    if d.evaluate is not None and d.arity is None:
        raise ValueError(f"op {d.name}: a kernel needs its arity")
    if not d.standard and d.inputs is None:
        raise ValueError(f"op {d.domain}::{d.name}: an op outside ONNX states its inputs")
    key = (_key(d.domain), d.name)
    if key in _DEFS:
        raise ValueError(f"op {d.domain + '::' if d.domain else ''}{d.name} is already registered")
    _DEFS[key] = d
    if not d.standard:
        _OTHER_DOMAIN.setdefault(d.name, d.domain)
    for label in _labels(d):
        _INDEX.setdefault(label, set()).add(d.name)
    return d


def define(name: str, **fields: Any) -> OpDef:
    """Register the standard-domain op `name` with these fields (the families' shorthand)."""
    return register(OpDef(name, **fields))


def attach(op: str, domain: str = "", **hooks: Any) -> OpDef:
    """Set fields of a registered op: how a stage above the registry (the C backend) registers
    the hooks that need its own code."""
    _load()
    d = unregister(op, domain)
    return register(dataclasses.replace(d, **hooks))


def unregister(name: str, domain: str = "") -> OpDef:
    """Remove an op; returns its entry."""
    d = _DEFS.pop((_key(domain), name))
    if _OTHER_DOMAIN.get(name) == d.domain:
        del _OTHER_DOMAIN[name]
        _OTHER_DOMAIN.update((x.name, x.domain) for x in _DEFS.values() if x.name == name and not x.standard)
    if not any(x.name == name for x in _DEFS.values()):
        for label in _labels(d):
            _INDEX.get(label, set()).discard(name)
    return d


@contextlib.contextmanager
def registered(*defs: OpDef) -> Iterator[tuple[OpDef, ...]]:
    """Register ops for the length of a `with` block (tests, experiments)."""
    _load()
    done = []
    try:
        for d in defs:
            done.append(register(d))
        yield tuple(done)
    finally:
        for d in reversed(done):
            unregister(d.name, d.domain)


def lookup(op: str, domain: str = "") -> OpDef | None:
    """The entry of an op, or None when the project knows nothing of it beyond ONNX's schema."""
    _load()
    return _DEFS.get((_key(domain), op))


def entries() -> list[OpDef]:
    """Every registered op."""
    _load()
    return list(_DEFS.values())


def ops_with(flag: str, value: Any = True) -> set[str]:
    """Names of the ops whose `flag` is `value`: a live set, current after later registrations."""
    _load()
    return _INDEX.setdefault((flag, value), set())


def find(op: str) -> OpDef | None:
    """The entry rules mean by the op name `op`: the default domain's, else another domain's."""
    _load()
    d = _DEFS.get(("", op))
    if d is None and op in _OTHER_DOMAIN:
        d = _DEFS.get((_OTHER_DOMAIN[op], op))
    return d


def domain_of(op: str) -> str:
    """The domain of a registered op outside ONNX's default one, "" for every other op."""
    _load()
    return "" if ("", op) in _DEFS else _OTHER_DOMAIN.get(op, "")
