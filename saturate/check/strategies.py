"""Rule checking, strategies: public hypothesis strategies for shapes, constants and conv cases.

They are the building blocks of `saturate.check.rule_examples` (examples.py) and of users' own
property tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from saturate.core.geometry import input_side


# Small tensors: soundness bugs show on tiny shapes, and small examples run fast and read well.
MAX_SIDE = 4
MAX_RANK = 4
SIGNS = ("any", "positive", "nonnegative", "nonzero", "negative")

# ---- shapes ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Template:
    """What an op needs of its output shape: an exact rank (or a least rank) and fixed sides."""

    rank: int | None = None
    min_rank: int = 0
    fixed: tuple[tuple[int, int], ...] = ()
    # The ranks allowed when rank is None (None: any from min_rank), most common first: the
    # shrinker moves towards the first.
    ranks: tuple[int, ...] | None = None
    # Every axis from 2 on has side 1 (a global pooling's output, at any rank).
    unit_spatial: bool = False

    def allows(self, shape: tuple[int, ...]) -> bool:
        """Whether an output of this shape fits the template."""
        r = len(shape)
        return ((self.rank is None or self.rank == r) and r >= self.min_rank
                and (self.ranks is None or r in self.ranks) and all(shape[a] == s for a, s in self.fixed)
                and (not self.unit_spatial or all(d == 1 for d in shape[2:])))



class SeqShape(tuple):
    """The "shape" the planner gives a sequence value: its items' shapes, in order (a tuple of
    tuples; an empty one is an empty sequence)."""

    def item_rank(self) -> int | None:
        return len(self[0]) if self else None


# Sequence lengths drawn, the shrinker moving towards the first: two items mostly show a rule's
# fault (order, which one is read), one and none the edges.
SEQUENCE_LENGTHS = (2, 1, 3, 0, 4)


def draw_seq_shape(draw, item: tuple[int, ...]) -> SeqShape:
    """A sequence of 0 to 4 items around the shape `item`: all of that shape (two draws in three:
    they stack and join along any axis), or with one axis of other sides (they join along it)."""
    length = draw(st.sampled_from(SEQUENCE_LENGTHS))
    if not item or draw(st.integers(0, 2)) < 2:
        return SeqShape(tuple(item) for _ in range(length))
    axis = draw(st.integers(0, len(item) - 1))
    return SeqShape(tuple(item[:axis]) + (draw(st.integers(1, MAX_SIDE)),) + tuple(item[axis + 1:])
                    for _ in range(length))


def draw_sequence(draw, shape: SeqShape, sign: str = "any", dtype: Any = np.float32) -> list:
    """A sequence value (a TensorSequence: a list of arrays of one dtype) of those item shapes."""
    from saturate.interp.sequences import TensorSequence

    return TensorSequence([draw_constant(draw, tuple(item), sign, dtype) for item in shape], dtype)


def sequences(shape: SeqShape | None = None, sign: str = "any", dtype: Any = np.float32) -> st.SearchStrategy[list]:
    """Sequence values: lists of 0 to 4 tensors of one dtype (of the item shapes `shape`, else
    drawn around one shape), as the interpreter holds them."""
    def draw_one(draw) -> list:
        got = shape if shape is not None else draw_seq_shape(draw, draw(shapes(max_rank=3)))
        return draw_sequence(draw, got, sign, dtype)
    return st.composite(draw_one)()


def shapes(rank: int | None = None, *, min_rank: int = 0, max_rank: int = MAX_RANK,
           max_side: int = MAX_SIDE) -> st.SearchStrategy[tuple[int, ...]]:
    """Shapes of exactly `rank` dims (or a rank in [min_rank, max_rank]), sides 1..max_side."""
    lo, hi = (rank, rank) if rank is not None else (min_rank, max_rank)
    side = st.integers(1, max_side)
    return st.integers(lo, hi).flatmap(lambda r: st.tuples(*[side] * r))


def broadcastable_shapes(shape: tuple[int, ...], *, min_rank: int = 0,
                         max_rank: int | None = None) -> st.SearchStrategy[tuple[int, ...]]:
    """Shapes that broadcast into `shape` without growing it: as many or fewer axes, each 1 or equal."""
    shape = tuple(shape)
    return st.composite(lambda draw: draw_broadcastable(draw, shape, min_rank, max_rank))()


def draw_broadcastable(draw, shape: tuple[int, ...], min_rank: int = 0,
                       max_rank: int | None = None) -> tuple[int, ...]:
    """One shape of `broadcastable_shapes`, drawn with `draw` directly: the planner draws many
    per example, and building a strategy for each costs more than the drawing."""
    hi = len(shape) if max_rank is None else min(max_rank, len(shape))
    k = draw(st.integers(min(min_rank, hi), hi))
    tail = shape[len(shape) - k:]
    return tuple(d if d == 1 or draw(st.booleans()) else 1 for d in tail)


def per_axis_shapes(shape: tuple[int, ...], axis: int) -> st.SearchStrategy[tuple[int, ...]]:
    """Shapes that broadcast into `shape` and vary along `axis` only: (C,1,1) or (1,C,1,1) for
    axis 1, and now and then a single element ((1,1,1,1), (1,) or a 0-d scalar), which varies
    along no axis while the data's side there may be larger."""
    shape = tuple(shape)
    axis = axis + len(shape) if axis < 0 else axis
    if not 0 <= axis < len(shape):
        raise ValueError(f"axis {axis} outside a shape of rank {len(shape)}")
    return st.composite(lambda draw: draw_per_axis(draw, shape, axis))()


