"""Frontend stage: built-in example models (VGG, ResNet, MobileNet, MLP, conv chains) built as ONNX."""

from __future__ import annotations

import functools
import re

import numpy as np
import onnx
from numpy.lib.stride_tricks import sliding_window_view
from onnx import TensorProto, helper, numpy_helper

from saturate.core.errors import SaturateError
from saturate.core.ir import Graph

EXAMPLES = ["vgg", "vgg11bn", "resnet18", "resnet50", "mobilenet", "mlp", "chain-N"]
OPSET = 17


_SHORT = {"BatchNormalization": "bn", "GlobalAveragePool": "gap", "MaxPool": "pool"}


class _Builder:
    """Emits ONNX nodes and, alongside, computes each value on one random input.

    The forward values calibrate batch-norm statistics: running mean and variance are set near
    the true statistics of the conv output (then perturbed), as in a trained network, so that
    deep random models neither overflow nor vanish.
    """

    def __init__(self, name: str, shape: tuple[int, ...], seed: int, calibrate: bool = True):
        self.name, self.rng = name, np.random.default_rng(seed)
        self.calibrate = calibrate
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[TensorProto] = []
        self.vals: dict[str, np.ndarray] = {"x": self.rng.standard_normal(shape).astype(np.float32)}
        self.input_shape = shape
        self.count = 0

    def _fresh(self, base: str) -> str:
        self.count += 1
        return f"{base}{self.count}"

    def const(self, base: str, arr: np.ndarray) -> str:
        name = self._fresh(base)
        arr = np.asarray(arr)
        self.inits.append(numpy_helper.from_array(arr, name))
        self.vals[name] = arr
        return name

    def node(self, op: str, inputs: list[str], value: np.ndarray, **attrs) -> str:
        out = self._fresh(_SHORT.get(op, op.lower()))
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        self.vals[out] = value.astype(np.float32)
        return out

    # ---- layers --------------------------------------------------------------------------
    def conv(self, x: str, cout: int, k: int, stride: int = 1, group: int = 1, bias: bool = False,
             gain: float = 1.0) -> str:
        cin = self.vals[x].shape[1]
        fan_in = cin // group * k * k
        w = (self.rng.standard_normal((cout, cin // group, k, k)) * gain * np.sqrt(2.0 / fan_in)).astype(np.float32)
        inputs = [x, self.const("w", w)]
        b = None
        if bias:
            b = (self.rng.standard_normal(cout) * 0.1).astype(np.float32)
            inputs.append(self.const("b", b))
        p = k // 2
        y = _np_conv(self.vals[x], w, b, stride, p, group)
        return self.node("Conv", inputs, y, kernel_shape=[k, k], pads=[p, p, p, p],
                         strides=[stride, stride], group=group)

    def bn(self, x: str) -> str:
        y = self.vals[x]
        c = y.shape[1]
        axes = (0, 2, 3)
        gamma = self.rng.uniform(0.5, 1.5, c)
        if self.calibrate:
            beta = self.rng.normal(0.0, 0.2, c)
            mean = y.mean(axis=axes) + 0.1 * y.std(axis=axes) * self.rng.standard_normal(c)
            var = (y.var(axis=axes) + 1e-3) * self.rng.uniform(0.7, 1.4, c)
        else:
            beta = self.rng.uniform(0.0, 0.5, c)
            mean = self.rng.normal(0.0, 0.2, c)
            var = self.rng.uniform(0.5, 1.5, c)
        eps = 1e-5
        params = [self.const(n, v.astype(np.float32)) for n, v in
                  (("gamma", gamma), ("beta", beta), ("mean", mean), ("var", var))]
        shape = (1, c, 1, 1)
        out = (y - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps) * gamma.reshape(shape) + beta.reshape(shape)
        return self.node("BatchNormalization", [x] + params, out, epsilon=eps)

    def relu(self, x: str) -> str:
        return self.node("Relu", [x], np.maximum(self.vals[x], 0))

    def clip6(self, x: str) -> str:
        lo = self.const("lo", np.array(0.0, np.float32))
        hi = self.const("hi", np.array(6.0, np.float32))
        return self.node("Clip", [x, lo, hi], np.clip(self.vals[x], 0, 6))

    def add(self, a: str, b: str) -> str:
        return self.node("Add", [a, b], self.vals[a] + self.vals[b])

    def maxpool(self, x: str, k: int, stride: int, pad: int = 0) -> str:
        v = np.pad(self.vals[x], ((0, 0), (0, 0), (pad, pad), (pad, pad)), constant_values=-np.inf)
        y = sliding_window_view(v, (k, k), axis=(2, 3))[:, :, ::stride, ::stride].max(axis=(4, 5))
        return self.node("MaxPool", [x], y, kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4)

    def head(self, x: str, classes: int) -> str:
        """GlobalAveragePool, Flatten, Gemm: the classifier every CNN example ends with."""
        g = self.node("GlobalAveragePool", [x], self.vals[x].mean(axis=(2, 3), keepdims=True))
        f = self.node("Flatten", [g], self.vals[g].reshape(self.vals[g].shape[0], -1), axis=1)
        return self.gemm(f, classes)

    def gemm(self, x: str, n: int) -> str:
        k = self.vals[x].shape[1]
        w = (self.rng.standard_normal((n, k)) * np.sqrt(1.0 / k)).astype(np.float32)
        b = (self.rng.standard_normal(n) * 0.1).astype(np.float32)
        y = self.vals[x] @ w.T + b
        return self.node("Gemm", [x, self.const("fc_w", w), self.const("fc_b", b)], y, transB=1)

    def dense(self, x: str, n: int, relu: bool) -> str:
        k = self.vals[x].shape[1]
        w = (self.rng.standard_normal((k, n)) * np.sqrt(2.0 / k)).astype(np.float32)
        b = (self.rng.standard_normal(n) * 0.1).astype(np.float32)
        m = self.node("MatMul", [x, self.const("w", w)], self.vals[x] @ w)
        y = self.node("Add", [m, self.const("b", b)], self.vals[m] + b)
        return self.relu(y) if relu else y

    def model(self, out: str) -> onnx.ModelProto:
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(self.input_shape))
        y = helper.make_tensor_value_info(out, TensorProto.FLOAT, list(self.vals[out].shape))
        graph = helper.make_graph(self.nodes, self.name, [x], [y], initializer=self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="saturate")
        model.ir_version = 8
        return onnx.shape_inference.infer_shapes(model)


def _np_conv(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, stride: int, pad: int, group: int) -> np.ndarray:
    n, c = x.shape[:2]
    m, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    win = sliding_window_view(xp, (kh, kw), axis=(2, 3))[:, :, ::stride, ::stride]
    ho, wo = win.shape[2:4]
    win = win.reshape(n, group, cg, ho, wo, kh, kw)
    wg = w.reshape(group, m // group, cg, kh, kw)
    y = np.einsum("ngchwij,gmcij->ngmhw", win, wg, optimize=True).reshape(n, m, ho, wo)
    return y if b is None else y + b.reshape(1, m, 1, 1)


# ---- the models ---------------------------------------------------------------------------------
def _vgg(cfg: list, shape: tuple[int, ...], classes: int, name: str) -> onnx.ModelProto:
    b = _Builder(name, shape, seed=1)
    h = "x"
    for v in cfg:
        h = b.maxpool(h, 2, 2) if v == "M" else b.relu(b.bn(b.conv(h, v, 3, bias=True)))
    return b.model(b.head(h, classes))


def _resnet(blocks: list[int], bottleneck: bool, name: str) -> onnx.ModelProto:
    b = _Builder(name, (1, 3, 224, 224), seed=2)
    h = b.maxpool(b.relu(b.bn(b.conv("x", 64, 7, stride=2))), 3, 2, 1)
    expansion = 4 if bottleneck else 1
    for stage, count in enumerate(blocks):
        width = 64 * 2 ** stage
        for i in range(count):
            stride = 2 if stage > 0 and i == 0 else 1
            cin = b.vals[h].shape[1]
            if bottleneck:
                y = b.relu(b.bn(b.conv(h, width, 1)))
                y = b.relu(b.bn(b.conv(y, width, 3, stride=stride)))
                y = b.bn(b.conv(y, width * expansion, 1))
            else:
                y = b.relu(b.bn(b.conv(h, width, 3, stride=stride)))
                y = b.bn(b.conv(y, width, 3))
            short = h
            if stride != 1 or cin != width * expansion:
                short = b.bn(b.conv(h, width * expansion, 1, stride=stride))
            h = b.relu(b.add(y, short))
    return b.model(b.head(h, 1000))


def _mobilenet() -> onnx.ModelProto:
    b = _Builder("mobilenet", (1, 3, 32, 32), seed=3)
    h = b.clip6(b.bn(b.conv("x", 16, 3, stride=2)))
    for cout, stride in ((32, 1), (64, 2), (64, 1)):
        c = b.vals[h].shape[1]
        h = b.clip6(b.bn(b.conv(h, c, 3, stride=stride, group=c)))
        h = b.clip6(b.bn(b.conv(h, cout, 1)))
    return b.model(b.head(h, 10))


def _mlp() -> onnx.ModelProto:
    b = _Builder("mlp", (2, 64), seed=4)
    h = b.dense("x", 128, relu=True)
    h = b.dense(h, 64, relu=True)
    return b.model(b.dense(h, 10, relu=False))


def _chain(n: int) -> onnx.ModelProto:
    # Calibrated statistics fit one input only and deviations grow over 1000s of blocks; instead
    # small conv weights and fixed statistics make each block a contraction, finite for any input.
    b = _Builder(f"chain_{n}", (1, 8, 16, 16), seed=5, calibrate=False)
    h = "x"
    for _ in range(n):
        h = b.relu(b.bn(b.conv(h, 8, 3, gain=0.8)))
    return b.model(h)


_VGG11 = [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"]
_BUILDERS = {
    "vgg": lambda: _vgg([16, 16, "M", 32, 32, "M", 64, "M"], (1, 3, 32, 32), 10, "vgg"),
    "vgg11bn": lambda: _vgg(_VGG11, (1, 3, 224, 224), 1000, "vgg11bn"),
    "resnet18": lambda: _resnet([2, 2, 2, 2], False, "resnet18"),
    "resnet50": lambda: _resnet([3, 4, 6, 3], True, "resnet50"),
    "mobilenet": _mobilenet,
    "mlp": _mlp,
}


@functools.lru_cache(maxsize=8)
def build_model(name: str) -> onnx.ModelProto:
    """The example as an ONNX model (cached; do not mutate the result)."""
    chain = re.fullmatch(r"chain-(\d+)", name)
    if chain and int(chain.group(1)) >= 1:
        return _chain(int(chain.group(1)))
    if name not in _BUILDERS:
        raise SaturateError(f"unknown example '{name}'; known examples: {', '.join(EXAMPLES)} (e.g. chain-100)")
    return _BUILDERS[name]()


def build(name: str) -> Graph:
    """The example model `name` as a Graph (fresh copy on every call)."""
    from saturate.frontend.onnx_io import import_model

    return import_model(build_model(name))


def random_inputs(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Standard-normal arrays for every graph input without a default (symbolic dims taken as 1)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for name in graph.inputs:
        if name in graph.constants:
            continue
        info = graph.info(name)
        shape = tuple(d if isinstance(d, int) else 1 for d in (info.shape or ()))
        feeds[name] = rng.standard_normal(shape).astype(info.dtype)
    return feeds
