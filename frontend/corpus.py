"""Corpus stage (rebuild): real exported models, stored as skeletons, refilled with seeded weights without torch.

frontend/corpus/NAME.onnx holds a torchvision/timm/torch model as one of torch's two ONNX
exporters wrote it (see frontend/corpus/README.md for the list, and export_corpus.py, which
made them): the whole graph, every small initializer verbatim, and of each large float
initializer only its name, dims and dtype. `load_model(NAME)` refills those from a generator
seeded by the entry and initializer names, with a distribution chosen by the op that consumes
the tensor, so a deep network stays numerically sane:

  Conv / Gemm / MatMul weight          N(0, 1 / fan_in)   (fan-in scaling: activations neither explode nor vanish)
  BatchNormalization scale, bias       U(0.5, 1.5), N(0, 0.1)
  BatchNormalization mean, variance    N(0, 0.2), U(0.5, 2.0)   (non-trivial, variance positive)
  Layer/Group/InstanceNormalization    scale U(0.8, 1.2), bias N(0, 0.05)
  anything else (biases, embeddings)   N(0, 0.02)
  DequantizeLinear int8/uint8 input    zero point + N(0, (qmax - qmin) / 8), rounded, clipped to the type's range
  DequantizeLinear int32 input (bias)  zero point + N(0, 0.05) / scale, rounded (the bias it stands for is N(0, 0.05))

Quantized (QDQ) models keep every QuantizeLinear/DequantizeLinear scale and zero point as
calibration wrote them (export_corpus.py stores them whatever their size), so the integer
weights refilled around them make a valid quantized model: the zero point and scale a payload
is read with are those of the DequantizeLinear that reads it, per tensor or per channel (axis).
A tensor the exporter made of one repeated value (`corpus:const=V`) is refilled with V.
`saturate.frontend.load_graph("corpus:NAME")` imports one, so `saturate optimize corpus:NAME`.
"""

from __future__ import annotations

import math
import zlib
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from saturate.core.errors import SaturateError

CORPUS_DIR = Path(__file__).resolve().parent / "corpus"
_TAG = "corpus:"

# Ops that hand a weight on unchanged in meaning: the consumer that decides its role is
# further down. Transposes are tracked, since they swap which dim is the fan-in.
_PASS_THROUGH = {"Identity", "Cast", "CastLike", "Transpose", "Reshape", "Flatten", "Unsqueeze",
                 "Squeeze", "Expand", "QuantizeLinear", "DequantizeLinear"}
_NORMS = {"LayerNormalization", "GroupNormalization", "InstanceNormalization",
          "SimplifiedLayerNormalization"}


def names() -> list[str]:
    """The corpus entries, e.g. `resnet18-ts`, `resnet18-dynamo`, `deit_tiny-ts-dyn`."""
    return sorted(p.stem for p in CORPUS_DIR.glob("*.onnx"))


def _path(name: str) -> Path:
    path = CORPUS_DIR / f"{name}.onnx"
    if not path.is_file():
        raise SaturateError(f"corpus:{name}: no such corpus model (known: {', '.join(names())})")
    return path


def skeleton(name: str) -> onnx.ModelProto:
    """The stored model: graph, small initializers, large float ones as name/dims/dtype only."""
    return onnx.load(_path(name))


def info(name: str) -> dict[str, str]:
    """What the export recorded: model, source, exporter, opset, input shape, versions."""
    return {p.key.removeprefix("corpus."): p.value for p in skeleton(name).metadata_props}


