"""Op facts: arity, attribute names and defaults from the ONNX schemas (`onnx.defs`), per opset.

The schemas are the one source of what a standard op takes; an op of another domain states it in
its op registry entry (saturate/ops), as it does the project's own facts that no schema states:
which ops are elementwise and which carry integer shape data often enough to be open to rules
whatever their dtype.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import onnx.defs

from saturate.ops.registry import entries, lookup, ops_with

# Variadic inputs (Concat, Sum, Max...) have no upper bound; this stands for "any number".
VARIADIC = 1 << 30

@dataclass(frozen=True)
class OpSpec:
    """What the project knows of one op at one opset: input counts and attributes with defaults."""

    name: str
    min_inputs: int
    max_inputs: int
    attrs: dict[str, Any] = field(default_factory=dict)  # name -> default (None: required or none)
    since_version: int = 1
    elementwise: bool = False
    # Open to rules whatever its dtype (shape arithmetic), not only on floats.
    any_dtype: bool = False


def newest_opset() -> int:
    """The newest default-domain opset the installed onnx package defines."""
    return onnx.defs.onnx_opset_version()


def _default(attr: onnx.defs.OpSchema.Attribute) -> Any:
    if not attr.default_value.name:
        return None
    value = onnx.helper.get_attribute_value(attr.default_value)
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, float):
        # Schemas store float32; the shortest decimal that round-trips reads as written (1e-05).
        return float(str(np.float32(value)))
    return value


def _flags(op: str, domain: str = "") -> tuple[bool, bool]:
    d = lookup(op, domain)
    return (False, False) if d is None else (d.elementwise, d.shape_arith or d.quant)


def _from_schema(s: onnx.defs.OpSchema) -> OpSpec:
    hi = VARIADIC if s.max_input >= 2**31 - 1 else s.max_input
    return OpSpec(s.name, s.min_input, hi, {k: _default(a) for k, a in s.attributes.items()},
                  s.since_version, *_flags(s.name))


def _from_entry(d: Any) -> OpSpec:
    return OpSpec(d.name, d.inputs[0], d.inputs[1], dict(d.attrs), 1, d.elementwise, d.shape_arith or d.quant)


def spec(op: str, opset: int | None = None, domain: str = "") -> OpSpec | None:
    """The spec of an op at `opset` (default: the newest): a default-domain op's from its ONNX
    schema, another domain's from its registry entry; None if neither has one."""
    if domain not in ("", "ai.onnx"):
        d = lookup(op, domain)
        return None if d is None else _from_entry(d)
    return _standard_spec(op, opset)


@functools.lru_cache(maxsize=None)
def _standard_spec(op: str, opset: int | None) -> OpSpec | None:
    try:
        return _from_schema(onnx.defs.get_schema(op, opset or newest_opset(), ""))
    except onnx.defs.SchemaError:
        return None


def widest_spec(op: str) -> OpSpec | None:
    """`op_table().get(op)` without building the table: a default-domain op's versions are
    read one by one (a few schema lookups) instead of every schema of every op (tens of ms)."""
    got = _onnx_widest(op)
    if got is not None:
        return got
    return next((_from_entry(d) for d in entries() if not d.standard and d.name == op), None)


@functools.lru_cache(maxsize=None)
def _versions(op: str) -> tuple[onnx.defs.OpSchema, ...]:
    """Every default-domain schema of `op`, oldest first, deprecated ones too."""
    found = []
    version = newest_opset()
    while version >= 1:
        try:
            s = onnx.defs.get_schema(op, version, "")
        except onnx.defs.SchemaError:
            break
        found.append(s)
        version = s.since_version - 1
    return tuple(reversed(found))


@functools.lru_cache(maxsize=None)
def _onnx_widest(op: str) -> OpSpec | None:
    """_onnx_table()[op], merged the same way from this op's versions alone."""
    merged: OpSpec | None = None
    for s in _versions(op):
        if s.deprecated:
            continue
        new = _from_schema(s)
        merged = new if merged is None else OpSpec(
            op, min(merged.min_inputs, new.min_inputs), max(merged.max_inputs, new.max_inputs),
            {**merged.attrs, **new.attrs}, new.since_version, new.elementwise, new.any_dtype)
    return merged


def op_table() -> dict[str, OpSpec]:
    """Every op rules may name: the default domain's (_onnx_table) and the registry's ops of
    other domains."""
    table = dict(_onnx_table())
    table.update((d.name, _from_entry(d)) for d in entries() if not d.standard and d.name not in table)
    return table


@functools.lru_cache(maxsize=None)
def _onnx_table() -> dict[str, OpSpec]:
    """Every default-domain op of every version, merged: the widest input range and the union of
    attribute names (defaults from the newest version), which rules are checked against, since a
    rule may match the attribute form of an older opset (Squeeze's `axes` before 13)."""
    merged: dict[str, OpSpec] = {}
    for s in onnx.defs.get_all_schemas_with_history():
        if s.domain not in ("", "ai.onnx") or s.deprecated:
            continue
        new = _from_schema(s)
        old = merged.get(s.name)
        if old is None:
            merged[s.name] = new
            continue
        newer, older = (new, old) if new.since_version > old.since_version else (old, new)
        merged[s.name] = OpSpec(s.name, min(old.min_inputs, new.min_inputs), max(old.max_inputs, new.max_inputs),
                                {**older.attrs, **newer.attrs}, newer.since_version, newer.elementwise,
                                newer.any_dtype)
    return merged


def is_onnx_op(op: str) -> bool:
    """Whether some version of ONNX's default domain defines an op of this name."""
    return _onnx_widest(op) is not None


def is_rewritable_op(op: str) -> bool:
    """Whether the engine encodes this op as a term rules can rewrite even when no rule names it."""
    return op in ops_with("engine")


@functools.lru_cache(maxsize=None)
def attribute_type(op: str, key: str) -> str | None:
    """The ONNX type of an op's attribute ("FLOAT", "INT", "INTS", "STRING", "TENSOR"...), from
    any version of its schema; None for an op or attribute ONNX does not define."""
    for s in _versions(op):
        if key in s.attributes:
            return s.attributes[key].type.name
    return None
