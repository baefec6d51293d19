"""The optimizer: encode -> saturate -> extract -> fold, as one plain function with a report."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import math
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from saturate.engine.cost import graph_cost, resolve_target
from saturate.engine.encode import encode_graph, loaded_egraph, release
from saturate.engine.compile_rules import applicable_rules, compile_rules, rule_ops
from saturate.core.errors import SaturateError
from saturate.engine.extract import Prices, extract
from saturate.engine.decode import decode
from saturate.core.ir import Graph
from saturate.lang.ast import OpTerm, Rule
from saturate.lang.fold import check_fold_bytes
from saturate.engine.saturation import RunReport, saturate

MAX_ITERATIONS = 30
MAX_NODES = 500_000
TIMEOUT = 60.0
# Extraction has its own budget, beside --timeout's for saturation: a quarter of it, at least 2 s.
EXTRACT_SHARE, EXTRACT_MIN = 0.25, 2.0


def extract_budget(timeout: float) -> float:
    """Seconds extraction may take after saturation stopped under `timeout`."""
    return max(EXTRACT_MIN, EXTRACT_SHARE * timeout)


@dataclass
class Report:
    """What one optimize run did: op counts, why saturation stopped, time per stage, matches."""

    ops_before: dict[str, int] = field(default_factory=dict)
    ops_after: dict[str, int] = field(default_factory=dict)
    run: RunReport = field(default_factory=RunReport)
    times: dict[str, float] = field(default_factory=dict)
    cost_before: float = 0.0
    cost_after: float = 0.0
    rules: int = 0
    kept_original: bool = False
    extract_moves: int = 0
    extract_cut: str = ""          # why extraction's answer is the best it had, not the best there is

    def to_json(self) -> dict[str, Any]:
        """The report as plain JSON data (what `--report` writes)."""
        return {
            "ops_before": self.ops_before, "ops_after": self.ops_after,
            "stop_reason": self.run.stop_reason, "iterations": self.run.iterations,
            "held_back": [{"rule": name, "at": self.run.locations.get(name, ""), "limit": limit}
                          for name, limit in sorted(self.run.held_back.items())],
            "peak_egraph_nodes": self.run.peak_nodes, "peak_rss_bytes": self.run.peak_rss,
            "egraph_sizes": self.run.sizes, "times": {k: round(v, 6) for k, v in self.times.items()},
            "cost_before": _finite(self.cost_before), "cost_after": _finite(self.cost_after),
            "kept_original": self.kept_original, "rules_loaded": self.rules,
            "extract_moves": self.extract_moves, "extract_cut": self.extract_cut,
            "matches": [{"rule": name, "at": self.run.locations.get(name, ""), "matches": n}
                        for name, n in sorted(self.run.matches.items())],
        }


def _finite(x: float) -> float | None:
    """JSON has no infinity: a cost the target cannot pay is written as null."""
    return x if math.isfinite(x) else None


def _load(rules: Any, level: int) -> list[Rule]:
    if rules is None:
        from saturate.lang.parser import load_rules
        return load_rules(None, level=level)
    rules = list(rules)
    if all(isinstance(r, Rule) for r in rules):
        return rules
    from saturate.lang.parser import load_rules
    return load_rules([str(p) for p in rules], level=level)


def _preserved(graph: Graph, model: Any, preserve: Iterable[str]) -> tuple[Graph, set[str]]:
    """Node names no rewrite may touch: `preserve` lists op names and node names; nodes the
    model itself marks (graph.meta["preserve"], read on import) are added."""
    from saturate.ops.schema import widest_spec
    from saturate.targets.preserve import preserved
    from saturate.targets.target import Target

    wanted = set(preserve) | set(graph.meta.get("preserve", ()))
    present = {n.op for n in graph.nodes}
    ops = {p for p in wanted if widest_spec(p) is not None or p in present}
    known = {n.name for n in graph.nodes} | {o for n in graph.nodes for o in n.outputs}
    unknown = sorted(wanted - ops - known)
    if unknown:
        raise SaturateError(f"preserve: '{unknown[0]}' is neither an op nor a node of the model")
    if isinstance(model, Target):
        graph, names = preserved(graph, model, ops, wanted - ops)
        return graph, set(names)
    return graph, wanted


def canonical_order(rules: Iterable[Rule]) -> list[Rule]:
    """Rules sorted by a key of their own text, so the order they were given never matters."""
    return sorted(rules, key=_order_key)


@functools.lru_cache(maxsize=4096)
def _order_key(r: Rule) -> tuple:
    # Printing a rule's terms costs more than sorting them: one key per rule and process.
    return r.name, repr(r.lhs), repr(r.rhs), repr(r.guards), repr(r.more_lhs), repr(r.more_rhs)


_frozen = {"depth": 0, "lock": threading.Lock()}


@contextlib.contextmanager
def _older_objects_frozen():
    """Python's cyclic collector leaves the objects that existed before optimize alone while it
    runs (gc.freeze), and collects the engine's own garbage as usual. The engine makes many short-
    lived tuples, and each full collection walked every live object of the process: in the corpus
    bench (238,000 objects, from onnx and onnxsim) that was a fifth of optimize's time."""
    with _frozen["lock"]:
        _frozen["depth"] += 1
        if _frozen["depth"] == 1:
            gc.freeze()
    try:
        yield
    finally:
        with _frozen["lock"]:
            _frozen["depth"] -= 1
            if _frozen["depth"] == 0:
                gc.unfreeze()


