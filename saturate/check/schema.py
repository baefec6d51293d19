"""Rule checking, what ONNX's schemas say of an op: the opset its graphs run at, the dtypes its
type constraints allow, and the values each attribute may take when a pattern leaves it free.

The schemas (`onnx.defs`) state attribute names, types and defaults but not the allowed strings
of an enum nor the meaningful range of an int; those come from the spec's text and are listed
here once, by attribute name (and op where one name means different things).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import ml_dtypes
import numpy as np
import onnx
import onnx.defs
from hypothesis import strategies as st
from onnx import AttributeProto

from saturate.core.ir import Graph
from saturate.ops.registry import find
from saturate.ops.schema import spec

# The opset the checker's graphs carry unless a pattern's op is newer (Gelu: 20).
BASE_OPSET = Graph().opset

# Tensor dtypes drawn, most common first (the shrinker moves towards the first), with how often
# each is drawn where an op allows it: float32 mostly, the others in proportion.
DTYPE_WEIGHTS = {"float32": 8, "int64": 4, "float64": 2, "float16": 2, "int32": 2, "int8": 1, "uint8": 1,
                 "int16": 1, "bool": 1}
FLOATS = frozenset({"float16", "float32", "float64"})
# Types ONNX added for quantization and storage (numpy's wider unsigned integers, and ml_dtypes'
# bfloat16, float8, float4 and int4, as onnx.reference and the interpreter hold them). They are
# drawn only where an op of EXOTIC_OPS allows them: casts, quantization and ops moving data
# whatever its type, where rules about these types' own rounding, saturation and wraparound
# live; elsewhere the engine rewrites floats, and these would only slow the checks of its rules.
# Not float8e8m0: onnx.reference's Cast to it refuses zero, negatives and exact powers of two.
# Drawn for one value in eight of those ops, one in two of a cast's targets (its saturation and
# rounding are what these types' rules are about), by EXOTIC_WEIGHTS among themselves.
EXOTIC_WEIGHTS = {"uint16": 1, "uint32": 1, "uint64": 1, "bfloat16": 1, "float8_e4m3fn": 1, "float8_e4m3fnuz": 1,
                  "float8_e5m2": 1, "float8_e5m2fnuz": 1, "int4": 1, "uint4": 1,
                  "float4_e2m1fn": 1}
EXOTIC_OPS = frozenset({"Cast", "CastLike", "QuantizeLinear", "DequantizeLinear", "Identity", "Reshape",
                        "Transpose", "Squeeze", "Unsqueeze", "Flatten"})
# The opset a rule made of EXOTIC_OPS alone runs at, now and then, so that its schemas allow the
# float8 (19), int4 (21) and float4 (23) types and Cast's `saturate` (19) and `round_mode` (24).
EXOTIC_OPSET = onnx.defs.onnx_opset_version()
# ONNX's STRING: a numpy object array of Python str, as onnx.reference and ONNX Runtime's Python
# API hold it. Drawn only where a slot takes nothing else (StringSplit's input, an op above a
# string-valued one) and as a source of Cast: rules over other ops meet strings only that way.
STRING = "object"
# Every dtype a slot may be drawn in.
DRAWABLE = frozenset(DTYPE_WEIGHTS) | frozenset(EXOTIC_WEIGHTS) | {STRING}

# The schemas' type strings of those dtypes: tensor(float), tensor(double), tensor(int64)...
_ONNX_NAME = {"float32": "float", "float64": "double", STRING: "string", "float8_e4m3fn": "float8e4m3fn",
              "float8_e4m3fnuz": "float8e4m3fnuz", "float8_e5m2": "float8e5m2", "float8_e5m2fnuz": "float8e5m2fnuz",
              "float8_e8m0fnu": "float8e8m0", "float4_e2m1fn": "float4e2m1"}
_ONNX_TYPE = {f"tensor({_ONNX_NAME.get(d, d)})": d for d in DRAWABLE}
# A sequence slot is drawn by its items' dtype (seq(tensor(float)) as float32): a sequence value
# is a list of tensors of one dtype (saturate.interp.sequences.TensorSequence).
_ONNX_TYPE.update({f"seq({t})": d for t, d in list(_ONNX_TYPE.items())})
# A full optional is held as its value (saturate.interp.sequences): drawn as that tensor.
_ONNX_TYPE.update({f"optional({t})": d for t, d in list(_ONNX_TYPE.items()) if t.startswith("tensor(")})
# Sequence ops whose sequence type S holds tensors of their tensor type T (the spec says so in
# words; the schemas give S and T apart): drawn as one type parameter, T.
SAME_ITEM_TYPE = frozenset({"SequenceConstruct", "SequenceAt", "SequenceInsert", "SplitToSequence",
                            "ConcatFromSequence"})


_ML_NAMES = frozenset(EXOTIC_WEIGHTS) | {"float8_e8m0fnu"}


def np_dtype(name: str | np.dtype) -> np.dtype:
    """The numpy dtype of a drawn dtype name (ml_dtypes' types are not known to numpy by name)."""
    if isinstance(name, np.dtype):
        return name
    own = getattr(ml_dtypes, name, None) if name in _ML_NAMES else None
    return np.dtype(own if own is not None else name)


def is_exotic(dtype: Any) -> bool:
    """Whether a dtype is one of ml_dtypes' (bfloat16, float8, float4, int4), which numpy's own
    arithmetic does not follow ONNX on (isbuiltin is 2; some claim kind "f", float8_e5m2)."""
    return np.dtype(dtype).isbuiltin == 2


def is_exotic_int(dtype: Any) -> bool:
    return is_exotic(dtype) and np.dtype(dtype).name in ("int4", "uint4")


# Casts onnx.reference does not run (ml_dtypes has no conversion between the two; e8m0 to float8
# runs with saturation only), so never drawn.
_ML_TYPES = ("bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu",
             "int4", "uint4", "float4_e2m1fn")
_NO_CAST = ({("float8_e8m0fnu", d) for d in ("float4_e2m1fn", "int4", "uint4")}
            | {("int4", "uint4"), ("uint4", "int4")}
            | {(STRING, d) for d in _ML_TYPES} | {(d, STRING) for d in _ML_TYPES})
_NO_CAST_UNSATURATED = {("float8_e8m0fnu", d) for d in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2",
                                                        "float8_e5m2fnuz")}


