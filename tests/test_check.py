"""Tests for rule checking: standard rules pass, deliberately wrong ones are caught readably."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from saturate.check.checker import check_rule, check_rules, compare, format_result, run_example
from saturate.cli import main
from saturate.lang.parser import RULES_DIR, load_rulesets
from saturate.lang.ast import Guard, Loc, OpTerm, Rule, Var

BAD_DIR = Path(__file__).parent / "bad_rules"
BAD_FILES = sorted(BAD_DIR.glob("*.rules"))


def _rules(path) -> list[Rule]:
    return [r for rs in load_rulesets([path]) for r in rs.rules]


def _relu_scale(guarded: bool) -> Rule:
    x, s = Var("x"), Var("s", const=True)
    lhs = OpTerm("Relu", (OpTerm("Mul", (x, s)),))
    rhs = OpTerm("Mul", (OpTerm("Relu", (x,)), s))
    guards = (Guard("positive", (s,)),) if guarded else ()
    return Rule("relu-scale", lhs, rhs, guards, "t", 3, Loc("<test>", 1))


# ---- the standard library ------------------------------------------------------------------

def test_standard_rules_pass_quickly():
    rules = _rules(RULES_DIR)
    assert len(rules) >= 10
    results = check_rules(rules, examples=15, seed=0)
    failing = [format_result(r) for r in results if r.status != "PASS"]
    assert not failing, "\n".join(failing)


@pytest.mark.slow
def test_check_of_rules_dir_at_default_examples_is_sound(capsys):
    # Its speed is measured by `saturate check` itself (seconds per rule), not asserted here:
    # a timed test fails on a busy shared machine.
    code = main(["check", str(RULES_DIR), "--seed", "0"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "200 examples" in out


# ---- deliberately wrong rules ---------------------------------------------------------------

@pytest.mark.parametrize("path", BAD_FILES, ids=[p.stem for p in BAD_FILES])
def test_wrong_rule_is_caught_with_a_readable_counterexample(path):
    (rule,) = _rules(path)
    result = check_rule(rule, examples=200, seed=1)
    assert result.status == "FAIL", format_result(result)
    text = format_result(result)
    assert text.startswith(f"FAIL  {rule.name}  {rule.loc.file}:{rule.loc.line}")
    assert "counterexample" in text and "left " in text and "right " in text
    # Every variable of the rule is shown with its shape and (small) values in full.
    for name in result.counterexample.example.values:
        assert f"        {name} (" in text
    assert len(text.splitlines()) < 40


def test_all_five_kinds_of_mistake_are_present():
    assert {p.stem for p in BAD_FILES} >= {"bn_missing_epsilon", "sub_wrong_sign", "conv_scale_wrong_axis",
                                           "relu_scale_no_guard", "gemm_bias_swapped_axis",
                                           "add_zero_grows_shape", "div_const_integer"}


def test_guard_makes_the_difference():
    assert check_rule(_relu_scale(guarded=True), examples=100, seed=2).status == "PASS"
    bad = check_rule(_relu_scale(guarded=False), examples=100, seed=2)
    assert bad.status == "FAIL"
    ex = bad.counterexample.example
    assert (ex.values["s"] < 0).any()  # the shrunk counterexample shows the negative scale


def test_unsatisfiable_guards_are_reported_not_passed():
    s = Var("s", const=True)
    rule = _relu_scale(guarded=True)
    rule = Rule(rule.name, rule.lhs, rule.rhs, rule.guards + (Guard("zeros", (s,)),), "t", 3, rule.loc)
    result = check_rule(rule, examples=20, seed=0)
    assert result.status == "NOGEN"
    assert "could not generate examples" in format_result(result)


def test_same_seed_same_report():
    rule = _relu_scale(guarded=False)
    first = format_result(check_rule(rule, examples=50, seed=7)).split("s\n", 1)[1]
    second = format_result(check_rule(rule, examples=50, seed=7)).split("s\n", 1)[1]
    assert first == second


# ---- comparison -----------------------------------------------------------------------------

def test_compare_tolerates_rounding_but_not_errors():
    a = np.array([1.0, 1e6, 0.0])
    assert compare(a, a * (1 + 1e-9), scale=1e6) is None
    assert compare(a, a + [0, 0, 1e-3], scale=1e6) is None           # tiny next to the largest value
    assert "index [0]" in compare(a, a + [1e-3, 0, 0], scale=1.0)
    assert "shapes differ" in compare(a, a[:2], scale=1.0)


def test_compare_ignores_where_the_left_side_is_undefined():
    lhs = np.array([np.inf, 1.0])
    assert compare(lhs, np.array([np.nan, 1.0]), scale=1.0) is None
    assert compare(np.array([1.0]), np.array([np.nan]), scale=1.0) is not None


def test_run_example_reports_the_right_side_failing():
    from saturate.check.examples import Example
    x, w = Var("x"), Var("w", const=True)
    rule = Rule("bad-matmul", OpTerm("MatMul", (x, w)), OpTerm("MatMul", (w, x)), (), "t", 1, Loc("<t>", 1))
    ex = Example({"x": np.ones((2, 3), np.float32), "w": np.ones((3, 4), np.float32)}, frozenset({"w"}), {}, {})
    cx = run_example(rule, ex)
    assert cx is not None and "right side fails" in cx.reason


# ---- command line ---------------------------------------------------------------------------

def test_cli_exit_codes(tmp_path, capsys):
    good = tmp_path / "good.rules"
    good.write_text("ruleset g level 2\nrule sub-const  Sub(x, c:const) => Add(x, -c)\n")
    assert main(["check", str(good), "--examples", "20", "--seed", "0"]) == 0
    assert "PASS  sub-const" in capsys.readouterr().out
    assert main(["check", str(BAD_DIR / "sub_wrong_sign.rules"), "--examples", "50", "--seed", "0"]) == 1
    assert "FAIL  sub-wrong-sign" in capsys.readouterr().out


def test_cli_file_that_does_not_load_exits_2(tmp_path, capsys):
    broken = tmp_path / "broken.rules"
    broken.write_text("ruleset b level 2\nrule oops  Sub(x, c:const) => Add(x,\n")
    assert main(["check", str(broken)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("saturate: error: ") and "broken.rules:" in err
    assert main(["check", str(tmp_path / "missing.rules")]) == 2
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["check", str(empty)]) == 2
    assert "no rules in" in capsys.readouterr().err
