"""Rule checking: property-test each rule's soundness by running both sides on drawn inputs."""

from __future__ import annotations

import dataclasses
import math
import multiprocessing
import os
import re
import time
import warnings
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np
from hypothesis import HealthCheck, Phase, Verbosity, assume, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.errors import Unsatisfiable

from saturate.core.errors import MemoryLimitError, SaturateError, one_line
from saturate.core.limits import lowered
from saturate.interp.interpreter import run_graph
from saturate.interp.sequences import TensorSequence
from saturate.core.ir import Graph, Node
from saturate.lang.ast import Num, OpTerm, Rule, Term, Var
from saturate.lang import fold
from saturate.lang.variadic import instantiate, is_variadic, list_vars
from saturate.ops.schema import op_table
from saturate.ops.registry import defined_here, domain_of
from saturate.engine.compile_rules import rule_ops
from saturate.check.compiled import RightSideError, build_rhs, compiled, decide_example, directions
from saturate.check.examples import Example, rule_examples
from saturate.check.schema import RANDOM_OPS, dtype_of_tensor_type, is_exotic, is_exotic_int, np_dtype

# Both sides run in float64 on float32-representable inputs, so rounding noise neither hides nor
# fakes a difference; a sound rule then agrees to far better than float32 precision, and the
# tolerance below is a few hundred float32 ulps of the result plus a sliver of the largest
# magnitude seen anywhere in either graph (a cancelling sum of huge terms is not a failure).
RTOL = 1e-5
ATOL_OF_SCALE = 1e-6
SMALL = 16  # arrays with at most this many elements are shown in full


@dataclass
class Counterexample:
    """A drawn input on which the two sides of a rule disagree (or the right side fails)."""

    example: Example
    reverse: bool
    reason: str
    lhs: np.ndarray | None = None
    rhs: np.ndarray | None = None


@dataclass
class RuleResult:
    """The outcome for one rule: PASS, FAIL (unsound), NOGEN (no input satisfies its guards)
    or ERROR (the checker could not build the left side)."""

    rule: Rule
    status: str
    examples: int
    seconds: float
    counterexample: Counterexample | None = None
    message: str = ""
    notes: list[str] = field(default_factory=list)


class _Unsound(Exception):
    def __init__(self, cx: Counterexample):
        super().__init__(cx.reason)
        self.cx = cx


class _Broken(Exception):
    """The drawn left side itself does not run: a gap in the checker, not in the rule."""


# ---- building graphs from terms ---------------------------------------------------------------

def as_float64(example: Example, keep: frozenset[str] = frozenset()) -> Example:
    """The example with every float value widened to float64 (integers untouched), but those in
    `keep`: values read for their dtype only (CastLike's second input)."""
    values = {k: _widened(v) if k not in keep else v for k, v in example.values.items()}
    return dataclasses.replace(example, values=values)


def _widened(v: Any) -> Any:
    if isinstance(v, list):    # a sequence: its items widened, and its element type with them
        return TensorSequence([_widened(a) for a in v], np.float64 if v.dtype.kind == "f" else v.dtype)
    return v.astype(np.float64) if v.dtype.kind == "f" else v


def _items(v: Any) -> list[np.ndarray]:
    """The arrays a value holds: the array itself, or a sequence's items."""
    return list(v) if isinstance(v, list) else [v]


def _size(v: Any) -> int:
    return sum(a.size for a in _items(v))


def _dtype_only(rule: Rule) -> frozenset[str]:
    """Variables of the rule read for their dtype only: widened, they would change the result."""
    found: set[str] = set()

    def walk(t: Term) -> None:
        if isinstance(t, OpTerm):
            if t.op == "CastLike" and len(t.args) > 1 and isinstance(t.args[1], Var):
                found.add(t.args[1].name)
            for a in t.args:
                walk(a)
    walk(rule.lhs)
    walk(rule.rhs)
    return frozenset(found)


# ONNX's element type STRING (Cast's `to`).
STRING_TYPE = 8

# Ops whose result is the bit pattern of their input's dtype: widened, the input would give
# other bits (and, for BitCast, another shape). A rule holding one runs at the drawn dtypes.
_BIT_READERS = frozenset({"BitCast"})


def _reads_bits(rule: Rule) -> bool:
    def walk(t: Term) -> bool:
        return isinstance(t, OpTerm) and (t.op in _BIT_READERS or any(walk(a) for a in t.args))
    return walk(rule.lhs) or walk(rule.rhs)


def _writes_strings(example: Example) -> bool:
    """Whether the example holds strings or casts to them: a number written as a string shows
    its dtype's precision ('0.1' in float32, '0.10000000149011612' widened), so such an example
    runs at the drawn dtypes."""
    return any(_is_string(v) for v in example.values.values()) or \
        any(attrs.get("to") == STRING_TYPE for attrs in example.node_attrs.values())


def _holds_exotic(example: Example) -> bool:
    """Whether the example holds or casts to a type of ml_dtypes' (float8, int4, bfloat16...):
    such an example runs at its drawn dtypes, since widening would round differently (a float32
    source cast to float8 once, or a float64 one rounded twice)."""
    return any(is_exotic(v.dtype) for v in example.values.values()) or \
        any(_exotic_code(attrs.get(key)) for attrs in example.node_attrs.values() for key in ("to", "output_dtype"))


def _exotic_code(code: Any) -> bool:
    name = dtype_of_tensor_type(code) if isinstance(code, (int, np.integer)) else None
    return name is not None and is_exotic(np_dtype(name))


def _is_string(a: np.ndarray) -> bool:
    return a.dtype.kind in "OUS"


