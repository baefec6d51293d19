"""Test helpers for the engine: small graphs built op by op, and numeric comparison."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from saturate.interp.interpreter import eval_node, run_graph
from saturate.core.ir import Graph, Node, ValueInfo


class Builder:
    """Build a graph op by op; every value's type comes from evaluating it on a sample input."""

    def __init__(self, shape=(1, 4, 6, 6), seed: int = 0, inputs: tuple[str, ...] = ("x",)):
        self.rng = np.random.default_rng(seed)
        self.g = Graph(name="t")
        self.env: dict[str, np.ndarray] = {}
        for name in inputs:
            self.g.inputs.append(name)
            self.g.values[name] = ValueInfo("float32", tuple(shape))
            self.env[name] = self.rng.standard_normal(shape).astype(np.float32)
        self.k = 0

    def _name(self, base: str) -> str:
        self.k += 1
        return f"{base}{self.k}"

    def const(self, arr, base: str = "c") -> str:
        name = self._name(base)
        self.g.constants[name] = np.asarray(arr)
        self.env[name] = self.g.constants[name]
        return name

    def rand(self, *shape, low: float | None = None, base: str = "c") -> str:
        a = self.rng.standard_normal(shape).astype(np.float32)
        if low is not None:
            a = np.abs(a) + np.float32(low)
        return self.const(a, base)

    def op(self, op: str, *inputs: str, domain: str = "", **attrs) -> str:
        out = self._name(op.lower())
        node = Node(op, list(inputs), [out], attrs, name=out, domain=domain)
        value = eval_node(node, [self.env[i] if i else None for i in inputs])[0]
        self.env[out] = value
        self.g.nodes.append(node)
        self.g.values[out] = ValueInfo(value.dtype.name, tuple(value.shape))
        return out

    def conv(self, x: str, cout: int, cin: int, k: int = 3, bias: bool = False, group: int = 1) -> str:
        w = self.rand(cout, cin // group, k, k, base="w")
        ins = [x, w] + ([self.rand(cout, base="b")] if bias else [])
        return self.op("Conv", *ins, kernel_shape=[k, k], pads=[k // 2] * 4, strides=[1, 1], group=group)

    def bn(self, x: str, c: int) -> str:
        return self.op("BatchNormalization", x, self.rand(c, low=0.5, base="g"), self.rand(c, base="be"),
                       self.rand(c, base="m"), self.rand(c, low=0.5, base="v"), epsilon=1e-5)

    def build(self, *outputs: str) -> Graph:
        self.g.outputs = list(outputs)
        return self.g

    def sample(self) -> dict[str, np.ndarray]:
        return {i: self.env[i] for i in self.g.inputs}


def assert_same(before: Graph, after: Graph, inputs: dict[str, np.ndarray], rtol: float = 1e-4) -> None:
    """The two graphs compute the same outputs (reference interpreter), relative error <= rtol."""
    a, b = run_graph(before, inputs), run_graph(after, inputs)
    for name in before.outputs:
        scale = max(float(np.abs(a[name]).max()), 1e-6)
        err = float(np.abs(a[name].astype(np.float64) - b[name]).max()) / scale
        assert err <= rtol, f"output {name}: relative error {err}"


def assert_same_ort(before: Graph, after: Graph, inputs: dict[str, np.ndarray], rtol: float = 1e-4) -> None:
    """Both graphs exported to ONNX and run in ONNX Runtime agree, relative error <= rtol."""
    from saturate.frontend.onnx_io import export_model

    outs = []
    for g in (before, after):
        model = export_model(g)
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        outs.append(dict(zip([o.name for o in sess.get_outputs()], sess.run(None, inputs))))
    for name in before.outputs:
        x, y = outs[0][name], outs[1][name]
        scale = max(float(np.abs(x).max()), 1e-6)
        assert float(np.abs(x.astype(np.float64) - y).max()) / scale <= rtol, name


def ops(g: Graph) -> list[str]:
    """The graph's ops in node order."""
    return [n.op for n in g.nodes]