def cast_runs(source: str, target: str, saturate: Any = 1) -> bool:
    """Whether the reference interpreter runs a Cast from `source` to `target` dtype names."""
    return (source, target) not in _NO_CAST and (saturate != 0 or (source, target) not in _NO_CAST_UNSATURATED)


def tensor_type(dtype: str) -> int:
    """The onnx.TensorProto element type of a numpy dtype name (Cast's `to`)."""
    return int(onnx.helper.np_dtype_to_tensor_dtype(np_dtype(dtype)))


def dtype_of_tensor_type(code: int) -> str | None:
    """The numpy dtype name of an onnx.TensorProto element type, None for ones not drawn."""
    try:
        name = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(int(code))).name
    except (KeyError, TypeError, ValueError):
        return None
    return name if name in DRAWABLE else None


@functools.lru_cache(maxsize=None)
def opset_for(ops: frozenset[str]) -> int:
    """The opset a pattern's graphs run at: the base one, or the first that defines every op
    on tensors (OptionalGetElement reads a plain tensor from opset 18 only)."""
    opset = BASE_OPSET
    for op in ops:
        newer = spec(op)
        if newer is None:
            continue
        if spec(op, opset) is None:
            opset = max(opset, newer.since_version)
        elif not _tensor_inputs(op, opset):
            opset = next((v for v in _versions(op) if v > opset and _tensor_inputs(op, v)), opset)
    return opset


@functools.lru_cache(maxsize=None)
def _versions(op: str) -> tuple[int, ...]:
    """The opsets at which ONNX's default domain changed the op, oldest first."""
    return tuple(sorted({s.since_version for s in onnx.defs.get_all_schemas_with_history()
                         if s.name == op and s.domain in ("", "ai.onnx")}))


