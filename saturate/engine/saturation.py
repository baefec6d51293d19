"""Run stage: egglog saturation one iteration at a time, under limits, with guards checked in Python.

The limits hold inside an iteration, not only between iterations. An egglog step cannot be
stopped once it has started, so each one is forecast before it runs: a rule's matches from how
they grew over its last steps, the seconds and new e-nodes of a match from the last steps, the
Python work after the step (reading the e-graph back, checking guards) from the e-graph's size.
A step of every rule at once runs when its forecast fits in the time and the e-nodes left.
Otherwise the rules run one at a time (each has its own ruleset), cheapest first, each only if
its own forecast still fits; a rule that does not fit is held back for the rest of the run, since
what is left only shrinks. Held-back rules end saturation with the limit that held them, and
the e-graph as it stands is what extraction reads: the best graph found so far.

A forecast of matches can still fall short (a rule's matches can jump between two steps), so the
node limit does not rest on it: a rule run alone runs capped. One match of a rewrite adds at
most the e-nodes its right side builds (`_Group.bound`), and egglog's back-off scheduler applies
a rule's matches only when there are no more than its match limit, else none of them: with the
limit set to the e-nodes left over that bound, the step cannot pass --max-nodes. A capped step
matches afresh (the scheduler is new each step, so its matches include those already applied),
which costs more and holds back more than an ordinary step would need; still every rule run
alone is capped, since a forecast misses even with a margin (a rule whose matches went from 10 to
50 took the e-graph to 334 under a limit of 300, uncapped because twice its forecast fitted).
The step of every rule at once stays uncapped, and runs only while the e-nodes its matches added
lately, forecast and taken NODE_MARGIN times, fit: that step alone rests on a forecast.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from saturate.engine.egraph import EGraphView, node_count, read_egraph
from saturate.engine.encode import ENCODE, Encoding, Rows, chunks
from saturate.engine.compile_rules import QUERY_FNS
from saturate.engine.compiled_rule import CompiledRule
from saturate.engine.facts import Facts
from saturate.engine.guards import Checker, attr_rows
from saturate.lang.ast import Call, IntList, Num, OpTerm, Str, Var


FACTS, APPLY, SIZE = "(run facts 1)", "(run apply 1)", "(print-size)"
MAX_GROWTH = 64.0       # a rule's matches are forecast to grow at most this much in one step
# Forecast seconds count this much more: a step's matches and the machine's load both vary (a
# shared machine's load can halve a process's speed between two steps; with a margin of two, the
# GROWING rules overran --timeout 4 by 20% while another test ran beside them), and stopping a
# little early costs less than overrunning the limit.
TIME_MARGIN = 3.0
# The step of every rule at once, uncapped, must fit this many times its forecast e-nodes; closer
# to the limit every rule runs alone, and capped.
NODE_MARGIN = 2.0


@dataclass
class RunReport:
    """How saturation went: why it stopped, e-graph size per iteration, matches per rule."""

    stop_reason: str = "saturated"     # saturated | iteration limit | node limit | time limit
    iterations: int = 0
    sizes: list[int] = field(default_factory=list)
    matches: dict[str, int] = field(default_factory=dict)       # rule label -> matches
    locations: dict[str, str] = field(default_factory=dict)     # rule label -> file:line
    seconds: float = 0.0
    peak_nodes: int = 0                                          # largest e-graph seen, in e-nodes
    peak_rss: int = 0                                            # the process's peak memory, bytes
    held_back: dict[str, str] = field(default_factory=dict)     # rule label -> limit that held it

    @property
    def hit_limit(self) -> bool:
        return self.stop_reason != "saturated"


class _Egg:
    """egglog commands, each parsed once: parsing a command costs more than a small step."""

    def __init__(self, eg: Any):
        self.eg = eg
        self.parsed: dict[str, list] = {}
        # The largest e-graph any run left: unions a later run makes can merge e-nodes, so the
        # size read at the end of an iteration may be below what a step within it reached.
        self.peak = 0

    def __call__(self, text: str) -> list:
        commands = self.parsed.get(text)
        if commands is None:
            commands = self.parsed[text] = self.eg.parse_program(text)
        out = self.eg.run_program(*commands)
        if text.startswith("(run"):
            self.peak = max(self.peak, self.size())
        return out

    def size(self) -> int:
        return node_count(self(SIZE)[-1].sizes)


@dataclass
class _Group:
    """One rule's matching side, in its own ruleset, and how its last steps went."""

    rule: CompiledRule
    names: tuple[str, ...]              # egglog rules of the group: a rewrite, or a match rule
    matches: int = 0                    # in its last step
    before: int = 0                     # in the step before that
    seconds_per_match: float | None = None   # measured when it last ran alone
    nodes_per_match: float | None = None     # likewise (a rewrite's; a match rule adds none itself)
    bound: int | None = None            # e-nodes one match adds at most (None: a guarded rule)
    found: int = 0                      # matches found so far, what a capped step finds again
    searched_at: int = 0                # e-nodes of the e-graph its last step searched

    def __post_init__(self) -> None:
        if not self.rule.checked:
            self.bound = rhs_nodes(self.rule.rhs) + sum(rhs_nodes(t) for t in self.rule.rule.more_rhs)

    def forecast(self, size: int = 0) -> int:
        """Matches of its next step on an e-graph of `size` e-nodes: the last count, grown as it
        grew the step before, and at least as the e-graph grew since (other rules' steps, run
        alone, can multiply what this one matches: new Adds for Add's commutativity)."""
        growth = self.matches / self.before if self.before else 1.0
        if self.searched_at and size > self.searched_at:
            growth = max(growth, size / self.searched_at)
        return math.ceil(self.matches * min(MAX_GROWTH, max(1.0, growth)))

    def record(self, matches: int, found: int | None = None, size: int = 0) -> None:
        """New matches of a step on an e-graph of `size` e-nodes, and every match it found when
        that is known (a capped step finds the old ones again)."""
        self.before, self.matches = self.matches, matches
        self.found = found if found is not None else self.found + matches
        self.searched_at = size