def draw_per_axis(draw, shape: tuple[int, ...], axis: int) -> tuple[int, ...]:
    """One shape of `per_axis_shapes` (axis already in range), drawn with `draw` directly."""
    if draw(st.integers(0, 3)) == 3:
        return (1,) * draw(st.integers(0, len(shape)))
    full = tuple(d if i == axis else 1 for i, d in enumerate(shape))
    return full[draw(st.integers(0, axis)):]


# ---- values ---------------------------------------------------------------------------------

def _f32(x: float) -> float:
    return float(np.float32(x))


_SIMPLE = [1.0, 0.5, 2.0, 3.0, 0.25, 4.0, 1.5, 0.1]
# Tiny, ordinary and huge magnitudes (all positive; signs are applied per sign class).
_MAGNITUDES = [(_f32(1e-6), _f32(1e-3)), (_f32(1e-3), 4.0), (1e3, 1e6)]


def _fits(v: float, sign: str) -> bool:
    return {"any": True, "positive": v > 0, "nonnegative": v >= 0, "nonzero": v != 0, "negative": v < 0}[sign]


def _elements(sign: str) -> st.SearchStrategy[float]:
    signed = [v for m in _SIMPLE for v in (m, -m)]
    parts = [st.sampled_from([v for v in [0.0] + signed if _fits(v, sign)])]
    positive = [st.floats(lo, hi, width=32) for lo, hi in _MAGNITUDES]
    if sign in ("any", "positive", "nonnegative", "nonzero"):
        parts += positive
    if sign in ("any", "nonzero", "negative"):
        parts += [p.map(lambda v: -v) for p in positive]
    return st.one_of(parts)


def _table(sign: str) -> np.ndarray:
    """256 float32 values of one sign class, simplest first: an array is drawn as one byte string
    indexing this table, so it costs one hypothesis draw and shrinks towards table[0]."""
    rng = np.random.default_rng(0)
    simple = [v for v in [0.0] + [v for m in _SIMPLE for v in (m, -m)] if _fits(v, sign)]
    ordinary = rng.uniform(_MAGNITUDES[1][0], _MAGNITUDES[1][1], 112)
    tiny = np.exp(rng.uniform(np.log(_MAGNITUDES[0][0]), np.log(_MAGNITUDES[0][1]), 64))
    huge = np.exp(rng.uniform(np.log(_MAGNITUDES[2][0]), np.log(_MAGNITUDES[2][1]), 64))
    rest = np.concatenate([ordinary, tiny, huge])
    flip = rng.random(rest.size) < 0.5
    if sign in ("any", "nonzero"):
        rest = np.where(flip, -rest, rest)
    elif sign == "negative":
        rest = -rest
    table = np.concatenate([simple, rest])[:256]
    return np.resize(table, 256).astype(np.float32)