def build_graph(term: Term, ex: Example) -> Graph:
    """The graph of the drawn side of a rule (the pattern the example was drawn for): ops become
    nodes with their drawn attributes, const captures constants, other variables inputs."""
    g = Graph(name="side", opset=ex.opset)
    counter = [0]

    def visit(t: Term, path: tuple[int, ...]) -> str:
        if isinstance(t, Var):
            if t.name not in ex.values:
                raise SaturateError(f"variable '{t.name}' is not bound by the pattern")
            if t.name in ex.consts:
                g.constants.setdefault(t.name, ex.values[t.name])
            elif t.name not in g.inputs:
                g.inputs.append(t.name)
            return t.name
        if not isinstance(t, OpTerm):
            raise SaturateError(f"a pattern holds {show_term(t)}, which the checker cannot draw")
        inputs = [visit(a, path + (k,)) for k, a in enumerate(t.args)]
        # An omitted attribute stays omitted.
        attrs = {k: v for k, v in ex.node_attrs.get(path, {}).items() if v is not None}
        counter[0] += 1
        out = f"t{counter[0]}"
        g.nodes.append(Node(t.op, inputs, [out], attrs, name=f"{t.op}{list(path)}", domain=domain_of(t.op)))
        return out

    root = visit(term, ())
    g.outputs = [root] + [n.outputs[0] for n in g.nodes if n.outputs[0] != root]
    return g


def _run_graph(g: Graph, ex: Example) -> tuple[np.ndarray, float]:
    """Run a side's graph; returns its output and the largest finite magnitude inside it."""
    feed = {name: ex.values[name] for name in g.inputs}
    values = run_graph(g, feed)
    seen = [a for v in list(values.values()) + list(g.constants.values()) + list(feed.values()) for a in _items(v)]
    floats = [v.astype(np.float64) if is_exotic(v.dtype) else v for v in seen
              if v.size and (v.dtype.kind == "f" or is_exotic(v.dtype) and not is_exotic_int(v.dtype))]
    scale = max((float(np.max(np.abs(v[np.isfinite(v)]), initial=0.0)) for v in floats), default=0.0)
    return values[g.outputs[0]], scale


def compare(lhs: np.ndarray, rhs: np.ndarray, scale: float, steps: int = 0) -> str | None:
    """Why the right side does not refine the left (None when it does). Where the left side is
    not finite (a division by zero, say), any right-side value is acceptable; +0 and -0 are
    equal. An integer result must stay integer and match exactly (within `steps`, for a rule
    that declares `rounding_steps(n)`); a float one must be finite and within the tolerance
    above wherever the left side is finite. Sequences compare item by item: length, element
    type, then each item as a tensor."""
    if isinstance(lhs, list) or isinstance(rhs, list):
        return _compare_sequences(lhs, rhs, scale, steps)
    if lhs.shape != rhs.shape:
        return f"shapes differ: left {lhs.shape}, right {rhs.shape}"
    strings = [_is_string(a) for a in (lhs, rhs)]
    if strings[0] != strings[1]:
        return f"element types differ: left {lhs.dtype}, right {rhs.dtype}"
    if all(strings):
        # Exact equality, element by element (numpy's fixed-width and object strings alike).
        bad = np.asarray(lhs, object) != np.asarray(rhs, object)
        if not np.any(bad):
            return None
        idx = tuple(int(i) for i in np.argwhere(np.asarray(bad))[0])
        return f"outputs differ at index {list(idx)}: left {str(lhs[idx])!r}, right {str(rhs[idx])!r}"
    exotic = [is_exotic(a.dtype) for a in (lhs, rhs)]
    if any(exotic):
        return _compare_exotic(lhs, rhs)
    integral = [a.dtype.kind in "iu" for a in (lhs, rhs)]
    if integral[0] != integral[1]:
        return f"element types differ: left {lhs.dtype}, right {rhs.dtype}"
    if all(integral):
        bad = (lhs != rhs) if not steps else np.abs(lhs.astype(np.int64) - rhs.astype(np.int64)) > steps
    else:
        lhs, rhs = lhs.astype(np.float64), rhs.astype(np.float64)
        defined = np.isfinite(lhs)
        bad = defined & ~np.isfinite(rhs)
        with np.errstate(all="ignore"):
            tol = RTOL * (np.abs(lhs) + np.abs(rhs)) + ATOL_OF_SCALE * scale
            bad |= defined & np.isfinite(rhs) & (np.abs(lhs - rhs) > tol)
    if not bad.any():
        return None
    idx = tuple(int(i) for i in np.argwhere(bad)[0])
    return f"outputs differ at index {list(idx)}: left {lhs[idx]:.7g}, right {rhs[idx]:.7g}"


def _compare_sequences(lhs: Any, rhs: Any, scale: float, steps: int) -> str | None:
    kinds = ["a sequence" if isinstance(a, list) else "a tensor" for a in (lhs, rhs)]
    if kinds[0] != kinds[1]:
        return f"left is {kinds[0]}, right is {kinds[1]}"
    if len(lhs) != len(rhs):
        return f"sequence lengths differ: left {len(lhs)}, right {len(rhs)}"
    if lhs.dtype != rhs.dtype:
        return f"sequence element types differ: left {lhs.dtype}, right {rhs.dtype}"
    for k, (a, b) in enumerate(zip(lhs, rhs)):
        reason = compare(np.asarray(a), np.asarray(b), scale, steps)
        if reason is not None:
            return f"item {k}: {reason}"
    return None


# bfloat16 results may differ by this many units in the last place (of 8 significant bits): a
# rule may round once where the left side rounds twice. float8, float4 and int4 ones match exactly.
BFLOAT16_ULPS = 2


