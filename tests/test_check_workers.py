"""check_rules' worker processes: a worker that dies costs only the rule it was checking."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor

from saturate.check import check_rules
from saturate.check import checker
from saturate.lang.parser import load_rules

RULES = """ruleset probe level 1
rule identity Identity(x) => x
rule killer Neg(Neg(x)) => x
rule abs-abs Abs(Abs(x)) => Abs(x)
rule relu-relu Relu(Relu(x)) => Relu(x)
"""


def test_a_worker_that_dies_loses_only_its_rule(tmp_path, monkeypatch):
    from check_worker_util import die_on_rule_named_killer

    def dying_pool(workers):
        return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=die_on_rule_named_killer)
    monkeypatch.setattr(checker, "_pool", dying_pool)
    path = tmp_path / "probe.rules"
    path.write_text(RULES)
    shown = []
    results = check_rules(load_rules([str(path)]), examples=10, seed=0, jobs=2, progress=shown.append)
    assert [(r.rule.name, r.status) for r in results] == [
        ("identity", "PASS"), ("killer", "ERROR"), ("abs-abs", "PASS"), ("relu-relu", "PASS")]
    assert "worker process died checking this rule (out of memory or a signal)" in results[1].message
    assert [r.rule.name for r in shown] == ["identity", "killer", "abs-abs", "relu-relu"]


def test_an_op_that_reads_a_drawn_value_as_a_size_is_checked_within_small_tensors(tmp_path, monkeypatch):
    """HannWindow's length is its input's value, drawn anywhere up to 2**62: examples that would
    allocate more than an example may (checker.EXAMPLE_MAX_BYTES) are drawn again, not run."""
    from saturate.check import check_rule
    from saturate.core.limits import max_memory_bytes

    monkeypatch.setenv("SATURATE_MAX_MEMORY", "1G")
    path = tmp_path / "window.rules"
    path.write_text("ruleset probe level 1\nrule window Identity(HannWindow(n)) => HannWindow(n)\n")
    [rule] = load_rules([str(path)])
    result = check_rule(rule, examples=30, seed=0)
    assert result.status == "PASS", result
    assert max_memory_bytes() == 1 << 30      # the lower limit held only while checking