# Built once: hypothesis validates a strategy on first use, which is costly per array.
_ELEMENTS = {sign: _elements(sign) for sign in SIGNS}
_TABLES = {sign: _table(sign) for sign in SIGNS}
# Arrays up to this size draw a table index per element; larger ones place up to _POOL drawn
# values with a drawn seed (hypothesis caps the bytes one example may draw).
_EACH = 64
_POOL = 16


def elements(sign: str = "any") -> st.SearchStrategy[float]:
    """Float32 elements of one sign class (see SIGNS): simple values, zeros, mixed signs,
    tiny (1e-6) and huge (1e6) magnitudes."""
    if sign not in SIGNS:
        raise ValueError(f"unknown sign class {sign!r} (known: {', '.join(SIGNS)})")
    return _ELEMENTS[sign]


def constants(shape: tuple[int, ...], sign: str = "any", dtype: Any = np.float32) -> st.SearchStrategy[np.ndarray]:
    """Arrays of `shape` in one sign class: zeros, simple values, mixed signs, tiny and huge
    magnitudes; shrinks towards zeros and simple values."""
    if sign not in SIGNS:
        raise ValueError(f"unknown sign class {sign!r} (known: {', '.join(SIGNS)})")
    return st.composite(lambda draw: draw_constant(draw, tuple(shape), sign, dtype))()


def draw_constant(draw, shape: tuple[int, ...], sign: str = "any", dtype: Any = np.float32) -> np.ndarray:
    """One array of `constants(shape, sign, dtype)`, drawn with `draw` directly. Floats come from
    the float table (float16 with magnitudes it can hold), integers from a table spanning their
    dtype (extremes and values whose products overflow included), bools as drawn bits."""
    dtype = np.dtype(dtype)
    if dtype.kind == "O":
        return draw_strings(draw, shape)
    size = math.prod(shape)
    table = _table_of(sign, dtype)
    if size <= _EACH:
        index = np.frombuffer(draw(st.binary(min_size=size, max_size=size)), np.uint8)
        return table[index].reshape(shape)
    pool = table[np.frombuffer(draw(st.binary(min_size=1, max_size=_POOL)), np.uint8)]
    layout = np.random.default_rng(draw(st.integers(0, 2**32 - 1))).integers(0, len(pool), size)
    return pool[layout].reshape(shape)


# ---- strings ----------------------------------------------------------------------------------

# Characters of drawn strings: letters of both cases (case changes, regex classes), digits,
# spaces and the separators StringSplit is given, and non-ASCII letters (accents, a sharp s
# that upper-cases to two letters, CJK), so that byte- and character-wise readings differ.
STRING_ALPHABET = "abcdAB" + "xyzXYZ" + "019" + "  ,;-" + "éÉßü日本"
# Whole words, drawn as often as characters: StringNormalizer's stopwords and regexes match them.
_WORDS = ("a", "ab", "cd", "the", "The", "x1", "Straße", "日本", "9")
# Numbers as ONNX's Cast reads them from strings: integers, decimals, exponents, inf and NaN.
_INT_STRINGS = ("0", "1", "-1", "2", "7", "-8", "42", "100", "-128", "65536", "+3", "-0")
_FLOAT_STRINGS = ("0.5", "-1.5", "2.25", "1e-06", "1e6", "-0.0", "3.0", "0.1", "1E3", "inf", "-inf", "NaN")


def _word_run(draw) -> str:
    parts = draw(st.lists(st.one_of(st.sampled_from(_WORDS), st.text(STRING_ALPHABET, min_size=1, max_size=3)),
                          max_size=3))
    seps = [draw(st.sampled_from((" ", " ", ",", ";", "  ", "-"))) for _ in parts]
    return "".join(p + s for p, s in zip(parts, seps))[:-1] if parts else ""


def draw_strings(draw, shape: tuple[int, ...], numbers: str | None = None) -> np.ndarray:
    """An object array of Python str of `shape` (as onnx.reference and ONNX Runtime hold ONNX
    STRING): empty strings, words joined by spaces and separators, non-ASCII letters; with
    `numbers` ("int" or "float"), numbers written as Cast reads them. Shrinks towards ""."""
    size = math.prod(shape)
    if numbers is not None:
        table = _INT_STRINGS if numbers == "int" else _INT_STRINGS + _FLOAT_STRINGS
        index = np.frombuffer(draw(st.binary(min_size=size, max_size=size)), np.uint8) % len(table)
        return np.array([table[i] for i in index] + [""], dtype=object)[:-1].reshape(shape)
    pool = [""] + [_word_run(draw) for _ in range(min(size, _POOL))]
    layout = [draw(st.integers(0, len(pool) - 1)) for _ in range(size)] if size <= _EACH else \
        np.random.default_rng(draw(st.integers(0, 2**32 - 1))).integers(0, len(pool), size)
    # The trailing element keeps numpy from reading equal-length strings as a 2-D character array.
    return np.array([pool[i] for i in layout] + [""], dtype=object)[:-1].reshape(shape)


