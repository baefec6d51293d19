"""Rule checking: property-test each rule's soundness by running both sides on drawn inputs."""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import time
import warnings
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Callable, Iterable

import numpy as np
from hypothesis import HealthCheck, Phase, Verbosity, assume, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.errors import Unsatisfiable

from saturate.core.errors import MemoryLimitError, SaturateError
from saturate.core.limits import lowered
from saturate.interp.interpreter import run_graph
from saturate.core.ir import Graph, Node
from saturate.lang.ast import Num, OpTerm, Rule, Term, Var
from saturate.lang import fold
from saturate.lang.variadic import instantiate, is_variadic, list_vars
from saturate.ops.schema import op_table
from saturate.ops.registry import defined_here, domain_of
from saturate.engine.compile_rules import rule_ops
from saturate.check.compiled import RightSideError, build_rhs, compiled, decide_example, directions
from saturate.check.examples import Example, rule_examples

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
    values = {k: v.astype(np.float64) if v.dtype.kind == "f" and k not in keep else v
              for k, v in example.values.items()}
    return dataclasses.replace(example, values=values)


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


# Ops whose result is the bit pattern of their input's dtype: widened, the input would give
# other bits (and, for BitCast, another shape). A rule holding one runs at the drawn dtypes.
_BIT_READERS = frozenset({"BitCast"})


def _reads_bits(rule: Rule) -> bool:
    def walk(t: Term) -> bool:
        return isinstance(t, OpTerm) and (t.op in _BIT_READERS or any(walk(a) for a in t.args))
    return walk(rule.lhs) or walk(rule.rhs)


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
    seen = list(values.values()) + list(g.constants.values()) + list(feed.values())
    scale = max((float(np.max(np.abs(v[np.isfinite(v)]), initial=0.0)) for v in seen
                 if v.dtype.kind == "f" and v.size), default=0.0)
    return values[g.outputs[0]], scale


def compare(lhs: np.ndarray, rhs: np.ndarray, scale: float, steps: int = 0) -> str | None:
    """Why the right side does not refine the left (None when it does). Where the left side is
    not finite (a division by zero, say), any right-side value is acceptable; +0 and -0 are
    equal. An integer result must stay integer and match exactly (within `steps`, for a rule
    that declares `rounding_steps(n)`); a float one must be finite and within the tolerance
    above wherever the left side is finite."""
    if lhs.shape != rhs.shape:
        return f"shapes differ: left {lhs.shape}, right {rhs.shape}"
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


def _rounding_steps(rule: Rule) -> int:
    """The integer tolerance a rule declares with the guard `rounding_steps(n)` (0 without)."""
    return max((int(g.args[0].value) for g in rule.guards
                if g.fn == "rounding_steps" and g.args and isinstance(getattr(g.args[0], "value", None), int)),
               default=0)


def run_example(rule: Rule, example: Example, reverse: bool = False) -> Counterexample | None:
    """Evaluate both sides of the rule on one example; a Counterexample when they disagree."""
    return _run_example(rule, example, reverse)[0]