@_older_objects_frozen()
def optimize(graph: Graph, rules: Sequence[Rule] | Sequence[str | Path] | None = None,
             level: int = 3, target: Any = "cpu", max_iterations: int = MAX_ITERATIONS,
             max_nodes: int = MAX_NODES, timeout: float = TIMEOUT, preserve: Iterable[str] = (),
             progress: Callable[[int, int, float, dict[str, int]], None] | None = None,
             fold_initializer_inputs: bool = False, composites: bool = False,
             max_fold_bytes: int | None = None) -> tuple[Graph, Report]:
    """Rewrite `graph` with `rules` (default: the standard library at `level`) to the cheapest
    equivalent graph for `target`; returns the new graph and a Report. Inputs with a default
    value (an initializer listed as an input) stay overridable inputs unless
    `fold_initializer_inputs`, which folds them as constants. With `composites`, the target's
    composites join the rules and extraction weighs each against the ops it replaces: a chosen
    one is a node in the target's domain (saturate.partition writes it as an ONNX function).
    `max_fold_bytes` bounds what the rule of any op folds (default DEFAULT_MAX_FOLD_BYTES): a
    larger result stays a node unless its constant inputs were as large."""
    report = Report(ops_before=dict(graph.op_counts()))
    model = resolve_target(target)
    graph, defaults = _input_defaults(graph, fold_initializer_inputs)
    graph, keep = _preserved(graph, model, preserve)
    rule_list = canonical_order(_load(rules, level))
    domains: dict[str, str] = {}
    if composites and getattr(model, "composites", ()):
        rule_list += model.composite_rules()
        domains = {op: model.domain for op in model.composite_ops}
    report.rules = len(rule_list)

    t = time.perf_counter()
    live = applicable_rules(rule_list, {n.op for n in graph.nodes})
    enc = encode_graph(graph, keep, rule_ops(live))
    enc.max_fold_bytes = check_fold_bytes(max_fold_bytes)
    compiled = compile_rules(live, enc)
    eg, program = loaded_egraph(enc, [line for cr in compiled for line in cr.text],
                                [line for cr in compiled for line in cr.apply_text])
    report.times["encode"] = time.perf_counter() - t

    t = time.perf_counter()
    report.run, facts = saturate(eg, enc, compiled, max_iterations, max_nodes, timeout, progress)
    for r in rule_list:                 # the rules that could not match this graph matched 0 times
        for label in (r.name, f"{r.name} (reverse)") if r.bidirectional else (r.name,):
            report.run.matches.setdefault(label, 0)
            report.run.locations.setdefault(label, str(r.loc))
    report.times["saturate"] = time.perf_counter() - t

    t = time.perf_counter()
    roots = [facts.view.lets[enc.value_names[o]] for o in graph.outputs]
    shared = any(report.run.matches.get(r.name) for r in rule_list if _builds_shared(r))
    ext = _extract_evaluable(facts, roots, model, t + extract_budget(timeout), shared)
    report.times["extract"] = time.perf_counter() - t
    if ext is not None and ext.cut:
        budget = extract_budget(timeout)
        report.extract_cut = (f"extraction budget ({budget:g} s) ran out in its {ext.cut}: "
                              + ("kept the input graph" if ext.choice is None else
                                 f"cheapest graph of the {ext.priced} of {ext.nodes} e-nodes priced"
                                 if ext.priced < ext.nodes else "cheapest graph found so far"))
        ext = ext if ext.choice is not None else None    # the deadline left only the input graph

    t = time.perf_counter()
    report.cost_before = graph_cost(_typed_as_known(graph, enc, facts), model)
    if ext is None:
        # A limit can stop saturation where no evaluable choice exists: that is not a failure.
        result, report.kept_original, report.cost_after = graph.copy(), True, report.cost_before
    else:
        report.extract_moves = ext.moves
        result = decode(ext.choice, roots, facts, domains)
        report.cost_after = graph_cost(result, model)
    if report.cost_after > report.cost_before:
        result, report.kept_original = graph.copy(), True
        report.cost_after = report.cost_before
    result.constants.update({k: v for k, v in defaults.items() if k in result.inputs})
    report.ops_after = dict(result.op_counts())
    report.times["fold"] = time.perf_counter() - t
    release(eg, program, enc)   # an error above drops the e-graph instead
    return result, report


