"""Op registry, random family: ops whose value is not a function of their inputs."""

from __future__ import annotations

from saturate.interp import kernels as k
from saturate.ops.registry import define

# Run on onnx.reference, which draws them with numpy (seeded by their `seed` when given).
for _name in ("RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli"):
    define(_name, nondeterministic=True)
# onnx.reference has no Multinomial: the interpreter's kernel draws as ONNX Runtime does.
define("Multinomial", nondeterministic=True, evaluate=k.multinomial, arity=(1, 1))