@dataclass
class _Forecast:
    """What steps cost lately: fixed seconds per egglog call, seconds and e-nodes per match,
    and seconds of Python work per e-node after a step."""

    call: float = 0.0
    per_match: float = 0.0
    nodes_per_match: float = 0.0
    tail_per_node: float = 0.0

    def step(self, groups: list[_Group], size: int, bound: bool = True) -> tuple[float, float]:
        """Seconds and new e-nodes of one step of `groups` together on an e-graph of `size`: a
        match's e-nodes at most (its rule's bound), or as many as matches added lately
        (`bound=False`)."""
        seconds, nodes = self.call, 0.0
        for g in groups:
            n = g.forecast(size)
            seconds += n * (g.seconds_per_match if g.seconds_per_match is not None else self.per_match)
            # A rewrite's own bound; a guarded rule's e-nodes come later, from its Ok rows.
            lately = max(self.nodes_per_match, g.nodes_per_match or 0.0)
            nodes += n * (g.bound if bound and g.bound is not None else lately)
        return seconds, nodes


def rhs_nodes(term: Any) -> int:
    """E-nodes a rewrite's right side builds at most: one per op, constant function and literal
    (a matched variable and a value the match captured build none)."""
    if isinstance(term, OpTerm):
        return 1 + sum(rhs_nodes(a) for a in term.args)
    if isinstance(term, Call):
        return 0 if term.fn in QUERY_FNS else 1 + sum(rhs_nodes(a) for a in term.args)
    return 1 if isinstance(term, (Num, Str, IntList)) else 0


