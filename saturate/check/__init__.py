"""Rule checking: draw examples of a rule's pattern and compare both sides on the interpreter.

Users write their own soundness tests with these, e.g.::

    from hypothesis import given
    from saturate import check

    @given(check.rule_examples(my_rule))
    def test_my_rule(example):
        assert check.run_example(my_rule, example) is None
"""

from saturate.core.extras import need

# Every module here draws with hypothesis: without the extra, one ImportError naming it.
need("hypothesis", "check", "saturate.check")

from saturate.check.checker import RuleResult, check_rule, check_rules, format_result, run_example
from saturate.check.examples import Example, rule_examples
from saturate.check.strategies import (broadcastable_shapes, constants, conv_cases, per_axis_constants,
                                       per_axis_shapes, shapes)

__all__ = ["RuleResult", "Example", "broadcastable_shapes", "check_rule", "check_rules", "constants",
           "conv_cases", "format_result", "per_axis_constants", "per_axis_shapes", "rule_examples",
           "run_example", "shapes"]