def _compare_exotic(lhs: np.ndarray, rhs: np.ndarray) -> str | None:
    """Outputs of ml_dtypes' types compare at that type: the element types must be the same;
    int4 and uint4 exactly, float8 and float4 exactly (inf and NaN included: a left side's NaN
    is the type's own value, not an overflow), bfloat16 within BFLOAT16_ULPS of the larger side."""
    if lhs.dtype != rhs.dtype:
        return f"element types differ: left {lhs.dtype}, right {rhs.dtype}"
    if is_exotic_int(lhs.dtype):
        bad = lhs.astype(np.int64) != rhs.astype(np.int64)
    else:
        # These come from casts, quantization and data movement, which define inf and NaN (by
        # `saturate`): they must match too, NaN for NaN.
        left, right = lhs.astype(np.float64), rhs.astype(np.float64)
        with np.errstate(all="ignore"):
            if lhs.dtype.name == "bfloat16":
                big = np.maximum(np.abs(left), np.abs(right))
                ulp = np.exp2(np.floor(np.log2(np.where(big > 0, big, 1.0))) - 7)
                close = np.abs(left - right) <= BFLOAT16_ULPS * ulp
            else:
                close = np.zeros(left.shape, bool)
            close |= (left == right) | (np.isnan(left) & np.isnan(right))
        bad = ~close
    if not bad.any():
        return None
    idx = tuple(int(i) for i in np.argwhere(bad)[0])
    return (f"outputs differ at index {list(idx)} ({lhs.dtype}): left {float(lhs[idx]):.7g}, "
            f"right {float(rhs[idx]):.7g}")


def _rounding_steps(rule: Rule) -> int:
    """The integer tolerance a rule declares with the guard `rounding_steps(n)` (0 without)."""
    return max((int(g.args[0].value) for g in rule.guards
                if g.fn == "rounding_steps" and g.args and isinstance(getattr(g.args[0], "value", None), int)),
               default=0)


def run_example(rule: Rule, example: Example, reverse: bool = False) -> Counterexample | None:
    """Evaluate both sides of the rule on one example; a Counterexample when they disagree."""
    return _run_example(rule, example, reverse)[0]


