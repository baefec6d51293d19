"""Op registry, reduction family."""

from __future__ import annotations

from saturate.ops.registry import define

for _name in ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceSumSquare", "ReduceL2"):
    define(_name, c="kernel", param_inputs=True)