_TYPED_TABLES: dict[tuple[str, str], np.ndarray] = {}
# The largest float16 magnitude drawn: huge float32 values would be inf in float16.
_FLOAT16_MAX = 6e4


def _table_of(sign: str, dtype: np.dtype) -> np.ndarray:
    """The 256-entry table arrays of `dtype` and sign class are drawn from (built once)."""
    key = (sign, dtype.name)
    table = _TYPED_TABLES.get(key)
    if table is None:
        if dtype.isbuiltin == 2:
            table = _exotic_table(sign, dtype)
        elif dtype.kind == "f":
            base = _TABLES[sign].astype(np.float64)
            if dtype.itemsize < 4:
                base = np.clip(base, -_FLOAT16_MAX, _FLOAT16_MAX)
            table = base.astype(dtype)
        elif dtype.kind in "iu":
            table = _int_table(sign, dtype)
        elif dtype.kind == "b":
            # Sign classes read False as 0: positive and nonzero ones are all True.
            bits = [False, True] if sign in ("any", "nonnegative") else [True]
            table = np.resize(np.array(bits), 256)
        else:
            raise ValueError(f"no values are drawn for dtype {dtype.name}")
        _TYPED_TABLES[key] = table
    return table


def _exotic_table(sign: str, dtype: np.dtype) -> np.ndarray:
    """256 values of one of ml_dtypes' types (bfloat16, float8, float4, int4): the float table
    within the type's finite range (its largest value included), rounded to the type; int4 and
    uint4 from their whole range. Values the rounding moved out of the sign class are left out."""
    import ml_dtypes

    if dtype.name in ("int4", "uint4"):
        info = ml_dtypes.iinfo(dtype)
        values = np.array([v for v in [0, 1, -1, 2, -2, 3, int(info.max), int(info.min), 5, -5, 7, -8, 15]
                           if info.min <= v <= info.max and _fits(v, sign)], np.int64)
        return np.resize(values, 256).astype(dtype)
    top = float(ml_dtypes.finfo(dtype).max)
    base = np.clip(_TABLES[sign].astype(np.float64), -top, top)
    base = np.concatenate([base[:1], np.array([top, -top]), base[1:]])
    if dtype.name == "float8_e8m0fnu":
        base = np.abs(base[base != 0])     # powers of two only: no sign, no zero
    with np.errstate(all="ignore"):
        cast = base.astype(np.float32).astype(dtype)
    wide = cast.astype(np.float64)
    keep = np.isfinite(wide) & np.array([_fits(float(v), sign) for v in wide])
    return np.resize(cast[keep], 256)


