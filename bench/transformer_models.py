"""BERT-, GPT-2- and Llama-style transformer models at any sequence length, built without torch for the benches.

The corpus's token models (frontend/corpus) are two-layer toys with 64-wide states and 64 positions:
too small to say anything about kernels at sequence lengths 128 and 512. These builders write the same
structure as the exporters do, op for op, at a MiniLM-like width (384 wide, 6 heads of 64, 2 layers), with
seeded weights drawn N(0, 1/fan_in) as the corpus refills them:

  bert   post-norm blocks: token + position embeddings, LayerNormalization, attention as batched MatMul +
         Softmax, erf GELU feed-forward
  gpt2   pre-norm blocks: one fused QKV projection split three ways, causal mask (Where), tanh GELU
  llama  RMSNorm (Pow, ReduceMean, Sqrt, Div), rotary position embedding (Slice, Neg, Concat), grouped-query
         attention (3 key/value heads for 6 query heads), causal mask (Add), SiLU-gated feed-forward

`graph("bert-512")` is the model at sequence length 512 as a saturate Graph; the input is `input_ids`
int64 [1, S].
"""

from __future__ import annotations

import math
import re

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

KINDS = ("bert", "gpt2", "llama")
WIDTH, HEADS, FFN, LAYERS, VOCAB = 384, 6, 1536, 2, 1000