def saturate(eg: Any, enc: Encoding, rules: list[CompiledRule], max_iterations: int,
             max_nodes: int, timeout: float,
             progress: Callable[[int, int, float, dict[str, int]], None] | None = None
             ) -> tuple[RunReport, Facts]:
    """Run the rules to saturation or a limit; returns the report and the final e-graph facts."""
    report = RunReport()
    by_name = {cr.name: cr for cr in rules}
    for cr in rules:
        report.matches.setdefault(cr.label, 0)
        report.locations[cr.label] = str(cr.rule.loc)
    checked = [cr for cr in rules if cr.checked]
    relations = tuple(f"Cand_{cr.index}" for cr in checked)
    checker = Checker(eg, enc)
    egg = _Egg(eg)
    attrs = _AttrTables(eg, enc, [cr for cr in rules if cr.attr_tests])
    attrs.update()
    groups = [_Group(cr, (cr.name, f"m{cr.name}")) for cr in rules]
    step_set = _combine(egg, groups, 0)
    folds = [g for g in groups if folds_to_existing(g.rule)]
    fold_set = _combine(egg, folds, "fold") if folds else None
    held: dict[str, str] = {}          # group ruleset -> the limit that held it back
    cache: dict = {}
    start = time.perf_counter()
    # The e-graph is read after the first step, not before: the step's matches are what the
    # checker asks about, and a read is a pass over every e-node in Python.
    view: EGraphView | None = None
    size = egg.size()
    report.sizes.append(size)
    report.peak_nodes = size
    cost = _Forecast()
    dirty = False
    report.stop_reason = "iteration limit"
    while report.iterations < max_iterations:
        if time.perf_counter() - start > timeout:
            report.stop_reason = "time limit"
            break
        if size > max_nodes:
            report.stop_reason = "node limit"
            break
        active = [g for g in groups if g.rule.group not in held]
        if groups and not active:
            report.stop_reason = next(iter(held.values()))
            break

        def fits(seconds: float, nodes: float, size: int = size) -> str | None:
            """The limit work of this forecast, on an e-graph of `size`, would break (or None)."""
            after = size + nodes
            ahead = TIME_MARGIN * (seconds + cost.tail_per_node * after)
            if time.perf_counter() - start + ahead > timeout:
                return "time limit"
            return "node limit" if after > max_nodes else None

        facts_updated = egg(FACTS)[-1].report.updated
        before = size
        step: dict[str, int] = {}
        matched = 0
        seconds, nodes = cost.step(active, size, bound=False)
        # Without a step to learn from, the first one runs uncapped only far from the limit.
        if (size * NODE_MARGIN <= max_nodes if report.iterations == 0
                else fits(seconds, NODE_MARGIN * nodes) is None):
            # One step of every rule at once, the ordinary case.
            c = time.perf_counter()
            run = egg(f"(run {step_set} 1)")[-1].report
            seconds = time.perf_counter() - c
            updated = run.updated
            for g in active:
                g.record(sum(run.num_matches_per_rule.get(n, 0) for n in g.names), size=before)
                matched += g.matches
            _count(run, by_name, step)
            cost.call = min(cost.call, seconds) if cost.call else seconds
            cost.per_match = max(seconds - cost.call, 0.0) / max(matched, 1)
        else:
            ran, updated, matched, size = _one_at_a_time(egg, active, cost, fits, held, by_name, step, size,
                                                         max_nodes)
            report.peak_nodes = max(report.peak_nodes, size)
            if not ran:
                # Every rule is held back: nothing changed, and reading the e-graph again would
                # only spend time the limit does not leave.
                report.stop_reason = next(iter(held.values()))
                break
            if held:
                step_set = _combine(egg, [g for g in groups if g.rule.group not in held], report.iterations + 1)
        t = time.perf_counter()
        report.iterations += 1
        commands = None
        # When nothing matched anew and nothing changed since the last read, that view is the
        # e-graph and the checker decided every candidate in it: reading it again and asking the
        # same questions would find nothing.
        if updated or facts_updated or dirty or checker.cut:
            view = read_egraph(eg, relations)
            facts = Facts(view, enc, cache)
            # Deciding guards is Python-paced work that can grow faster than the e-graph (constant
            # expressions to evaluate): the checker stops at the limit between candidates.
            deadline = start + timeout
            commands = checker.check(checked, view, facts, deadline)
            if commands:
                _apply(egg, commands, attrs, by_name, step)
            dirty = bool(commands)
            if (updated or dirty) and fold_set:
                # Constant folding goes to its fixed point inside the iteration: a chain of shape
                # arithmetic (Swin pads each stage from the last one's shape) would otherwise take
                # an iteration per op. Folds add no op e-node, so this ends and never grows the graph.
                dirty = _fold_to_fixed_point(egg, fold_set, deadline, by_name, step) or dirty
        new_size = egg.size() if dirty or view is None else view.size
        cost.nodes_per_match = max(new_size - before, 0) / max(matched, 1)
        size = new_size
        report.sizes.append(size)
        report.peak_nodes = max(report.peak_nodes, size)
        for label, n in step.items():
            report.matches[label] += n
        if progress is not None:
            progress(report.iterations, size, time.perf_counter() - start, step)
        cost.tail_per_node = (time.perf_counter() - t) / max(size, 1)
        if not updated and not commands:
            # Candidates the checker had no time for are not a fixed point.
            report.stop_reason = next(iter(held.values()), "time limit" if checker.cut else "saturated")
            break
    if view is None:
        view = read_egraph(eg, relations)
    elif dirty:
        # The rewrites applied after the last read are not in `view`. Reading them costs time
        # the limit may not have left; the view without them is still a sound e-graph.
        if report.stop_reason != "time limit" or (time.perf_counter() - start
                                                  + cost.tail_per_node * size <= timeout):
            view = read_egraph(eg, relations)
    if held:
        # The first limit reached is the reason, even if the other rules went on to another.
        report.stop_reason = next(iter(held.values()))
    report.held_back = {g.rule.label: held[g.rule.group] for g in groups if g.rule.group in held}
    # The e-graph never shrinks: its size now bounds every step's, including a step the loop
    # left before reading the size back (a rule held back after its step ran).
    report.peak_nodes = max(report.peak_nodes, egg.size(), egg.peak)
    report.seconds = time.perf_counter() - start
    report.peak_rss = peak_rss()
    return report, Facts(view, enc, cache)


