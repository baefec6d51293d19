"""Targets: what a device runs and at what cost (target files), and which nodes it preserves."""

from saturate.targets.target import (TARGETS_DIR, Composite, Target, flops, list_targets, load_target, nbytes,
                                     parse_target, target_files)

__all__ = ["TARGETS_DIR", "Composite", "Target", "flops", "list_targets", "load_target", "nbytes",
           "parse_target", "target_files"]
