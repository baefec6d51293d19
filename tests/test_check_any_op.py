"""`saturate check` draws examples for rules over any ONNX op the interpreter runs: ops with
required attributes, unsigned parameters, or a reference kernel that runs only at float32;
ops that draw random numbers are refused with the reason."""

from __future__ import annotations

import pytest

from saturate.check import check_rule
from saturate.lang.parser import load_rules


def _probe(tmp_path, op: str, arity: int):
    args = ", ".join(f"x{k}" for k in range(arity))
    path = tmp_path / "probe.rules"
    path.write_text(f"ruleset probe level 1\nrule probe Identity({op}({args})) => {op}({args})\n")
    [rule] = load_rules([str(path)])
    return check_rule(rule, examples=8, seed=0)


# Each drew no example (or failed in the checker) before: required attributes (DepthToSpace's
# blocksize, LRN's size, GroupNormalization's num_groups, LpPool's kernel_shape), a uint8
# parameter drawn as -1 (OneHot, ScatterElements), a reference body that fails in float64
# (MeanVarianceNormalization), a window length read from a drawn value (HannWindow), TopK's
# count (its input is named K, and takes one element).
@pytest.mark.parametrize("op, arity", [("DepthToSpace", 1), ("LRN", 1), ("GroupNormalization", 3),
                                       ("LpPool", 1), ("OneHot", 3), ("ScatterElements", 3),
                                       ("MeanVarianceNormalization", 1), ("HannWindow", 1), ("TopK", 2)])
def test_a_rule_over_the_op_is_checked(tmp_path, op, arity):
    result = _probe(tmp_path, op, arity)
    assert result.status == "PASS", result


@pytest.mark.parametrize("op, arity", [("RandomNormalLike", 1), ("Bernoulli", 1)])
def test_an_op_drawing_random_numbers_is_refused_with_the_reason(tmp_path, op, arity):
    result = _probe(tmp_path, op, arity)
    assert result.status == "NOGEN", result
    assert f"op '{op}' cannot be checked: it draws random numbers" in result.message