def _int_table(sign: str, dtype: np.dtype) -> np.ndarray:
    """256 integers of `dtype` in one sign class, simplest first: small values, then the extremes
    of the dtype and values near the square root of its range (their products overflow), then
    values spread over the whole range."""
    info = np.iinfo(dtype)
    rng = np.random.default_rng(1)
    root = int(math.isqrt(int(info.max)))
    small = [0, 1, -1, 2, -2, 3, -3, 4, -4, 5, 7, -8, 10, 16, -16, 100]
    edges = [int(info.max), int(info.min), int(info.max) - 1, int(info.min) + 1, int(info.max) // 2,
             int(info.min) // 2, root, root + 1, -root, -root - 1, 2 * root, -2 * root]
    # uint64's range is beyond numpy's default int64 draws.
    wide = {"dtype": np.uint64} if dtype == np.uint64 else {}
    spread = [int(v) for v in rng.integers(int(info.min), int(info.max), 96, endpoint=True, **wide)]
    moderate = [int(v) for v in rng.integers(-1000, 1000, 96)]
    values = [v for v in small + edges + spread + moderate
              if info.min <= v <= info.max and _fits(v, "nonnegative" if info.min == 0 and sign == "any" else sign)]
    return np.resize(np.array(values, dtype=object), 256).astype(dtype)


def per_axis_constants(shape: tuple[int, ...], axis: int, sign: str = "any") -> st.SearchStrategy[np.ndarray]:
    """Constants that broadcast into `shape` and vary along `axis` only."""
    return per_axis_shapes(shape, axis).flatmap(lambda s: constants(s, sign))


# ---- conv-like attributes -------------------------------------------------------------------

@dataclass(frozen=True)
class ConvCase:
    """A consistent Conv: input and weight shapes, attributes and the output shape they give."""

    x_shape: tuple[int, ...]
    w_shape: tuple[int, ...]
    attrs: dict
    out_shape: tuple[int, ...]


@st.composite
def conv_geometry(draw, out_spatial: tuple[int, ...], fixed: dict,
                  dilations: bool = True) -> tuple[dict, tuple]:
    """Window attributes (kernel_shape, strides, pads, dilations) and the input sides that give
    `out_spatial` outputs; attributes in `fixed` are kept as given."""
    n = len(out_spatial)
    side = st.lists(st.integers(1, 3), min_size=n, max_size=n).map(tuple)
    kernel = tuple(fixed.get("kernel_shape") or draw(side))
    strides = tuple(fixed.get("strides") or draw(st.lists(st.integers(1, 2), min_size=n, max_size=n)))
    dil = tuple(fixed.get("dilations") or (draw(st.lists(st.integers(1, 2), min_size=n, max_size=n))
                                           if dilations else [1] * n))
    if fixed.get("pads") is not None:
        pads = tuple(fixed["pads"])
    else:
        # Pads no wider than the dilated kernel keep every window overlapping the input.
        pads = tuple(draw(st.integers(0, min(2, dil[i % n] * (kernel[i % n] - 1)))) for i in range(2 * n))
    if len(kernel) != n or len(strides) != n or len(dil) != n or len(pads) != 2 * n:
        assume(False)
    sides = []
    for i in range(n):
        extra = draw(st.integers(0, strides[i] - 1))
        pair = (pads[i], pads[n + i])
        sides.append(input_side(out_spatial[i], kernel[i], strides[i], dil[i], pair, extra))
    assume(all(s >= 1 for s in sides))
    attrs = {"kernel_shape": list(kernel), "strides": list(strides), "pads": list(pads)}
    if dilations:
        attrs["dilations"] = list(dil)
    return attrs, tuple(sides)


@st.composite
def conv_cases(draw, out_shape: tuple[int, ...] | None = None, fixed: dict | None = None) -> ConvCase:
    """A Conv whose output has `out_shape` (drawn when None): group, kernel, strides, pads, dilations."""
    fixed = dict(fixed or {})
    out = tuple(out_shape) if out_shape is not None else draw(shapes(4))
    n, m = out[0], out[1]
    group = fixed.get("group")
    if group is None:
        group = draw(st.sampled_from([g for g in range(1, m + 1) if m % g == 0]))
    assume(group >= 1 and m % group == 0)
    per_group = draw(st.integers(1, 2))
    attrs, sides = draw(conv_geometry(out[2:], fixed))
    attrs["group"] = int(group)
    x_shape = (n, group * per_group) + sides
    w_shape = (m, per_group) + tuple(attrs["kernel_shape"])
    return ConvCase(x_shape, w_shape, attrs, out)


@st.composite
def conv_cases_over(draw, out_shape: tuple[int, ...], x_shape: tuple[int, ...], fixed: dict | None = None,
                    sibling: dict | None = None, centred: bool = False) -> ConvCase:
    """A Conv from an input of `x_shape` (already drawn for another use of the same value) to
    `out_shape`. Pads are drawn centred now and then, or, given the attributes of a `sibling`
    conv over the same input, sharing its window centre: parallel branches in models do.
    `centred` draws mostly windows centred on each output pixel (stride 1, odd kernel, even pads)."""
    fixed = dict(fixed or {})
    if centred and draw(st.integers(0, 7)):
        n_sp = len(out_shape) - 2
        fixed.setdefault("strides", [1] * n_sp)
        kernel = fixed.setdefault("kernel_shape", list(draw(st.lists(st.sampled_from([1, 3]), min_size=n_sp,
                                                                     max_size=n_sp))))
        dil = fixed.setdefault("dilations", list(draw(st.lists(st.integers(1, 2), min_size=n_sp, max_size=n_sp))))
        half = [d * (k - 1) // 2 for d, k in zip(dil, kernel)]
        fixed.setdefault("pads", half + half)
    out, x = tuple(out_shape), tuple(x_shape)
    n_sp = len(out) - 2
    assume(len(x) == len(out) and x[0] == out[0])
    m, c = out[1], x[1]
    group = fixed.get("group")
    if group is None:
        group = draw(st.sampled_from([g for g in range(1, min(m, c) + 1) if m % g == 0 and c % g == 0]))
    assume(group >= 1 and m % group == 0 and c % group == 0)
    one = lambda key, values: tuple(fixed.get(key) or draw(st.lists(values, min_size=n_sp, max_size=n_sp)))
    strides = one("strides", st.integers(1, 2))
    dil = one("dilations", st.integers(1, 2))
    sib_k = list((sibling or {}).get("kernel_shape") or [])
    sib_p = list((sibling or {}).get("pads") or [])
    align = bool(sib_k) and len(sib_p) == 2 * n_sp and draw(st.booleans())
    if fixed.get("kernel_shape"):
        kernel = tuple(fixed["kernel_shape"])
    elif align:
        kernel = tuple(draw(st.sampled_from([k for k in (1, 2, 3) if (k - sk) % 2 == 0])) for sk in sib_k)
    else:
        kernel = one("kernel_shape", st.integers(1, 3))
    assume(len(kernel) == len(strides) == len(dil) == n_sp)
    begin, end = [], []
    for i in range(n_sp):
        k, s_, d = kernel[i], strides[i], dil[i]
        # Output side out = (x + P - d (k - 1) - 1) // s + 1: the total padding P it takes.
        low = (out[2 + i] - 1) * s_ + d * (k - 1) + 1 - x[2 + i]
        total = draw(st.integers(max(low, 0), max(low, 0) + s_ - 1))
        if fixed.get("pads") is not None:
            b = fixed["pads"][i]
        elif align:
            b = sib_p[i] - d * (sib_k[i] - k) // 2
        elif draw(st.booleans()):
            b = total // 2
        else:
            b = draw(st.integers(0, total))
        begin.append(b)
        end.append(total - b if fixed.get("pads") is None else fixed["pads"][n_sp + i])
    pads = begin + end
    assume(all(0 <= p <= d * (k - 1) for p, d, k in zip(pads, dil * 2, kernel * 2)))
    for i in range(n_sp):
        side = (x[2 + i] + pads[i] + pads[n_sp + i] - dil[i] * (kernel[i] - 1) - 1)
        assume(side >= 0 and side // strides[i] + 1 == out[2 + i])
    attrs = {"kernel_shape": list(kernel), "strides": list(strides), "pads": pads,
             "dilations": list(dil), "group": int(group)}
    return ConvCase(x, (m, c // group) + kernel, attrs, out)


def factorizations(n: int, parts: int) -> st.SearchStrategy[tuple[int, ...]]:
    """Ordered tuples of `parts` positive ints whose product is n."""
    if parts == 0:
        return st.just(()) if n == 1 else st.nothing()
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    if parts == 1:
        return st.just((n,))
    return st.sampled_from(divisors).flatmap(
        lambda d: factorizations(n // d, parts - 1).map(lambda rest: (d,) + rest))


def draw_factorization(draw, n: int, parts: int) -> tuple[int, ...]:
    """One tuple of `factorizations(n, parts)`, drawn with `draw` directly (for n = 0, one part is
    0 and the others any side)."""
    if parts == 0:
        assume(n == 1)
        return ()
    if n == 0:
        zero = draw(st.integers(0, parts - 1))
        return tuple(0 if k == zero else draw(st.integers(1, MAX_SIDE)) for k in range(parts))
    out = []
    for _ in range(parts - 1):
        d = draw(st.sampled_from([d for d in range(1, n + 1) if n % d == 0]))
        out.append(d)
        n //= d
    return tuple(out) + (n,)


def numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)