def load_model(name: str) -> onnx.ModelProto:
    """The corpus model `name` with every dropped initializer refilled, deterministically."""
    model = skeleton(name)
    g = model.graph
    consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in g.node:
        for k, value in enumerate(node.input):
            consumers.setdefault(value, []).append((node, k))
    stored = {t.name: t for t in g.initializer if not t.doc_string.startswith(_TAG)}
    for init in g.initializer:
        if not init.doc_string.startswith(_TAG):
            continue
        dims = tuple(init.dims)
        dtype = helper.tensor_dtype_to_np_dtype(init.data_type)
        recipe = init.doc_string[len(_TAG):]
        if recipe.startswith("const="):
            arr = np.full(dims, float(recipe[len("const="):]), dtype=dtype)
        elif recipe == "random":
            rng = np.random.default_rng(zlib.crc32(f"{name}/{init.name}".encode()))
            role = _role(init.name, dims, consumers)
            if role[0] == "dequant":
                arr = _fill_quantized(rng, dims, dtype, role[1], stored)
            else:
                arr = _fill(rng, dims, role).astype(dtype, copy=False)
        else:
            raise SaturateError(f"corpus:{name}: initializer {init.name}: unknown recipe {recipe!r}")
        # Straight into raw_data (ONNX stores it little-endian): VGG's 130 M weights are
        # copied once, not three times as through numpy_helper.from_array.
        init.raw_data = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
    return model