def _run_example(rule: Rule, example: Example, reverse: bool) -> tuple[Counterexample | None, bool]:
    """(counterexample or None, whether the left side is defined anywhere on the example)."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy's "mean of empty slice" and the like
        return _compare_sides(rule, example, reverse)


def _compare_sides(rule: Rule, example: Example, reverse: bool) -> tuple[Counterexample | None, bool]:
    side = compiled(rule, reverse)
    # The decision drawing made (on the same compiled side), else the engine's decision now.
    decision = example.decision if example.decided_by is side else \
        decide_example(side, example.values, example.consts, example.node_attrs)
    if decision is None:
        return None, False  # the engine would not fire here (a hand-built example may not match)
    ex = example if _reads_bits(rule) else as_float64(example, _dtype_only(rule))
    try:
        try:
            lhs, scale_l = _run_graph(build_graph(side.cr.lhs, ex), ex)
        except SaturateError:
            # An op whose reference body holds float32 constants (MeanVarianceNormalization)
            # does not run widened: both sides run at the drawn dtypes then.
            ex = example
            lhs, scale_l = _run_graph(build_graph(side.cr.lhs, ex), ex)
    except MemoryLimitError:
        return None, False  # a drawn value read as a size (a window's length, say): not an example
    except SaturateError as err:
        if any(v.dtype.kind in "iub" for k, v in ex.values.items() if v.size and k not in ex.forced):
            return None, False  # integer division by zero, say: the left side is undefined
        raise _Broken(f"the drawn left side does not run: {err}") from None
    lhs = np.asarray(lhs)
    # An empty output is compared too (its shape and dtype): a right side of another shape on
    # empty tensors is a different graph. A non-empty one with no finite element is undefined.
    if lhs.size and lhs.dtype.kind == "f" and not np.isfinite(lhs).any():
        return None, False
    try:
        rhs, scale_r = _run_graph(build_rhs(side, decision, ex.values, ex.consts, ex.node_attrs, ex.opset), ex)
    except (SaturateError, RightSideError, ValueError, TypeError, IndexError) as err:
        reason = f"the right side fails: {_first_line(err)}"
        return Counterexample(_plain(example), reverse, reason, lhs), True
    reason = compare(lhs, np.asarray(rhs), max(scale_l, scale_r), _rounding_steps(rule))
    return (None if reason is None else Counterexample(_plain(example), reverse, reason, lhs, np.asarray(rhs))), True


def _plain(example: Example) -> Example:
    """The example without the engine's decision (a counterexample travels between processes)."""
    return dataclasses.replace(example, decision=None, decided_by=None)


def _first_line(err: BaseException) -> str:
    text = str(err)
    return text.splitlines()[0] if text else type(err).__name__


# ---- the property test --------------------------------------------------------------------------

def _property(rule: Rule, reverse: bool, count: list[int], nonempty: bool = False) -> Callable[[Example], None]:
    # count[0]: examples run before the first failure (shrinking runs more; those are not counted).
    failed = [False]

    def prop(example: Example) -> None:
        assume(not (nonempty and _has_empty(example)))
        cx, defined = _run_example(rule, example, reverse)
        assume(defined)  # the left side is undefined (not finite) everywhere: nothing to compare
        if not failed[0]:
            count[0] += 1
        if cx is not None:
            failed[0] = True
            raise _Unsound(cx)
    return prop


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
    return any(v.size == 0 for v in example.values.values())


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
    """Small arrays in full; larger ones by shape, range and first elements."""
    a = np.asarray(a)
    head = f"{a.dtype}{list(a.shape)}"
    if a.size <= SMALL:
        body = np.array2string(a, precision=7, separator=", ", max_line_width=100)
        return f"{head} = " + " ".join(line.strip() for line in body.splitlines())
    flat = a.ravel()
    shown = ", ".join(f"{v:.7g}" for v in flat[:8])
    finite = flat[np.isfinite(flat)] if a.dtype.kind == "f" else flat
    span = f"min {finite.min():.7g}, max {finite.max():.7g}" if finite.size else "no finite value"
    return f"{head} ({span}) = [{shown}, ...]"


def _op_at(term: Term, path: tuple[int, ...]) -> str:
    for k in path:
        term = term.args[k]
    return term.op if isinstance(term, OpTerm) else "?"


def format_result(result: RuleResult) -> str:
    """One line per rule; a failing rule adds its shrunk counterexample."""
    rule = result.rule
    line = (f"{result.status:<5} {rule.name}  {rule.loc.file}:{rule.loc.line}  "
            f"{result.examples} examples  {result.seconds:.2f}s")
    lines = [line] + [f"      note: {n}" for n in result.notes]
    if result.message:
        lines.append(f"      {result.message}")
    cx = result.counterexample
    if cx is None:
        return "\n".join(lines)
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
            shown = ", ".join(f"{k}={v}" for k, v in sorted(attrs.items()))
            lines.append(f"        {_op_at(source, path)} at {list(path)}: {shown}")
    lines.append(f"        left  {show_term(source)}")
    if cx.lhs is not None:
        lines.append(f"          = {show_array(cx.lhs)}")
    lines.append(f"        right {show_term(target)}")
    if cx.rhs is not None:
        lines.append(f"          = {show_array(cx.rhs)}")
    return "\n".join(lines)