class _Builder:
    """Nodes and initializers of one model, names made unique by a counter."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def name(self, base: str) -> str:
        self.count += 1
        return f"{base}_{self.count}"

    def const(self, base: str, arr: np.ndarray) -> str:
        name = self.name(base)
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), name))
        return name

    def weight(self, rows: int, cols: int) -> str:
        return self.const("w", (self.rng.standard_normal((rows, cols)) / math.sqrt(rows)).astype(np.float32))

    def small(self, *shape: int, scale: float = 0.02, mean: float = 0.0) -> str:
        return self.const("b", (mean + scale * self.rng.standard_normal(shape)).astype(np.float32))

    def op(self, op: str, *inputs: str, outputs: int = 1, **attrs) -> str | list[str]:
        outs = [self.name(op.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op, list(inputs), outs, **attrs))
        return outs[0] if outputs == 1 else outs

    def scalar(self, value: float) -> str:
        return self.const("c", np.array(value, np.float32))

    def ints(self, *values: int) -> str:
        return self.const("i", np.array(values, np.int64))

    def linear(self, x: str, cin: int, cout: int, bias: bool = True) -> str:
        y = self.op("MatMul", x, self.weight(cin, cout))
        return self.op("Add", y, self.small(cout)) if bias else y

    def layer_norm(self, x: str) -> str:
        return self.op("LayerNormalization", x, self.small(WIDTH, scale=0.1, mean=1.0), self.small(WIDTH),
                       axis=-1, epsilon=1e-5)

    def rms_norm(self, x: str) -> str:
        var = self.op("ReduceMean", self.op("Pow", x, self.scalar(2.0)), axes=[-1], keepdims=1)
        x = self.op("Div", x, self.op("Sqrt", self.op("Add", var, self.scalar(1e-6))))
        return self.op("Mul", x, self.small(WIDTH, scale=0.1, mean=1.0))

    def heads(self, x: str, seq: int, heads: int) -> str:
        """[1, S, heads * 64] -> [1, heads, S, 64]."""
        x = self.op("Reshape", x, self.ints(1, seq, heads, WIDTH // HEADS))
        return self.op("Transpose", x, perm=[0, 2, 1, 3])

    def merge(self, x: str, seq: int) -> str:
        return self.op("Reshape", self.op("Transpose", x, perm=[0, 2, 1, 3]), self.ints(1, seq, WIDTH))

    def attention(self, q: str, k: str, v: str, mask: str | None, where: bool = False) -> str:
        """softmax(q k^T / sqrt(64) + mask) v on [1, H, S, 64] heads."""
        s = self.op("MatMul", q, self.op("Transpose", k, perm=[0, 1, 3, 2]))
        s = self.op("Div", s, self.scalar(math.sqrt(WIDTH // HEADS)))
        if mask is not None:
            s = self.op("Where", mask, s, self.scalar(-3.4e38)) if where else self.op("Add", s, mask)
        return self.op("MatMul", self.op("Softmax", s, axis=-1), v)

    def embed(self, ids: str, seq: int, positions: bool) -> str:
        x = self.op("Gather", self.small(VOCAB, WIDTH, scale=1.0), ids, axis=0)
        return self.op("Add", x, self.small(1, seq, WIDTH, scale=1.0)) if positions else x


def _gelu_erf(b: _Builder, x: str) -> str:
    erf = b.op("Erf", b.op("Div", x, b.scalar(math.sqrt(2.0))))
    return b.op("Mul", b.op("Mul", x, b.op("Add", erf, b.scalar(1.0))), b.scalar(0.5))


def _gelu_tanh(b: _Builder, x: str) -> str:
    cube = b.op("Mul", b.op("Pow", x, b.scalar(3.0)), b.scalar(0.044715))
    t = b.op("Tanh", b.op("Mul", b.op("Add", x, cube), b.scalar(math.sqrt(2.0 / math.pi))))
    return b.op("Mul", b.op("Mul", x, b.scalar(0.5)), b.op("Add", t, b.scalar(1.0)))


def _bert(b: _Builder, seq: int) -> str:
    x = b.layer_norm(b.embed("input_ids", seq, positions=True))
    for _ in range(LAYERS):
        q, k, v = (b.heads(b.linear(x, WIDTH, WIDTH), seq, HEADS) for _ in range(3))
        a = b.linear(b.merge(b.attention(q, k, v, None), seq), WIDTH, WIDTH)
        x = b.layer_norm(b.op("Add", a, x))
        f = b.linear(_gelu_erf(b, b.linear(x, WIDTH, FFN)), FFN, WIDTH)
        x = b.layer_norm(b.op("Add", f, x))
    return x


def _gpt2(b: _Builder, seq: int) -> str:
    x = b.embed("input_ids", seq, positions=True)
    causal = b.const("causal", np.tril(np.ones((seq, seq), bool)))
    for _ in range(LAYERS):
        qkv = b.linear(b.layer_norm(x), WIDTH, 3 * WIDTH)
        q, k, v = b.op("Split", qkv, b.ints(WIDTH, WIDTH, WIDTH), axis=2, outputs=3)
        a = b.attention(b.heads(q, seq, HEADS), b.heads(k, seq, HEADS), b.heads(v, seq, HEADS), causal, where=True)
        x = b.op("Add", x, b.linear(b.merge(a, seq), WIDTH, WIDTH))
        f = b.linear(_gelu_tanh(b, b.linear(b.layer_norm(x), WIDTH, FFN)), FFN, WIDTH)
        x = b.op("Add", x, f)
    return b.layer_norm(x)


def _rotate(b: _Builder, x: str, cos: str, sin: str) -> str:
    """x * cos + rotate_half(x) * sin, rotate_half(x) = concat(-x[..., 32:], x[..., :32])."""
    half = WIDTH // HEADS // 2
    lo = b.op("Slice", x, b.ints(0), b.ints(half), b.ints(-1))
    hi = b.op("Slice", x, b.ints(half), b.ints(2 * half), b.ints(-1))
    turned = b.op("Concat", b.op("Neg", hi), lo, axis=-1)
    return b.op("Add", b.op("Mul", x, cos), b.op("Mul", turned, sin))


def _llama(b: _Builder, seq: int) -> str:
    dh, kv = WIDTH // HEADS, HEADS // 2
    inv = 1.0 / 10000 ** (np.arange(0, dh, 2) / dh)
    angles = np.outer(np.arange(seq), inv)
    angles = np.concatenate([angles, angles], axis=-1)
    cos = b.const("cos", np.cos(angles).astype(np.float32)[None, None])
    sin = b.const("sin", np.sin(angles).astype(np.float32)[None, None])
    mask = b.const("mask", np.triu(np.full((seq, seq), -3.4e38, np.float32), 1)[None, None])
    x = b.embed("input_ids", seq, positions=False)
    for _ in range(LAYERS):
        h = b.rms_norm(x)
        q = _rotate(b, b.heads(b.linear(h, WIDTH, WIDTH, bias=False), seq, HEADS), cos, sin)
        k = _rotate(b, b.heads(b.linear(h, WIDTH, kv * dh, bias=False), seq, kv), cos, sin)
        v = b.heads(b.linear(h, WIDTH, kv * dh, bias=False), seq, kv)
        # grouped-query attention: each key/value head serves HEADS // kv query heads
        k, v = (b.op("Reshape", b.op("Expand", b.op("Unsqueeze", t, b.ints(2)), b.ints(1, kv, HEADS // kv, seq, dh)),
                     b.ints(1, HEADS, seq, dh)) for t in (k, v))
        x = b.op("Add", x, b.linear(b.merge(b.attention(q, k, v, mask), seq), WIDTH, WIDTH, bias=False))
        h = b.rms_norm(x)
        gate = b.linear(h, WIDTH, FFN * 2 // 3, bias=False)
        up = b.linear(h, WIDTH, FFN * 2 // 3, bias=False)
        act = b.op("Mul", b.op("Mul", gate, b.op("Sigmoid", gate)), up)
        x = b.op("Add", x, b.linear(act, FFN * 2 // 3, WIDTH, bias=False))
    return b.rms_norm(x)


def model(spec: str) -> onnx.ModelProto:
    """`KIND-SEQ` (bert-128, gpt2-512, llama-128...) as an ONNX model, opset 17."""
    from saturate.core.errors import SaturateError

    m = re.fullmatch(r"(\w+)-(\d+)", spec)
    if not m or m.group(1) not in KINDS or int(m.group(2)) < 1:
        raise SaturateError(f"{spec}: expected KIND-SEQ with KIND one of {', '.join(KINDS)}, e.g. bert-128")
    kind, seq = m.group(1), int(m.group(2))
    b = _Builder(seed=KINDS.index(kind))
    out = {"bert": _bert, "gpt2": _gpt2, "llama": _llama}[kind](b, seq)
    b.nodes.append(helper.make_node("Identity", [out], ["hidden"]))
    graph = helper.make_graph(b.nodes, f"{kind}-{seq}",
                              [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, seq])],
                              [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, [1, seq, WIDTH])],
                              b.inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(proto)
    return proto


def graph(spec: str):
    """`model(spec)` imported as a saturate Graph."""
    from saturate.frontend.onnx_io import import_model

    return import_model(model(spec))


def is_spec(name: str) -> bool:
    """Whether a bench model name is one of these builders' (KIND-SEQ) rather than a corpus entry."""
    return re.fullmatch(rf"({'|'.join(KINDS)})-\d+", name) is not None