def inputs(name: str, seed: int = 0) -> dict[str, np.ndarray]:
    """A deterministic input for each graph input; a symbolic (batch) dim is 2, to exercise it."""
    model = skeleton(name)
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    stored = {t.name for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in stored:
            continue
        tt = vi.type.tensor_type
        shape = tuple(d.dim_value if d.HasField("dim_value") else 2 for d in tt.shape.dim)
        dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if np.issubdtype(dtype, np.floating):
            feeds[vi.name] = rng.standard_normal(shape).astype(dtype)
        else:
            feeds[vi.name] = rng.integers(0, 100, shape).astype(dtype)
    return feeds


def output_steps(name: str) -> dict[str, float]:
    """The quantization step (largest scale) of each graph output a DequantizeLinear writes.

    A quantized model's outputs move in these steps: two correct runs that round one value
    either side of a .5 differ by one step there, which is how close QDQ outputs are compared.
    """
    g = skeleton(name).graph
    stored = {t.name: t for t in g.initializer if not t.doc_string.startswith(_TAG)}
    outputs = {o.name for o in g.output}
    return {node.output[0]: float(np.max(np.abs(onnx.numpy_helper.to_array(stored[node.input[1]]))))
            for node in g.node
            if node.op_type == "DequantizeLinear" and node.output[0] in outputs and node.input[1] in stored}


# ---- roles and fills ----------------------------------------------------------------------------
def _role(value: str, dims: tuple[int, ...], consumers) -> tuple:
    """(kind, parameter) for an initializer, from the first consumer that gives it a role."""
    seen = set()
    frontier = [(value, False, False)]  # (value, transposed on the way, reshaped on the way)
    while frontier:
        v, transposed, reshaped = frontier.pop(0)
        if v in seen:
            continue
        seen.add(v)
        for node, k in consumers.get(v, ()):
            role = _consumer_role(node, k, dims, transposed, reshaped)
            # A float weight quantized in the graph (QuantizeLinear, DequantizeLinear, Conv) takes
            # the role of the op behind them; only a stored integer payload is the dequantizer's.
            if role is not None and (role[0] != "dequant" or v == value):
                return role
            if node.op_type in _PASS_THROUGH and k == 0:
                swap = transposed ^ (node.op_type == "Transpose" and _swaps_last_two(node, len(dims)))
                frontier.append((node.output[0], swap,
                                 reshaped or node.op_type not in ("Identity", "Cast", "CastLike", "Transpose")))
    return ("other",)


def _swaps_last_two(node: onnx.NodeProto, rank: int) -> bool:
    perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
    if perm is None:  # default: reverse every dim
        return rank >= 2
    return len(perm) >= 2 and perm[-1] == len(perm) - 2 and perm[-2] == len(perm) - 1


def _attr(node: onnx.NodeProto, key: str, default: int = 0) -> int:
    return next((a.i for a in node.attribute if a.name == key), default)


def _consumer_role(node, k, dims, transposed, reshaped):
    op = node.op_type
    if op == "DequantizeLinear" and k == 0:
        return ("dequant", node)
    if op == "BatchNormalization" and 1 <= k <= 4:
        return (("bn_scale", "bn_bias", "bn_mean", "bn_var")[k - 1],)
    if op in _NORMS and k in (1, 2):
        return ("norm_scale" if k == 1 else "norm_bias",)
    if len(dims) < 2:
        return None
    if op == "Conv" and k == 1:
        return ("weight", math.prod(dims[1:]))
    if op == "ConvTranspose" and k == 1:
        return ("weight", dims[0] * math.prod(dims[2:]) // max(1, _attr(node, "group", 1)))
    if reshaped:
        # Dims of the stored tensor no longer say which one is contracted: take all but the
        # leading one, the layout of every weight an exporter reshapes (convs, stacked heads).
        return ("weight", math.prod(dims[1:])) if op in ("Gemm", "MatMul") and k < 2 else None
    if op == "Gemm" and k in (0, 1):
        trans = bool(_attr(node, "transA" if k == 0 else "transB")) ^ transposed
        # A contracts over its last dim (first if transposed), B over its first (last if transposed).
        return ("weight", dims[0] if trans == (k == 0) else dims[1])
    if op == "MatMul" and k in (0, 1):
        contracted = dims[-1] if (k == 0) ^ transposed else dims[-2]
        return ("weight", contracted)
    return None


# Floats drawn per call: one call is one C loop that Python's signal handlers wait for (VGG's 130 M weights
# took 2.7 s, and a batch's SIGINT or SIGTERM waited as long). Drawn in pieces, the values are the same.
_DRAW = 1 << 20


def _standard_normal(rng: np.random.Generator, dims: tuple[int, ...]) -> np.ndarray:
    out = np.empty(dims, np.float32)
    flat = out.reshape(-1)
    for i in range(0, flat.size, _DRAW):
        rng.standard_normal(out=flat[i:i + _DRAW], dtype=np.float32)
    return out


def _fill(rng: np.random.Generator, dims: tuple[int, ...], role: tuple) -> np.ndarray:
    kind = role[0]
    if kind == "weight":
        # Variance 1/fan_in, not He's 2/fan_in: with batch-norm scales up to 1.5 over variances
        # down to 0.5, He's gain compounds through residual sums (ResNet-50's logits reach 5e3,
        # GhostNet's 3e5); at 1/fan_in every corpus model's output std lies in [0.02, 2.5].
        w = _standard_normal(rng, dims)
        w *= np.float32(math.sqrt(1.0 / max(1, role[1])))
        return w
    if kind == "bn_scale":
        return rng.uniform(0.5, 1.5, dims)
    if kind == "bn_bias":
        return rng.normal(0.0, 0.1, dims)
    if kind == "bn_mean":
        return rng.normal(0.0, 0.2, dims)
    if kind == "bn_var":
        return rng.uniform(0.5, 2.0, dims)
    if kind == "norm_scale":
        return rng.uniform(0.8, 1.2, dims)
    if kind == "norm_bias":
        return rng.normal(0.0, 0.05, dims)
    return rng.standard_normal(dims, dtype=np.float32) * np.float32(0.02)


def _fill_quantized(rng: np.random.Generator, dims: tuple[int, ...], dtype: np.dtype,
                    node: onnx.NodeProto, stored: dict[str, onnx.TensorProto]) -> np.ndarray:
    """The integer input of DequantizeLinear `node`, centred on the node's zero point and in range."""
    def param(k: int, default: float) -> np.ndarray:
        if len(node.input) > k and node.input[k] in stored:
            value = onnx.numpy_helper.to_array(stored[node.input[k]]).astype(np.float64)
            if value.ndim == 1 and len(dims) > 1:  # per channel: one value along `axis`
                shape = [1] * len(dims)
                shape[_attr(node, "axis", 1) % len(dims)] = value.size
                value = value.reshape(shape)
            return value
        return np.float64(default)

    zero = param(2, 0.0)
    info = np.iinfo(dtype)
    if info.bits >= 32:
        # A bias: its float value N(0, 0.05), in units of its scale (input scale x weight scale).
        spread = 0.05 / np.maximum(np.abs(param(1, 1.0)), np.finfo(np.float32).tiny)
    else:
        spread = np.float64((int(info.max) - int(info.min)) / 8)
    q = np.rint(zero + rng.standard_normal(dims) * spread)
    return np.clip(q, info.min, info.max).astype(dtype)


__all__ = ["CORPUS_DIR", "info", "inputs", "load_model", "names", "output_steps", "skeleton"]
