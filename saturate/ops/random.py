"""Op registry, random family: ops whose value is not a function of their inputs."""

from __future__ import annotations

from saturate.ops.registry import define

for _name in ("RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"):
    define(_name, nondeterministic=True)
