"""Op registry, reduction family."""

from __future__ import annotations

from saturate.ops.registry import define

for _name in ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin"):
    define(_name, c="kernel", param_inputs=True)