def _run_example(rule: Rule, example: Example, reverse: bool,
                 distribution: bool = True) -> tuple[Counterexample | None, bool]:
    """(counterexample or None, whether the left side is defined anywhere on the example); an
    example whose random ops would need the distribution test counts as undefined unless
    `distribution`."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy's "mean of empty slice" and the like
        return _compare_sides(rule, example, reverse, distribution)


def _compare_sides(rule: Rule, example: Example, reverse: bool,
                   distribution: bool = True) -> tuple[Counterexample | None, bool]:
    side = compiled(rule, reverse)
    # The decision drawing made (on the same compiled side), else the engine's decision now.
    decision = example.decision if example.decided_by is side else \
        decide_example(side, example.values, example.consts, example.node_attrs)
    if decision is None:
        return None, False  # the engine would not fire here (a hand-built example may not match)
    ex = example if _reads_bits(rule) or _writes_strings(example) or _holds_exotic(example) else \
        as_float64(example, _dtype_only(rule))
    try:
        try:
            left = build_graph(side.cr.lhs, ex)
            lhs, scale_l = _run_graph(_seeded(left, example.seed), ex)
        except SaturateError:
            # An op whose reference body holds float32 constants (MeanVarianceNormalization)
            # does not run widened: both sides run at the drawn dtypes then.
            ex = example
            left = build_graph(side.cr.lhs, ex)
            lhs, scale_l = _run_graph(_seeded(left, example.seed), ex)
    except MemoryLimitError:
        return None, False  # a drawn value read as a size (a window's length, say): not an example
    except SaturateError as err:
        if any(v.dtype.kind in "iubO" for k, v in ex.values.items() if _size(v) and k not in ex.forced):
            # Integer division by zero, a string Cast does not read as a number of its type
            # ('1.5' as int64), say: the left side is undefined.
            return None, False
        raise _Broken(f"the drawn left side does not run: {err}") from None
    lhs = lhs if isinstance(lhs, list) else np.asarray(lhs)
    # An empty output is compared too (its shape and dtype): a right side of another shape on
    # empty tensors is a different graph. A non-empty one with no finite element is undefined
    # (a sequence: none in any item).
    if _size(lhs) and lhs.dtype.kind == "f" and not is_exotic(lhs.dtype) \
            and not any(np.isfinite(a).any() for a in _items(lhs)):
        return None, False
    try:
        right = build_rhs(side, decision, ex.values, ex.consts, ex.node_attrs, ex.opset)
        rhs, scale_r = _run_graph(_seeded(right, example.seed), ex)
    except (SaturateError, RightSideError, ValueError, TypeError, IndexError) as err:
        reason = f"the right side fails: {_first_line(err)}"
        return Counterexample(_plain(example), reverse, reason, lhs), True
    rhs = rhs if isinstance(rhs, list) else np.asarray(rhs)
    reason = compare(lhs, rhs, max(scale_l, scale_r), _rounding_steps(rule))
    if reason is not None and reason.startswith("outputs differ") and not _is_string(lhs) \
            and _random_nodes(left) + _random_nodes(right):
        # Of one shape and element type, seeded alike, the sides drew other numbers: they may
        # still agree in distribution.
        if not distribution:
            return None, False
        reason = same_distribution(left, right, ex)
    return (None if reason is None else Counterexample(_plain(example), reverse, reason, lhs, rhs)), True


# ---- random ops -----------------------------------------------------------------------------------
# A rule over ops drawing random numbers is sound when the right side's output has the left's
# distribution. Each example first runs both sides with their random nodes seeded alike (the
# k-th random node of either side takes the example's seed plus k; a seed the node carries, drawn
# or written, stays): a right side that keeps the left's random nodes (Identity, a scale folded
# into RandomNormal's attributes) then gives the same numbers, which settles it. Otherwise the
# outputs are compared in distribution, each side run DISTRIBUTION_RUNS times with seeds of its
# own: a two-sample Kolmogorov-Smirnov test on every element's values across runs and on all
# values pooled. That check is statistical: a wrong rule whose distributions differ by less than
# the test resolves (a Kolmogorov-Smirnov distance of about 0.13) may pass, and a sound one fails
# with probability at most DISTRIBUTION_ALPHA per example; its seeds are fixed, so a `--seed` run
# reports the same every time.
DISTRIBUTION_RUNS = 1000
DISTRIBUTION_ALPHA = 1e-6
# Runs at which the test looks, each at a share of DISTRIBUTION_ALPHA: a wrong rule fails at the
# first look mostly, a sound one takes every run.
_LOOKS = (125, 250, 500, 1000)
# Seeds are float attributes (float32 in a model): those below 2**24 are exact.
_SEED_SPAN = 1 << 24


# Distribution tests run in this process (the shrinking budget above counts them).
DISTRIBUTION_TESTS = [0]


def _random_nodes(g: Graph) -> list[Node]:
    return [n for n in g.nodes if n.op in RANDOM_OPS]


def _seeded(g: Graph, seed: int, pick: Callable[[int], int] | None = None) -> Graph:
    """`g` with every random node seeded: a seed a node carries stays, node k of the others takes
    `seed + k`; with `pick`, seeds are renumbered: group g (a seed value carried, or a node
    without one) takes `pick(g)`, so nodes sharing a seed still draw alike."""
    nodes = _random_nodes(g)
    if not nodes:
        return g
    groups: dict[Any, int] = {}
    seeds: dict[int, float] = {}
    for k, n in enumerate(nodes):
        own = n.attrs.get("seed")
        if pick is None:
            seeds[id(n)] = float(own) if own is not None else float((seed + k) % _SEED_SPAN)
        else:
            key = ("seed", float(own)) if own is not None else ("node", k)
            seeds[id(n)] = float(pick(groups.setdefault(key, len(groups))))
    copy = dataclasses.replace(g, nodes=[dataclasses.replace(n, attrs={**n.attrs, "seed": seeds[id(n)]})
                                         if id(n) in seeds else n for n in g.nodes])
    return copy


def same_distribution(left: Graph, right: Graph, ex: Example) -> str | None:
    """Why the two sides' outputs differ in distribution (None: the test finds no difference):
    each side run up to DISTRIBUTION_RUNS times with seeds of its own, the values of every
    element, and all of them pooled, compared by a two-sample Kolmogorov-Smirnov test."""
    DISTRIBUTION_TESTS[0] += 1
    width = max(len(_random_nodes(left)), len(_random_nodes(right)), 1)
    runs = _LOOKS[-1]
    # The same seeds for every example: the interpreter builds a node once per set of attributes,
    # and examples of one rule share most of theirs.
    base = _SEED_SPAN // 2
    feed = {name: ex.values[name] for name in ex.values}
    samples: list[list[np.ndarray]] = [[], []]
    done = 0
    for look in _LOOKS:
        for i in range(done, look):
            for s, g in enumerate((left, right)):
                run = _seeded(g, 0, lambda group: base + (s * runs + i) * width + group)
                out = run_graph(run, {k: feed[k] for k in g.inputs})[g.outputs[0]]
                samples[s].append(np.asarray(out, np.float64).ravel())
        done = look
        reason = _ks_reason(np.array(samples[0]), np.array(samples[1]), DISTRIBUTION_ALPHA / len(_LOOKS),
                            tuple(np.shape(out)))
        if reason is not None:
            return f"{reason} (over {look} runs of each side)"
    return None


def _ks_reason(a: np.ndarray, b: np.ndarray, alpha: float, shape: tuple[int, ...]) -> str | None:
    """Why runs `a` and `b` (runs x elements) differ in distribution at level `alpha`: an element
    whose values differ (Bonferroni over the elements), or all values pooled. The pooled test
    counts each run as one sample, not each value: the values of one run may be dependent (one
    draw broadcast), so this is the level that holds whatever they are."""
    a = np.where(np.isnan(a), np.inf, a)
    b = np.where(np.isnan(b), np.inf, b)
    runs, size = a.shape
    if size == 0:
        return None
    half = alpha / 2
    for j in range(size):
        counts = _category_counts(a[:, j], b[:, j])
        if counts is not None:
            stat, df = _chi_square(counts[0], counts[1])
            if df and _chi_square_pvalue(stat, df) < half / size:
                return (f"distributions differ at index {[int(i) for i in np.unravel_index(j, shape)]}: "
                        f"chi-square {stat:.1f} on {df} degrees of freedom; left counts "
                        f"{_counts_text(counts[0], counts[2])}, right {_counts_text(counts[1], counts[2])} "
                        f"of {runs} runs")
            continue
        d = _ks_distance(a[:, j], b[:, j])
        if _ks_pvalue(d, runs, runs) < half / size:
            return (f"distributions differ at index {[int(i) for i in np.unravel_index(j, shape)]}: "
                    f"Kolmogorov-Smirnov distance {d:.3f}; left mean {a[:, j].mean():.4g}, sd {a[:, j].std():.4g}, "
                    f"right mean {b[:, j].mean():.4g}, sd {b[:, j].std():.4g}")
    d = _ks_distance(a.ravel(), b.ravel())
    if _ks_pvalue(d, runs, runs) < half:
        return (f"distributions differ: Kolmogorov-Smirnov distance {d:.3f} over all elements; left mean "
                f"{a.mean():.4g}, sd {a.std():.4g}, right mean {b.mean():.4g}, sd {b.std():.4g}")
    return None


# An element whose values are all integers of at most this many kinds (a class index, a coin) is
# compared by its counts of each value, a chi-square test: on so few values the Kolmogorov-Smirnov
# test is conservative (its distance moves in steps), and a rule that shifts one class's share by a
# few points passed it.
_MAX_CATEGORIES = 64
# Values seen fewer times than this in both samples together share one count (the chi-square
# approximation wants every expected count at about 5 or more).
_MIN_CATEGORY = 10


def _category_counts(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[str]] | None:
    """Counts of each value in `a` and in `b` and the values' labels, rare values pooled as
    "other"; None when the values are not a few integers."""
    both = np.concatenate([a, b])
    if not np.all(np.isfinite(both)) or not np.all(both == np.round(both)):
        return None
    values, inverse = np.unique(both, return_inverse=True)
    if values.size > _MAX_CATEGORIES:
        return None
    ca = np.bincount(inverse[:a.size], minlength=values.size)
    cb = np.bincount(inverse[a.size:], minlength=values.size)
    common = ca + cb >= _MIN_CATEGORY
    labels = [f"{v:g}" for v in values[common]]
    if not common.all():
        ca = np.append(ca[common], ca[~common].sum())
        cb = np.append(cb[common], cb[~common].sum())
        labels.append("other")
    return ca, cb, labels


def _chi_square(ca: np.ndarray, cb: np.ndarray) -> tuple[float, int]:
    """Pearson's statistic for "both count vectors come from one distribution", and its degrees
    of freedom (0: a single value, nothing to compare)."""
    keep = ca + cb > 0
    ca, cb = ca[keep].astype(np.float64), cb[keep].astype(np.float64)
    n, m = ca.sum(), cb.sum()
    share = (ca + cb) / (n + m)
    stat = float(np.sum((ca - n * share) ** 2 / (n * share)) + np.sum((cb - m * share) ** 2 / (m * share)))
    return stat, int(ca.size - 1)


def _chi_square_pvalue(stat: float, df: int) -> float:
    """P(X >= stat) for X chi-square on `df` degrees of freedom: the regularized upper incomplete
    gamma function Q(df / 2, stat / 2), by its series below a + 1 and its continued fraction
    (Lentz's method) above, where it is accurate far into the tail."""
    a, x = df / 2, stat / 2
    if x <= 0:
        return 1.0
    front = math.exp(a * math.log(x) - x - math.lgamma(a))
    if x < a + 1:
        term = total = 1 / a
        k = a
        while abs(term) > abs(total) * 1e-16:
            k += 1
            term *= x / k
            total += term
        return min(1.0, max(0.0, 1 - front * total))
    tiny = 1e-300
    b = x + 1 - a
    c, d = 1 / tiny, 1 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = 1 / (d if abs(d) > tiny else tiny)
        c = b + an / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        if abs(d * c - 1) < 1e-16:
            break
    return min(1.0, front * h)


def _counts_text(counts: np.ndarray, labels: list[str]) -> str:
    return "{" + ", ".join(f"{label}: {int(c)}" for label, c in zip(labels, counts)) + "}"


def _ks_distance(a: np.ndarray, b: np.ndarray) -> float:
    """The largest gap between the two samples' empirical distribution functions."""
    a, b = np.sort(a), np.sort(b)
    points = np.concatenate([a, b])
    gap = np.searchsorted(a, points, side="right") / a.size - np.searchsorted(b, points, side="right") / b.size
    return float(np.max(np.abs(gap)))


def _ks_pvalue(d: float, n: int, m: int) -> float:
    """The asymptotic (Kolmogorov) p-value of distance d between samples of n and m values."""
    lam = d * np.sqrt(n * m / (n + m))
    if lam < 0.2:
        return 1.0
    k = np.arange(1, 101)
    return float(np.clip(2 * np.sum((-1.0) ** (k - 1) * np.exp(-2 * k**2 * lam**2)), 0.0, 1.0))


def _plain(example: Example) -> Example:
    """The example without the engine's decision (a counterexample travels between processes)."""
    return dataclasses.replace(example, decision=None, decided_by=None)


def _first_line(err: BaseException) -> str:
    text = str(err)
    return text.splitlines()[0] if text else type(err).__name__


# ---- the property test --------------------------------------------------------------------------

# Distribution tests (a second or more each) run for one direction of a rule over random ops, and
# while shrinking a counterexample; past them, an example needing one is passed over (not
# counted), and the counterexample found stands, less shrunk.
DISTRIBUTION_TESTS_PER_RULE = 10
SHRINK_DISTRIBUTION_TESTS = 3


def _property(rule: Rule, reverse: bool, count: list[int], nonempty: bool = False) -> Callable[[Example], None]:
    # count[0]: examples run before the first failure (shrinking runs more; those are not counted).
    failed = [False]
    budget = [DISTRIBUTION_TESTS_PER_RULE, SHRINK_DISTRIBUTION_TESTS]  # before a failure, after
    # Counterexamples by example, so that the one reported fails again when replayed.
    found: dict[Any, Counterexample] = {}

    def prop(example: Example) -> None:
        assume(not (nonempty and _has_empty(example)))
        key = _example_key(example)
        if key in found:
            cx, defined = found[key], True
        else:
            tests, phase = DISTRIBUTION_TESTS[0], int(failed[0])
            cx, defined = _run_example(rule, example, reverse, distribution=budget[phase] > 0)
            budget[phase] -= DISTRIBUTION_TESTS[0] - tests
        assume(defined)  # the left side is undefined (not finite) everywhere: nothing to compare
        if not failed[0]:
            count[0] += 1
        if cx is not None:
            failed[0] = True
            found[key] = cx
            raise _Unsound(cx)     # one place: hypothesis tells failures apart by where they raise
    return prop


def _example_key(example: Example) -> Any:
    def value(v: np.ndarray) -> Any:
        if isinstance(v, list):
            return ("seq", v.dtype.str, tuple(value(a) for a in v))
        return (v.dtype.str, v.shape, repr(v.tolist()) if _is_string(v) else v.tobytes())
    return (example.seed, repr(sorted(example.node_attrs.items())),
            tuple((k, value(v)) for k, v in sorted(example.values.items())))


# A variadic rule (Concat(xs...)) is checked as its instances for 1 to this many inputs.
VARIADIC_INPUTS = 5


def joined(rule: Rule, flat: bool = False) -> Rule:
    """A rule of several roots as one of a single root: the roots concatenated along their last
    axis (or, `flat`, each flattened to a row first), on both sides, so that one drawn graph
    checks every root's replacement."""
    def join(terms: list[Term]) -> Term:
        if not flat:
            return OpTerm("Concat", tuple(terms), (("axis", Num(-1)),))
        rows = tuple(OpTerm("Flatten", (t,), (("axis", Num(0)),)) for t in terms)
        return OpTerm("Concat", rows, (("axis", Num(1)),))

    return dataclasses.replace(rule, lhs=join([t for t, _ in rule.roots]), rhs=join([t for _, t in rule.roots]),
                               more_lhs=(), more_rhs=())


def check_rule(rule: Rule, examples: int = 200, seed: int | None = None) -> RuleResult:
    """Property-test one rule (both ways if bidirectional) on `examples` drawn inputs."""
    # Examples are a few kilobytes; an op reading a drawn value as a size (MelWeightMatrix's
    # bins, HannWindow's length) would otherwise take what --max-memory allows, many gigabytes.
    with lowered(EXAMPLE_MAX_BYTES):
        return _check_rule(rule, examples, seed)


# What one tensor of an example may take while a rule is checked.
EXAMPLE_MAX_BYTES = 64 << 20


def _check_rule(rule: Rule, examples: int, seed: int | None) -> RuleResult:
    if fold.is_schema(rule):
        return _check_schema(rule, examples, seed)
    if rule.more_lhs:
        # Roots of one shape but the last axis (projections of one input) join as they are;
        # others only once flattened, which draws fewer examples.
        got = check_rule(joined(rule), examples, seed)
        note = "roots checked together, concatenated along their last axis"
        if got.status == "NOGEN":
            got = check_rule(joined(rule, flat=True), examples, seed)
            note = "roots checked together, each flattened into one row"
        return dataclasses.replace(got, notes=[*got.notes, note])
    if is_variadic(rule):
        return _check_instances(rule, examples, seed)
    start = time.perf_counter()
    notes: list[str] = []
    try:
        ways = directions(rule)
    except SaturateError as err:
        return RuleResult(rule, "ERROR", 0, time.perf_counter() - start,
                          message=f"the engine cannot compile the rule: {_first_line(err)}")
    if rule.bidirectional and True not in ways:
        notes.append("right side holds constant expressions: drawn from the left side only")
    total = 0
    for reverse in ways:
        count = [0]
        try:
            _search(rule, reverse, examples, seed, count)
        except _Unsound as err:
            cx = err.cx
            if _has_empty(cx.example):
                cx = _nonempty_counterexample(rule, reverse, examples, seed) or cx
            return RuleResult(rule, "FAIL", total + count[0], time.perf_counter() - start, cx,
                              notes=notes)
        except _Broken as err:
            return RuleResult(rule, "ERROR", total + count[0], time.perf_counter() - start, message=str(err))
        except Unsatisfiable:
            return RuleResult(rule, "NOGEN", total, time.perf_counter() - start,
                              message=f"could not generate examples: {_no_examples_reason(rule)}")
        except SaturateError as err:
            return RuleResult(rule, "NOGEN", total, time.perf_counter() - start,
                              message=f"could not generate examples: {err}")
        except Exception as err:  # a gap in the checker must not hide the other rules' results
            return RuleResult(rule, "ERROR", total + count[0], time.perf_counter() - start,
                              message=f"the checker failed: {type(err).__name__}: {_first_line(err)}")
        total += count[0]
        if count[0] == 0:
            return RuleResult(rule, "NOGEN", 0, time.perf_counter() - start,
                              message=f"could not generate examples: {_no_examples_reason(rule)}")
    return RuleResult(rule, "PASS", total, time.perf_counter() - start, notes=notes)


def _check_instances(rule: Rule, examples: int, seed: int | None) -> RuleResult:
    """Check each instance of a variadic rule, every list of 1 to VARIADIC_INPUTS elements; the
    first that does not pass is the rule's result."""
    start, total = time.perf_counter(), 0
    lists = list_vars(rule)
    for n in range(1, VARIADIC_INPUTS + 1):
        if any(fixed + n > op_table()[op].max_inputs for op, fixed in lists.values() if op in op_table()):
            break
        inst = instantiate(rule, {name: n for name in lists})
        # The instances share the rule's structure: each takes a share of the examples (two
        # fifths of them at five), not all of them.
        share = max(2 * examples // VARIADIC_INPUTS, min(examples, 20))
        got = check_rule(inst, share, seed) if inst is not None else None
        if got is None:
            continue
        total += got.examples
        if got.status != "PASS":
            return RuleResult(rule, got.status, total, time.perf_counter() - start, got.counterexample,
                              got.message, [*got.notes, f"instance of {n} input{'s' * (n > 1)}"])
    return RuleResult(rule, "PASS", total, time.perf_counter() - start,
                      notes=[f"checked with 1 to {VARIADIC_INPUTS} inputs in each list"])


# A rule of any op (op(xs:const...)) is checked as its instances for these ops and input counts:
# the ops of the tables, weight standardizations and positional encodings exporters leave, of
# every kind of shape (elementwise, broadcasting, reducing, gathering, windowed).
SCHEMA_OPS = (("Equal", 2), ("Where", 3), ("Expand", 2), ("Exp", 1), ("Clip", 3), ("Sin", 1), ("Cos", 1),
              ("CumSum", 2), ("ReduceMean", 1), ("BatchNormalization", 5), ("Conv", 2), ("Tile", 2),
              ("ScatterND", 3), ("Softmax", 1), ("Greater", 2), ("Floor", 1))


def _check_schema(rule: Rule, examples: int, seed: int | None) -> RuleResult:
    """Check a rule of any op as an ordinary rule for each op of SCHEMA_OPS (drawn from the op's
    schema, matched and decided as the engine does); the first that does not pass is the result.
    An op the checker cannot draw is named in the notes, not failed."""
    from saturate.engine.fold_any import instance

    start, total, checked, skipped = time.perf_counter(), 0, [], []
    share = max(examples // 4, min(examples, 10))
    for op, n in SCHEMA_OPS:
        got = check_rule(instance(rule, op, n), share, seed)
        total += got.examples
        if got.status == "NOGEN":
            skipped.append(op)
            continue
        if got.status != "PASS":
            return RuleResult(rule, got.status, total, time.perf_counter() - start, got.counterexample,
                              got.message, [*got.notes, f"instance for {op} with {n} input{'s' * (n > 1)}"])
        checked.append(op)
    notes = [f"checked as {', '.join(checked)}"] + ([f"no examples for {', '.join(skipped)}"] if skipped else [])
    return RuleResult(rule, "PASS" if checked else "NOGEN", total, time.perf_counter() - start, notes=notes)


def _no_examples_reason(rule: Rule) -> str:
    from saturate.check.examples import _ops
    from saturate.check.generic_planner import refusal
    return refusal(_ops(rule.lhs) | _ops(rule.rhs)) or "no drawn input satisfies the guards"


def _search(rule: Rule, reverse: bool, examples: int, seed: int | None, count: list[int],
            nonempty: bool = False) -> None:
    """Run the property test; raises _Unsound with the shrunk counterexample of a failure."""
    prop = _property(rule, reverse, count, nonempty)
    test = settings(max_examples=examples, deadline=None, database=None, verbosity=Verbosity.quiet,
                    suppress_health_check=list(HealthCheck), report_multiple_bugs=False,
                    phases=[Phase.explicit, Phase.generate, Phase.shrink], print_blob=False)(
        given(rule_examples(rule, reverse=reverse))(prop))
    if seed is not None:
        test = hypothesis_seed(seed)(test)
    test()


def _has_empty(example: Example) -> bool:
    return any(_size(v) == 0 for v in example.values.values())


def _nonempty_counterexample(rule: Rule, reverse: bool, examples: int, seed: int | None) -> Counterexample | None:
    """A counterexample with no empty tensor, if one is found in a second search. The shrinker
    favours an empty tensor as the smallest input, but a rule failing there often fails for a
    different reason (a shape mismatch) than on real data, where the fault it reports matters."""
    try:
        _search(rule, reverse, examples, seed, [0], nonempty=True)
    except _Unsound as err:
        return err.cx
    except Exception:  # nothing better found: the first counterexample stands
        return None
    return None


def check_rules(rules: Iterable[Rule], examples: int = 200, seed: int | None = None,
                progress: Callable[[RuleResult], None] | None = None, jobs: int | None = None) -> list[RuleResult]:
    """Check every rule, `jobs` worker processes at a time (default: every core), a rule per task.
    Results come (and `progress` is called with each) in rule order; a rule's result depends on
    its seed only, not on which worker ran it or when."""
    rules = list(rules)
    # A worker imports saturate.ops afresh: a rule over an op this process registered or changed
    # at run time is checked here, against the op as this process defines it.
    here = {k for k, rule in enumerate(rules) if defined_here(rule_ops([rule]))}
    workers = max(1, min(jobs or os.cpu_count() or 1, len(rules) - len(here)))
    if workers == 1:
        results = []
        for rule in rules:
            results.append(check_rule(rule, examples, seed))
            if progress is not None:
                progress(results[-1])
        return results
    done: dict[int, RuleResult] = {}
    lost: list[int] = []
    shown = 0

    def show() -> None:
        nonlocal shown
        while shown in done:
            if progress is not None:
                progress(done[shown])
            shown += 1

    with _pool(workers) as pool:
        futures = {pool.submit(check_rule, rule, examples, seed): k for k, rule in enumerate(rules) if k not in here}
        for k in sorted(here):
            done[k] = check_rule(rules[k], examples, seed)
        for future in as_completed(futures):
            k = futures[future]
            try:
                done[k] = future.result()
            except BrokenProcessPool:
                lost.append(k)      # a worker died: every rule not finished by then is lost with it
                continue
            except Exception as err:  # noqa: BLE001 - its result could not come back, say
                done[k] = RuleResult(rules[k], "ERROR", 0, 0.0,
                                     message=f"the checker's worker process failed: {_first_line(err)}")
            show()
    # Each lost rule again in a process of its own, so that only the one that kills its worker
    # (out of memory, a signal) is reported so.
    with ThreadPoolExecutor(workers) as threads:
        for k, result in zip(sorted(lost), threads.map(lambda k: _alone(rules[k], examples, seed), sorted(lost))):
            done[k] = result
    show()
    return [done[k] for k in range(len(rules))]


def _pool(workers: int) -> ProcessPoolExecutor:
    # Fresh interpreters, not forks: a fork would copy whatever threads the parent has started.
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=_import_checker)


def _alone(rule: Rule, examples: int, seed: int | None) -> RuleResult:
    with _pool(1) as pool:
        try:
            return pool.submit(check_rule, rule, examples, seed).result()
        except BrokenProcessPool as err:
            return RuleResult(rule, "ERROR", 0, 0.0, message="the checker's worker process died checking this "
                              f"rule (out of memory or a signal): {_first_line(err)}")


def _import_checker() -> None:
    """A fresh worker imports the checker before its first rule, so that rule's time is its own."""
    import saturate.check.planner  # noqa: F401
    import saturate.interp.interpreter  # noqa: F401


# ---- reports --------------------------------------------------------------------------------------

def show_term(t: Term) -> str:
    """A term in the rule language's own syntax."""
    from saturate.lang.parser import format_term
    return format_term(t)


def show_array(a: np.ndarray) -> str:
    """Small arrays in full; larger ones by shape, range and first elements. A sequence: its
    length and element type, then each item."""
    if isinstance(a, list):
        items = "; ".join(f"[{k}] {show_array(item)}" for k, item in enumerate(a))
        return f"sequence of {len(a)} {a.dtype}" + (f": {items}" if items else "")
    a = np.asarray(a)
    if _is_string(a):
        # Each string quoted, so that empty strings and spaces read; nested as the array is.
        head = f"string{list(a.shape)}"
        if a.size <= SMALL:
            return f"{head} = {_nested(a)}"
        return f"{head} = [{', '.join(repr(str(v)) for v in a.ravel()[:8])}, ...]"
    head = f"{a.dtype}{list(a.shape)}"
    if a.size <= SMALL:
        body = np.array2string(a, precision=7, separator=", ", max_line_width=100)
        return f"{head} = " + " ".join(line.strip() for line in body.splitlines())
    flat = a.ravel()
    shown = ", ".join(f"{v:.7g}" for v in flat[:8])
    finite = flat[np.isfinite(flat)] if a.dtype.kind == "f" else flat
    span = f"min {finite.min():.7g}, max {finite.max():.7g}" if finite.size else "no finite value"
    return f"{head} ({span}) = [{shown}, ...]"


def show_attr(value: Any) -> str:
    """An attribute's value; a subgraph (If's branches, a body) in ONNX's text syntax, on one line."""
    from saturate.core.ir import OpaqueAttr

    if not (isinstance(value, OpaqueAttr) and value.kind == "GRAPH"):
        return str(value)
    import onnx.printer

    from saturate.frontend.onnx_scope import parse_attribute

    text = onnx.printer.to_text(parse_attribute(value.payload).g)
    # The statements' brace ends its line; an initializer's value is braced too ({0.5}).
    brace = re.search(r"\{[ \t]*\n", text)
    head, body = (text[:brace.start()], text[brace.end():]) if brace else (text, "")
    lines = [ln.strip() for ln in body.rstrip().removesuffix("}").splitlines() if ln.strip()]
    return " ".join(ln.strip() for ln in head.splitlines() if ln.strip()) + (" { " + "; ".join(lines) + " }" if brace else "")


def _nested(a: np.ndarray) -> str:
    if a.ndim == 0:
        return repr(str(a[()]))
    return "[" + ", ".join(_nested(a[k:k + 1].reshape(a.shape[1:])) for k in range(a.shape[0])) + "]"


def _op_at(term: Term, path: tuple[int, ...]) -> str:
    for k in path:
        term = term.args[k]
    return term.op if isinstance(term, OpTerm) else "?"


def format_result(result: RuleResult) -> str:
    """One line per rule; a failing rule adds its shrunk counterexample."""
    rule = result.rule
    line = f"{result.status:<5} {rule.name}  {rule.loc}  {result.examples} examples  {result.seconds:.2f}s"
    lines = [line] + [f"      note: {n}" for n in result.notes]
    if result.message:
        lines.append(f"      {result.message}")
    cx = result.counterexample
    if cx is None:
        return "\n".join(one_line(line) for line in lines)
    source, target = (rule.rhs, rule.lhs) if cx.reverse else (rule.lhs, rule.rhs)
    ex = cx.example
    lines.append(f"      counterexample{' (right to left)' if cx.reverse else ''}: {cx.reason}")
    for name in sorted(ex.values):
        kind = "const" if name in ex.consts else "input"
        lines.append(f"        {name} ({kind}): {show_array(ex.values[name])}")
    if ex.attrs:
        shown = ", ".join(f"{name}={value}" for name, value in sorted(ex.attrs.items()))
        lines.append(f"        captured attributes: {shown}")
    for path, attrs in sorted(ex.node_attrs.items()):
        if attrs:
            shown = ", ".join(f"{k}={show_attr(v)}" for k, v in sorted(attrs.items()))
            lines.append(f"        {_op_at(source, path)} at {list(path)}: {shown}")
    lines.append(f"        left  {show_term(source)}")
    if cx.lhs is not None:
        lines.append(f"          = {show_array(cx.lhs)}")
    lines.append(f"        right {show_term(target)}")
    if cx.rhs is not None:
        lines.append(f"          = {show_array(cx.rhs)}")
    # Each line escaped: a rules file's path (an include names it) may hold a terminal escape.
    return "\n".join(one_line(line) for line in lines)