def peak_rss() -> int:
    """The process's peak resident memory in bytes so far (0 where the OS does not say)."""
    try:
        import resource
    except ImportError:        # not on POSIX
        return 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024     # macOS counts bytes, Linux KiB


def folds_to_existing(cr: CompiledRule) -> bool:
    """Whether a rule's right side is a constant expression or one of the values it matched:
    it unites classes and adds constant nodes, never an op."""
    return cr.direction != "reverse" and isinstance(cr.rule.rhs, (Call, Var))


def _fold_to_fixed_point(egg: _Egg, fold_set: str, deadline: float, by_name: dict[str, CompiledRule],
                         step: dict[str, int]) -> bool:
    """Run the folding rules alone until they change nothing (unless past the deadline); whether
    any did.

    egglog runs the folds it decides alone (no guard) to their own fixed point: a chain of
    constant ops folds in one round, not one round per link. Candidates of guarded folds wait
    for the next iteration's read of the e-graph: reading it here as well, to decide them at
    once, left every corpus model's iterations, nodes and cost as they were and took a tenth of
    saturation's time (a read is a pass over every e-node in Python)."""
    if time.perf_counter() >= deadline:
        return False
    run = egg(f"(run-schedule (saturate (run facts) (run {fold_set})))")[-1].report
    _count(run, by_name, step)
    return bool(run.updated)


def _apply(egg: _Egg, rows: Rows, attrs: "_AttrTables", by_name: dict[str, CompiledRule],
           step: dict[str, int]) -> None:
    """Insert the checker's rows, give the new handles their e-classes (the `encode` run), and
    apply the checked rewrites now, so one iteration is one step of every rule."""
    rows.run(egg.eg)
    attrs.update()
    egg(ENCODE)
    _count(egg(APPLY)[-1].report, by_name, step)


class _AttrTables:
    """Keeps the rules' attribute-test relations (saturate.engine.compile_rules) up to date:
    guards and right sides register new attribute sets as saturation goes."""

    def __init__(self, eg: Any, enc: Encoding, rules: list[CompiledRule]):
        self.eg, self.enc, self.rules = eg, enc, rules
        self.done = 0

    def update(self) -> None:
        if not self.rules or self.done == len(self.enc.attr_sets):
            return
        rows = attr_rows(self.enc, self.rules, self.done)
        self.done = len(self.enc.attr_sets)
        for piece in chunks(rows):
            self.eg.run_program(*self.eg.parse_program(piece))