def _typed_as_known(graph: Graph, enc, facts) -> Graph:
    """`graph` with every value typed as saturation came to know it, so that its cost and the
    result's are priced on the same shapes (a shape only inference after folding could tell
    would otherwise make the input graph look cheaper)."""
    values = dict(graph.values)
    for name, let in enc.value_names.items():
        cls = facts.view.lets.get(let)
        if cls is not None and name in values:
            values[name] = facts.info(cls)
    return dataclasses.replace(graph, values=values)


def _builds_shared(r: Rule) -> bool:
    """A rule of several roots that builds a node their replacements share (a merged MatMul)."""
    return bool(r.more_rhs) and any(isinstance(t, OpTerm) and any(isinstance(a, OpTerm) for a in t.args)
                                    for _, t in r.roots)


def _extract_evaluable(facts, roots, model, deadline: float | None = None, exact: bool = False):
    """The cheapest extraction whose constant expressions all evaluate, or None if there is none.

    A chosen constant expression that fails to evaluate is banned and extraction runs again (on the
    prices of the first, and under the same deadline); when that keeps happening, every constant
    expression that fails is banned at once."""
    banned: set = set()
    prices = Prices(facts, model.node_cost)
    for _ in range(8):
        ext = extract(facts, roots, model.node_cost, banned, deadline=deadline, prices=prices, exact=exact)
        if ext.choice is None:
            return ext
        bad = {(c, n) for c, n in ext.choice.items() if n.kind == "call" and facts.node_key(n) is None}
        if not bad:
            return ext
        banned |= bad
    banned |= {(c, n) for c, nodes in facts.view.classes.items() for n in nodes
               if n.kind == "call" and facts.node_key(n) is None}
    try:
        ext = extract(facts, roots, model.node_cost, banned, deadline=deadline, prices=prices, exact=exact)
    except SaturateError:
        return None
    if ext.choice is None:
        return ext
    ok = not any(n.kind == "call" and facts.node_key(n) is None for n in ext.choice.values())
    return ext if ok else None


def _input_defaults(graph: Graph, fold: bool) -> tuple[Graph, dict[str, Any]]:
    """Inputs that also have a constant value: dropped from the inputs when folded, else taken out
    of the constants for saturation (no rule may treat an overridable input as a constant) and
    returned, to be put back as defaults."""
    defaults = {k: graph.constants[k] for k in graph.inputs if k in graph.constants}
    if not defaults:
        return graph, {}
    if fold:
        return dataclasses.replace(graph, inputs=[i for i in graph.inputs if i not in defaults]), {}
    values = dict(graph.values)
    values.update({k: graph.info(k) for k in defaults})
    constants = {k: v for k, v in graph.constants.items() if k not in defaults}
    return dataclasses.replace(graph, constants=constants, values=values), defaults