def _tensor_inputs(op: str, opset: int) -> bool:
    """Whether every input of the op's schema at this opset takes a tensor of a drawn dtype."""
    return all(allowed for _, allowed in slot_types(op, opset)[1])


@functools.lru_cache(maxsize=None)
def schema(op: str, opset: int) -> onnx.defs.OpSchema | None:
    try:
        return onnx.defs.get_schema(op, opset, "")
    except onnx.defs.SchemaError:
        return None


def slot_types(op: str, opset: int) -> tuple[tuple[str, frozenset[str]], tuple[tuple[str, frozenset[str]], ...]]:
    """(output 0, inputs) of the op as (type parameter, dtypes drawn that it allows); a slot of one
    fixed type has that type as its parameter. Variadic inputs repeat the last formal. An op
    registered outside ONNX states no type constraints: it is drawn on float32, one type for all."""
    if schema(op, opset) is None:
        d = find(op)
        if d is None or d.standard or d.evaluate is None:
            return ("", frozenset()), ()
        one = ("T", frozenset({"float32"}))
        return one, (one,) * max(1, (d.inputs or (1, 1))[1])
    return _schema_slot_types(op, opset)


@functools.lru_cache(maxsize=None)
def _schema_slot_types(op: str, opset: int) -> tuple[tuple[str, frozenset[str]], tuple[tuple[str, frozenset[str]], ...]]:
    s = schema(op, opset)
    allowed = {c.type_param_str: frozenset(_ONNX_TYPE[t] for t in c.allowed_type_strs if t in _ONNX_TYPE)
               for c in s.type_constraints}

    def slot(formal: Any) -> tuple[str, frozenset[str]]:
        ts = formal.type_str
        if op in SAME_ITEM_TYPE and ts == "S":
            ts = "T"
        if ts in allowed:
            return ts, allowed[ts]
        return ts, frozenset({_ONNX_TYPE[ts]}) if ts in _ONNX_TYPE else frozenset()
    out = slot(s.outputs[0]) if s.outputs else ("", frozenset())
    return out, tuple(slot(f) for f in s.inputs)


def input_slot(op: str, opset: int, k: int) -> tuple[str, frozenset[str]]:
    """The type parameter and allowed dtypes of input k (the last formal for variadic inputs)."""
    _, inputs = slot_types(op, opset)
    if not inputs:
        return "", frozenset()
    return inputs[min(k, len(inputs) - 1)]


def undrawn_values(op: str, opset: int, arity: int) -> str | None:
    """What the op reads (in its first `arity` inputs) or writes that no drawn dtype is:
    "optionals", maps, or the tensor types (None: every slot takes a drawn dtype; a sequence of
    tensors is drawn as a list of them)."""
    s = schema(op, opset)
    if s is None:
        return None
    out, inputs = slot_types(op, opset)
    formals = list(s.inputs)
    slots = [(formals[min(k, len(formals) - 1)], inputs[min(k, len(inputs) - 1)]) for k in range(arity) if inputs]
    if s.outputs:
        slots.append((s.outputs[0], out))
    allowed = {c.type_param_str: list(c.allowed_type_strs) for c in s.type_constraints}
    for formal, (_, dtypes) in slots:
        if not dtypes:
            types = " ".join(allowed.get(formal.type_str, [formal.type_str]))
            return "optionals" if "optional(" in types else "sequences of maps" if "seq(" in types else types
    return None


def draw_dtype(draw: Callable, allowed: frozenset[str] | set[str], strings: int = 0, exotic: int = 0) -> str:
    """One of `allowed`, weighted by DTYPE_WEIGHTS, or with `exotic` (1 or 2) now and then one of
    EXOTIC_WEIGHTS; shrinks towards float32. Strings are drawn where nothing else is allowed, else with weight `strings`
    (0: never); an exotic type where nothing else is, whatever `exotic`."""
    common = {**DTYPE_WEIGHTS, STRING: strings}
    rare = [d for d in EXOTIC_WEIGHTS if d in allowed]
    if rare and (not any(w and d in allowed for d, w in common.items())
                 or exotic and draw(st.integers(0, 7)) >= 8 - 4 ** (exotic - 1)):
        # One of the exotic types: the group is drawn first (one in eight for `exotic` 1, one in
        # two for 2), so that they are drawn that often whatever the other types' weights.
        weights = EXOTIC_WEIGHTS
    else:
        weights = common
    options = [d for d in weights if d in allowed and weights[d]]
    if not options:
        if STRING in allowed:
            return STRING
        raise ValueError("no drawable dtype")
    if len(options) == 1:
        return options[0]
    bounds, total = [], 0
    for d in options:
        total += weights[d]
        bounds.append(total)
    pick = draw(st.integers(0, total - 1))
    return next(d for d, b in zip(options, bounds) if pick < b)


