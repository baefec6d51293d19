"""Run stage: egglog saturation one iteration at a time, under limits, with guards checked in Python."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from saturate.engine.egraph import read_egraph
from saturate.engine.encode import Encoding, chunks
from saturate.engine.compile_rules import CompiledRule
from saturate.engine.facts import Facts
from saturate.engine.guards import Checker


STEP = "(run facts 1)\n(run 1)"


@dataclass
class RunReport:
    """How saturation went: why it stopped, e-graph size per iteration, matches per rule."""

    stop_reason: str = "saturated"     # saturated | iteration limit | node limit | time limit
    iterations: int = 0
    sizes: list[int] = field(default_factory=list)
    matches: dict[str, int] = field(default_factory=dict)       # rule label -> matches
    locations: dict[str, str] = field(default_factory=dict)     # rule label -> file:line
    seconds: float = 0.0

    @property
    def hit_limit(self) -> bool:
        return self.stop_reason != "saturated"


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
    cache: dict = {}
    start = time.perf_counter()
    view = read_egraph(eg, relations)
    report.sizes.append(view.size)
    dirty = False
    report.stop_reason = "iteration limit"
    while report.iterations < max_iterations:
        if time.perf_counter() - start > timeout:
            report.stop_reason = "time limit"
            break
        if view.size > max_nodes:
            report.stop_reason = "node limit"
            break
        # Facts first (which e-classes are constant; one pass suffices: no fact depends on another).
        out = eg.run_program(*eg.parse_program(STEP))
        run = out[-1].report
        report.iterations += 1
        step: dict[str, int] = {}
        _count(run, by_name, step)
        view = read_egraph(eg, relations)
        report.sizes.append(view.size)
        facts = Facts(view, enc, cache)
        commands = checker.check(checked, view, facts)
        if commands:
            for piece in chunks(commands):
                eg.run_program(*eg.parse_program(piece))
            # Apply the checked rewrites now, so one iteration is one step of every rule.
            _count(eg.run_program(*eg.parse_program("(run apply 1)"))[-1].report, by_name, step)
        dirty = bool(commands)
        for label, n in step.items():
            report.matches[label] += n
        if progress is not None:
            progress(report.iterations, view.size, time.perf_counter() - start, step)
        if not run.updated and not commands:
            report.stop_reason = "saturated"
            break
    if dirty:
        view = read_egraph(eg, relations)
    report.seconds = time.perf_counter() - start
    return report, Facts(view, enc, cache)


def _count(run: Any, by_name: dict[str, CompiledRule], into: dict[str, int]) -> None:
    """Add egglog's per-rule match counts of one run to `into`, by rule label."""
    for name, n in run.num_matches_per_rule.items():
        cr = by_name.get(name)
        if cr is not None and n:
            into[cr.label] = into.get(cr.label, 0) + n