def _combine(egg: _Egg, groups: list[_Group], k: int | str) -> str:
    """A ruleset running `groups` together (every rule's matching side, less those held back)."""
    name = f"step{k}"
    if groups:
        egg(f"(unstable-combined-ruleset {name} {' '.join(g.rule.group for g in groups)})")
    else:
        egg(f"(ruleset {name})")
    return name


def _one_at_a_time(egg: _Egg, active: list[_Group], cost: _Forecast, fits: Callable,
                   held: dict[str, str], by_name: dict[str, CompiledRule], step: dict[str, int],
                   size: int, max_nodes: int) -> tuple[bool, bool, int, int]:
    """One step of each rule alone, cheapest forecast first; a rule whose forecast does not fit
    what is left is held back, and so is a rewrite with more matches than the e-nodes left allow
    (its step is capped, see the module docstring). Returns whether any rule ran, whether
    anything changed, the matches and the new size."""
    ran, updated, matched = False, False, 0
    for g in sorted(active, key=lambda g: (cost.step([g], size)[0], g.rule.index)):
        seconds, nodes = cost.step([g], size)
        capped = bool(g.bound)      # a rewrite that builds e-nodes; guarded rules add theirs later
        if capped:
            # A capped step searches every match again, old ones too: its time grows with them.
            per = g.seconds_per_match if g.seconds_per_match is not None else cost.per_match
            seconds += max(g.found - g.forecast(size), 0) * per
        # A capped step cannot pass the node limit whatever its forecast: only time is forecast.
        limit = fits(seconds, 0.0 if capped else nodes, size)
        cap = (max_nodes - size) // g.bound if capped else 0
        if limit is None and capped and cap < 1:
            limit = "node limit"
        if limit is not None:
            held[g.rule.group] = limit
            continue
        c, ran = time.perf_counter(), True
        if capped:
            run = egg(f"(run-schedule (let-scheduler cap (back-off :match-limit {cap})) "
                      f"(run-with cap {g.rule.group}))")[-1].report
            # The scheduler's first iteration is its search, the next ones apply what it chose.
            found = sum(r.num_matches for rs in run.iterations[0].rule_set_report.rule_reports.values()
                        for r in rs) if run.iterations else 0
            changed = any(it.rule_set_report.changed for it in run.iterations)
        else:
            run = egg(f"(run {g.rule.group} 1)")[-1].report
            found = sum(run.num_matches_per_rule.get(n, 0) for n in g.names)
            changed = run.updated
        seconds = time.perf_counter() - c
        searched = found
        if capped:
            # Of every match found, those beyond the matches found so far are the step's new ones
            # (about: unions can merge old ones), which the forecast and the report count.
            found, searched = max(found - g.found, 0), found
            g.record(found, searched, size)
        else:
            g.record(found, size=size)
        g.seconds_per_match = max(seconds - cost.call, 0.0) / max(searched, 1)
        if capped and searched > cap:
            # Nothing was applied: even alone, this rule's step could pass the node limit.
            held[g.rule.group] = "node limit"
            continue
        matched += g.matches
        updated = updated or changed
        if capped:
            step[g.rule.label] = step.get(g.rule.label, 0) + found
        else:
            _count(run, by_name, step)
        new_size = egg.size()
        if not g.rule.checked:
            g.nodes_per_match = max(new_size - size, 0) / max(g.matches, 1)
        size = new_size
    return ran, updated, matched, size


def _count(run: Any, by_name: dict[str, CompiledRule], into: dict[str, int]) -> None:
    """Add egglog's per-rule match counts of one run to `into`, by rule label."""
    for name, n in run.num_matches_per_rule.items():
        cr = by_name.get(name)
        if cr is not None and n:
            into[cr.label] = into.get(cr.label, 0) + n