# ---- attributes ---------------------------------------------------------------------------------

# Allowed strings of an enum attribute every op that has it shares (the spec's text), the default
# first; an op's own enums are in its registry entry.
_AUTO_PAD = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")
# Float attributes: the default, then values that tell a rule forgetting them apart.
_FLOATS = {"epsilon": (1e-3, 0.5), "momentum": (0.5,), "alpha": (0.5, 2.0, -1.0, 0.1), "beta": (0.5, 2.0, -1.0),
           "gamma": (0.5, 2.0), "lambd": (0.25, 1.0), "bias": (0.5, -1.0), "scale": (0.5, 2.0),
           "cubic_coeff_a": (-0.5,), "extrapolation_value": (1.0,)}
# Int attributes that are 0/1 switches.
FLAGS = frozenset({"keepdims", "noop_with_empty_axes", "training_mode", "allowzero", "fmod", "ceil_mode",
                   "count_include_pad", "select_last_index", "reverse", "exclusive", "transA", "transB",
                   "align_corners", "antialias", "exclude_outside", "largest", "sorted", "upper",
                   "detect_negative", "detect_positive", "new_axis", "inverse", "interleaved", "is_causal",
                   "center_point_box", "storage_order", "periodic", "is_case_sensitive", "saturate"})
# The ops of ONNX's default domain that draw random numbers: two runs differ, so their rules are
# compared by seed or by distribution (checker.py).
RANDOM_OPS = ("RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli", "Multinomial")
# Attributes of one op drawn from listed values (None: omitted, the default), the default first.
# Regular expressions are a fixed set of valid, linear-time ones: anchored words, classes,
# alternations and repeats over the drawn alphabet (strategies.STRING_ALPHABET); a drawn pattern
# could be invalid or take exponential time to match.
_OP_CHOICES = {
    ("StringNormalizer", "case_change_action"): ("NONE", "LOWER", "UPPER"),
    ("StringSplit", "delimiter"): (None, " ", ",", ";", "  ", "ab", ""),
    ("StringSplit", "maxsplit"): (None, 1, 2),
    # Random ops: parameters beside their defaults, and a seed now and then (omitted, the
    # checker seeds each run itself: see checker.py).
    **{(op, "seed"): (None, 0.0, 3.0, 1234.0) for op in RANDOM_OPS},
    **{(op, "mean"): (None, 1.0, -2.0) for op in ("RandomNormal", "RandomNormalLike")},
    **{(op, "scale"): (None, 0.5, 3.0) for op in ("RandomNormal", "RandomNormalLike")},
    **{(op, "low"): (None, -1.0, 2.0) for op in ("RandomUniform", "RandomUniformLike")},
    **{(op, "high"): (None, 4.0, 0.5) for op in ("RandomUniform", "RandomUniformLike")},
    # A cast to float8e8m0 rounds up by default (the spec's values).
    ("Cast", "round_mode"): ("up", "down", "nearest"),
    ("CastLike", "round_mode"): (None,),     # onnx.reference's CastLike takes none
    ("RegexFullMatch", "pattern"): ("[a-z]+", "a.*", ".*", "", "[A-Za-z]+ [A-Za-z]+", r"\d+", r"\w*",
                                    "(ab|cd)+", ".*[,;].*", "[^ ]*", "x?y?z?", "(?i)the", "日本.*", "Stra(ß|ss)e"),
}
# Attributes that name a dtype: set from the dtypes drawn, never drawn on their own.
DTYPE_ATTRS = frozenset({"to", "dtype", "output_dtype", "output_datatype", "stash_type"})


