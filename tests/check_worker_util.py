"""A check worker that dies on one rule: the initializer a test gives check_rules' worker pool."""

from __future__ import annotations

import os

import saturate.check.checker as checker


def die_on_rule_named_killer() -> None:
    """Worker initializer: the worker's check_rule exits the process, as an out-of-memory kill
    would, when handed the rule named `killer` (tasks name check_rule by module and name, so
    they reach this one)."""
    checker._import_checker()
    real = checker.check_rule

    def check_rule(rule, examples, seed):
        if rule.name == "killer":
            os._exit(137)
        return real(rule, examples, seed)

    checker.check_rule = check_rule