def enum_values(op: str, key: str) -> tuple[str, ...] | None:
    """The allowed strings of an enum attribute, the default first (None: not an enum)."""
    entry = find(op)
    own = None if entry is None else entry.enums.get(key)
    return own or (_AUTO_PAD if key == "auto_pad" else None)


def attribute_drawer(op: str, key: str, opset: int, rank: Callable[[], int]) -> Callable[[dict], Any] | None:
    """A function drawing a value for attribute `key` of `op` from the schema (None: keep the
    default, as for seeds and dtype attributes); `rank()` is the rank of the op's first input."""
    s = schema(op, opset)
    attr = s.attributes.get(key) if s is not None else None
    if attr is not None and (op, key) in _OP_CHOICES:
        choices = list(_OP_CHOICES[op, key])
        return lambda draw, _a: draw(st.sampled_from(choices))
    if attr is None or key in DTYPE_ATTRS or key == "seed":
        return None
    default = spec(op, opset).attrs.get(key)
    kind = attr.type

    def pick(draw: Callable, values: list) -> Any:
        return draw(st.sampled_from(values))
    if kind == AttributeProto.STRING:
        values = enum_values(op, key)
        if not values:
            return None
        ordered = list(dict.fromkeys(([default] if default in values else []) + list(values)))
        return lambda draw, _a: pick(draw, ordered)
    if kind == AttributeProto.INT and key in FLAGS:
        ordered = list(dict.fromkeys([int(default or 0), 0, 1]))
        return lambda draw, _a: pick(draw, ordered)
    if kind == AttributeProto.INT and key in ("axis", "batch_dims"):
        if key != "axis":
            return None

        def axis(draw: Callable, _a: dict) -> int:
            r = max(rank(), 1)
            return draw(st.integers(-r, r - 1))
        return axis
    if kind == AttributeProto.INTS and key == "axes":
        def axes(draw: Callable, _a: dict) -> list[int] | None:
            r = rank()
            if r == 0 or draw(st.integers(0, 3)) == 0:
                return None
            chosen = sorted(draw(st.lists(st.integers(0, r - 1), min_size=1, max_size=r, unique=True)))
            return [a - r if draw(st.booleans()) else a for a in chosen]
        return axes
    if kind == AttributeProto.FLOAT and key in _FLOATS:
        ordered = list(dict.fromkeys(([float(default)] if default is not None else []) + list(_FLOATS[key])))
        return lambda draw, _a: pick(draw, ordered)
    if attr.required:
        # An op without it does not run at all: small values, which most such attributes
        # (block sizes, window sizes, group counts) take in models; one per spatial axis for lists.
        if kind == AttributeProto.INT:
            return lambda draw, _a: pick(draw, [1, 2, 3])
        if kind == AttributeProto.INTS:
            return lambda draw, _a: [draw(st.integers(1, 3)) for _ in range(max(rank() - 2, 1))]
        if kind == AttributeProto.FLOAT:
            return lambda draw, _a: pick(draw, [1.0, 0.5, 2.0])
    return None


@functools.lru_cache(maxsize=None)
def sequence_slots(op: str, opset: int) -> tuple[bool, tuple[bool, ...]]:
    """(output 0, inputs): which slots of the op take only sequences of tensors (variadic inputs
    repeat the last formal)."""
    s = schema(op, opset)
    if s is None:
        return False, ()
    allowed = {c.type_param_str: list(c.allowed_type_strs) for c in s.type_constraints}

    def only_seq(formal: Any) -> bool:
        types = allowed.get(formal.type_str, [formal.type_str])
        return bool(types) and all(t.startswith("seq(") for t in types)
    out = only_seq(s.outputs[0]) if s.outputs else False
    return out, tuple(only_seq(f) for f in s.inputs)


def is_sequence_slot(op: str, opset: int, k: int) -> bool:
    """Whether input k of the op takes only sequences."""
    inputs = sequence_slots(op, opset)[1]
    return bool(inputs) and inputs[min(k, len(inputs) - 1)]
