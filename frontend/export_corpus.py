"""Corpus stage (export): real torchvision/timm/HuggingFace models through both torch ONNX exporters, stored as weightless skeletons.

Run `python -m saturate.frontend.export_corpus [--only NAME ...]` with the `corpus` extra
installed (`pip install -e '.[corpus]'`). It rewrites frontend/corpus/NAME.onnx; nothing else
in the project imports torch: `saturate.frontend.corpus` rebuilds the weights without it.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import sys
import time
import warnings
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto

import torch

CORPUS_DIR = Path(__file__).resolve().parent / "corpus"
TS_OPSET, DYNAMO_OPSET = 17, 18
# Initializers of at most this many elements keep their values (shape vectors, Resize scales,
# narrow batch norms); larger float ones keep name, dims and dtype only (corpus.py refills them).
SMALL_ELEMENTS = 16
_FLOAT_TYPES = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16}


def _import_torchvision():
    """torchvision, importable beside the CPU wheel of torch.

    PyPI's torchvision wheel is built against the CUDA torch: its compiled ops (_C.so) cannot
    load beside torch 2.13.0+cpu, and its import then fails registering fake kernels for
    torchvision::nms and ::qnms ('operator torchvision::nms does not exist'). The models need
    none of those detection ops, so declaring the two schemas (no kernel) lets the import finish.
    """
    try:
        torch.ops.torchvision.nms
    except (AttributeError, RuntimeError):
        lib = torch.library.Library("torchvision", "DEF")
        lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _import_torchvision.keep = lib  # a Library deregisters its ops when collected
    import torchvision

    return torchvision


# ---- the models -------------------------------------------------------------------------------
@dataclass
class ModelSpec:
    build: Callable[[], torch.nn.Module]
    shape: tuple[int, ...]
    source: str  # "torchvision", "timm", "transformers" or "torch"
    # Token models (transformers) read int64 ids below `vocab` named input_ids; 0: a float input x.
    vocab: int = 0

    @property
    def input_name(self) -> str:
        return "input_ids" if self.vocab else "x"


def _tv(name: str, **kw) -> Callable[[], torch.nn.Module]:
    return lambda: getattr(_import_torchvision().models, name)(weights=None, **kw)


def _timm(name: str, **kw) -> Callable[[], torch.nn.Module]:
    def build():
        _import_torchvision()  # timm imports torchvision
        import timm

        return timm.create_model(name, pretrained=False, **kw)
    return build


class _Encoder(torch.nn.Module):
    """Two BERT-base-sized encoder layers over a sequence of embeddings (batch first)."""

    def __init__(self):
        super().__init__()
        layer = torch.nn.TransformerEncoderLayer(d_model=768, nhead=12, dim_feedforward=3072,
                                                 dropout=0.0, activation="gelu", batch_first=True)
        # No nested-tensor fast path: it is an inference kernel with no ONNX form.
        self.encoder = torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)

    def forward(self, x):
        return self.encoder(x)


class _LastHidden(torch.nn.Module):
    """A HuggingFace base model called on token ids alone, returning its last hidden state."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids, return_dict=True).last_hidden_state


def _hf(kind: str) -> Callable[[], torch.nn.Module]:
    """A small HuggingFace model built from its config with random weights (nothing downloaded):
    two layers, hidden size 64, four heads, a vocabulary of 128 (the corpus feeds ids below 100)."""
    def build():
        _import_torchvision()  # transformers imports torchvision when it is installed
        import transformers as tf

        common = {"vocab_size": 128}
        if kind == "bert":
            cfg = tf.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                intermediate_size=128, max_position_embeddings=64, **common)
            model = tf.BertModel(cfg, add_pooling_layer=False)
        elif kind == "gpt2":
            model = tf.GPT2Model(tf.GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=64, **common))
        elif kind == "llama":
            # Grouped-query attention (2 key/value heads for 4 query heads), RMSNorm, rotary, SiLU gating.
            cfg = tf.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2,
                                 max_position_embeddings=64, **common)
            model = tf.LlamaModel(cfg)
        else:  # t5: relative-position buckets, RMS layer norm, ReLU feed-forward
            cfg = tf.T5Config(d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, **common)
            model = tf.T5EncoderModel(cfg)
        model.config.use_cache = False
        return _LastHidden(model)
    return build


# Spatial sizes: CNNs whose pooling is global run at 96 or 128 (test time); VGG's fixed 7x7
# adaptive pool needs 224; transformers are configured through timm's img_size/window_size.
MODELS: dict[str, ModelSpec] = {
    "resnet18": ModelSpec(_tv("resnet18"), (1, 3, 96, 96), "torchvision"),
    "resnet50": ModelSpec(_tv("resnet50"), (1, 3, 96, 96), "torchvision"),
    "mobilenet_v2": ModelSpec(_tv("mobilenet_v2"), (1, 3, 96, 96), "torchvision"),
    "mobilenet_v3_small": ModelSpec(_tv("mobilenet_v3_small"), (1, 3, 96, 96), "torchvision"),
    "efficientnet_b0": ModelSpec(_tv("efficientnet_b0"), (1, 3, 96, 96), "torchvision"),
    "densenet121": ModelSpec(_tv("densenet121"), (1, 3, 96, 96), "torchvision"),
    "squeezenet1_1": ModelSpec(_tv("squeezenet1_1"), (1, 3, 96, 96), "torchvision"),
    "shufflenet_v2_x1_0": ModelSpec(_tv("shufflenet_v2_x1_0"), (1, 3, 96, 96), "torchvision"),
    "regnet_x_400mf": ModelSpec(_tv("regnet_x_400mf"), (1, 3, 96, 96), "torchvision"),
    "googlenet": ModelSpec(_tv("googlenet", aux_logits=False, init_weights=True), (1, 3, 96, 96),
                           "torchvision"),
    "convnext_tiny": ModelSpec(_tv("convnext_tiny"), (1, 3, 96, 96), "torchvision"),
    "vgg11_bn": ModelSpec(_tv("vgg11_bn"), (1, 3, 224, 224), "torchvision"),
    "deit_tiny": ModelSpec(_timm("deit_tiny_patch16_224", img_size=96), (1, 3, 96, 96), "timm"),
    "swin_tiny": ModelSpec(_timm("swin_tiny_patch4_window7_224", img_size=128, window_size=4),
                           (1, 3, 128, 128), "timm"),
    "encoder": ModelSpec(_Encoder, (1, 16, 768), "torch"),
    "resnet26d": ModelSpec(_timm("resnet26d"), (1, 3, 96, 96), "timm"),
    "mixnet_s": ModelSpec(_timm("mixnet_s"), (1, 3, 96, 96), "timm"),
    "efficientnet_lite0": ModelSpec(_timm("efficientnet_lite0"), (1, 3, 96, 96), "timm"),
    # Training form: three branches (3x3 conv-bn, 1x1 conv-bn, identity bn) per block, not reparameterized.
    "repvgg_a0": ModelSpec(_timm("repvgg_a0"), (1, 3, 96, 96), "timm"),
    "ghostnet_100": ModelSpec(_timm("ghostnet_100"), (1, 3, 96, 96), "timm"),
    # Relative-position tables computed in the graph (log-spaced coordinates through an MLP),
    # cosine attention; a quarter of swinv2_cr_tiny's width and two blocks per stage.
    "swinv2_cr": ModelSpec(_timm("swinv2_cr_tiny_ns_224", img_size=(64, 64), window_size=4, embed_dim=48,
                                 depths=(2, 2, 2, 2), num_heads=(2, 4, 8, 16)), (1, 3, 64, 64), "timm"),
    # Weight standardization: each conv's weight normalized in the graph (ReduceMean, Sub, Mul).
    "nf_resnet26": ModelSpec(_timm("nf_resnet26"), (1, 3, 64, 64), "timm"),
    # Sinusoidal positional encoding (CumSum, Sin, Cos, a conv on a constant), split depthwise convs.
    "edgenext": ModelSpec(_timm("edgenext_xx_small"), (1, 3, 64, 64), "timm"),
    "bert": ModelSpec(_hf("bert"), (1, 16), "transformers", vocab=128),
    "gpt2": ModelSpec(_hf("gpt2"), (1, 16), "transformers", vocab=128),
    "llama": ModelSpec(_hf("llama"), (1, 16), "transformers", vocab=128),
    "t5_encoder": ModelSpec(_hf("t5"), (1, 16), "transformers", vocab=128),
}


@dataclass
class Entry:
    name: str
    model: str
    # "ts", "dynamo", "dynamo-noopt"; "qdq" / "qdq-pc": the TorchScript export quantized to int8
    # by onnxruntime's quantize_static, per tensor / per channel.
    exporter: str
    dynamic: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def opset(self) -> int:
        return DYNAMO_OPSET if self.exporter.startswith("dynamo") else TS_OPSET


# The TorchScript exporter has no aten::diff, which transformers' causal masks call; the dynamo
# exporter fails decomposing T5's relative-position bucketing ("Failed to decompose the FX graph").
_NO_TORCHSCRIPT = {"gpt2", "llama"}
_NO_DYNAMO = {"t5_encoder"}


def _entries() -> list[Entry]:
    out = []
    for model in MODELS:
        if model not in _NO_TORCHSCRIPT:
            out.append(Entry(f"{model}-ts", model, "ts"))
        # VGG's 130 M-weight classifier costs most of a minute of test time per entry, and its
        # 36-node graph is the same from both exporters: one copy is enough.
        if model != "vgg11_bn" and model not in _NO_DYNAMO:
            out.append(Entry(f"{model}-dynamo", model, "dynamo"))
    for model in ("resnet18", "mobilenet_v2"):
        out.append(Entry(f"{model}-dynamo-noopt", model, "dynamo-noopt"))
    for model in ("resnet18", "encoder"):
        out.append(Entry(f"{model}-ts-dyn", model, "ts", dynamic=True))
        out.append(Entry(f"{model}-dynamo-dyn", model, "dynamo", dynamic=True))
    # A vision transformer with a symbolic batch: the TorchScript form computes every reshape
    # from Shape ops (861 nodes), the shape folding under test; the dynamo form barely differs
    # from its static twin.
    out.append(Entry("deit_tiny-ts-dyn", "deit_tiny", "ts", dynamic=True))
    # Token models with symbolic batch and sequence length: masks and positions from Shape ops.
    out.append(Entry("bert-ts-dyn", "bert", "ts", dynamic=True))
    out.append(Entry("llama-dynamo-dyn", "llama", "dynamo", dynamic=True))
    # int8 QDQ models as onnxruntime.quantization makes them: a CNN with per-tensor weight
    # scales, one with per-channel scales, a transformer.
    out.append(Entry("mobilenet_v2-qdq", "mobilenet_v2", "qdq"))
    out.append(Entry("resnet18-qdq-pc", "resnet18", "qdq-pc"))
    out.append(Entry("bert-qdq", "bert", "qdq"))
    return out


ENTRIES = {e.name: e for e in _entries()}


# ---- export ---------------------------------------------------------------------------------
def _seed(*parts: str) -> int:
    return zlib.crc32("/".join(parts).encode())


@torch.no_grad()
def _randomize(model: torch.nn.Module, name: str) -> None:
    """Distinct, sane values for every parameter and buffer before export.

    Fresh modules hold equal tensors (every batch norm's ones and zeros): both exporters
    deduplicate equal initializers into one, behind Identity nodes in the TorchScript form,
    which is not the graph a trained model gives. Normalization statistics follow the same
    ranges as corpus.py's refill, since narrow ones are stored verbatim.
    """
    gen = torch.Generator().manual_seed(_seed(name))

    def uniform(t, lo, hi):
        t.copy_(torch.rand(t.shape, generator=gen) * (hi - lo) + lo)

    def normal(t, std):
        t.copy_(torch.randn(t.shape, generator=gen) * std)

    done = set()
    for mod in model.modules():
        if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm):
            uniform(mod.weight, 0.5, 1.5), normal(mod.bias, 0.1)
            normal(mod.running_mean, 0.2), uniform(mod.running_var, 0.5, 2.0)
            done.update(id(t) for t in (mod.weight, mod.bias, mod.running_mean, mod.running_var))
        elif isinstance(mod, (torch.nn.LayerNorm, torch.nn.GroupNorm)) and mod.weight is not None:
            uniform(mod.weight, 0.8, 1.2), normal(mod.bias, 0.05)
            done.update((id(mod.weight), id(mod.bias)))
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) not in done and t.is_floating_point():
            t.add_(torch.randn(t.shape, generator=gen) * 1e-3)


@contextlib.contextmanager
def _no_batchnorm_fusion():
    """The dynamo exporter's optimizer without onnxscript's Conv+BatchNormalization fusion.

    That optimizer folds batch norms into the preceding conv; the corpus keeps them, since
    folding them is the optimizer's job under test. Every other rewrite and fold still runs.
    """
    import onnxscript.rewriter as rewriter
    from onnxscript.rewriter.rules.common import _fuse_batchnorm

    saved = rewriter._DEFAULT_REWRITE_RULES
    rewriter._DEFAULT_REWRITE_RULES = tuple(r for r in saved if r not in set(_fuse_batchnorm.rules))
    try:
        yield
    finally:
        rewriter._DEFAULT_REWRITE_RULES = saved


def _example(spec: ModelSpec, shape: tuple[int, ...], *seed: str) -> torch.Tensor:
    gen = torch.Generator().manual_seed(_seed(*seed))
    if spec.vocab:
        return torch.randint(0, min(spec.vocab, 100), shape, generator=gen)
    return torch.randn(shape, generator=gen)


def _symbolic_dims(spec: ModelSpec) -> dict[int, str]:
    """The dims a `-dyn` entry leaves symbolic: the batch, and a token model's sequence length."""
    return {0: "batch", 1: "seq"} if spec.vocab else {0: "batch"}


def export(entry: Entry) -> onnx.ModelProto:
    """The full ONNX model (with weights) for one corpus entry."""
    spec = MODELS[entry.model]
    torch.manual_seed(_seed(entry.model))
    model = spec.build().eval()
    _randomize(model, entry.model)
    shape = spec.shape
    if entry.dynamic:
        # Batch 2 for tracing: the dynamo exporter specializes a dimension it sees as 1.
        shape = (2,) + shape[1:]
    x = _example(spec, shape, entry.name, "x")
    name = spec.input_name
    if entry.exporter in ("ts", "qdq", "qdq-pc"):
        buf = io.BytesIO()
        # PRESERVE with an eval-mode model keeps BatchNormalization as an inference node;
        # TrainingMode.EVAL would let the exporter's peephole fold it into the conv. A model to
        # quantize is exported as for deployment (EVAL: batch norms folded), as users do.
        mode = torch.onnx.TrainingMode.PRESERVE if entry.exporter == "ts" else torch.onnx.TrainingMode.EVAL
        dims = _symbolic_dims(spec)
        torch.onnx.export(model, (x,), buf, dynamo=False, opset_version=TS_OPSET,
                          training=mode, do_constant_folding=True,
                          input_names=[name], output_names=["y"],
                          dynamic_axes={name: dims, "y": dims} if entry.dynamic else None)
        exported = onnx.load_from_string(buf.getvalue())
        if entry.exporter == "ts":
            return exported
        return _quantize(exported, entry, spec)
    kwargs = {}
    if entry.dynamic:
        kwargs["dynamic_shapes"] = ({k: torch.export.Dim(d, min=2 if d == "seq" else 1, max=64)
                                     for k, d in _symbolic_dims(spec).items()},)
    optimize = entry.exporter == "dynamo"
    with _no_batchnorm_fusion() if optimize else contextlib.nullcontext():
        program = torch.onnx.export(model, (x,), dynamo=True, opset_version=DYNAMO_OPSET,
                                    optimize=optimize, input_names=[name], output_names=["y"],
                                    verbose=False, **kwargs)
    return program.model_proto


def _quantize(model: onnx.ModelProto, entry: Entry, spec: ModelSpec) -> onnx.ModelProto:
    """The int8 QDQ model onnxruntime's static quantization makes of `model`, the documented way:
    `quant_pre_process` (shape inference, ORT's basic graph optimizations), then `quantize_static`
    in QDQ format, int8 activations and weights, calibrated (MinMax) on eight seeded inputs."""
    import tempfile

    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Calibration(CalibrationDataReader):
        def __init__(self):
            self.feeds = iter([{spec.input_name: _example(spec, spec.shape, entry.name, "calib", str(k)).numpy()}
                               for k in range(8)])

        def get_next(self):
            return next(self.feeds, None)

    with tempfile.TemporaryDirectory() as tmp:
        src, pre, dst = (Path(tmp) / f for f in ("float.onnx", "pre.onnx", "int8.onnx"))
        onnx.save(model, src)
        quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)
        quantize_static(str(pre), str(dst), Calibration(), quant_format=QuantFormat.QDQ,
                        per_channel=entry.exporter == "qdq-pc", activation_type=QuantType.QInt8,
                        weight_type=QuantType.QInt8)
        return onnx.load(dst)


def skeleton(model: onnx.ModelProto, entry: Entry) -> onnx.ModelProto:
    """The model without the values of its large weights.

    Dropped: float initializers of more than SMALL_ELEMENTS elements, and the integer payloads
    of DequantizeLinear (int8 weights, int32 biases) past that size. Each keeps name, dims and
    dtype, and its doc_string says how corpus.py refills it: `corpus:const=V` when every element
    is V (a folded ones/zeros tensor, whose value is structure, not a weight), `corpus:random`
    otherwise. Kept whatever their size: the scales and zero points of QuantizeLinear and
    DequantizeLinear (what calibration found, one number per tensor or channel; a bias's scale
    is its input's times its weight's, which a refill would have to keep); the per-channel
    parameters of a BatchNormalization over a constant (NF-ResNet's weight standardization: its
    scale carries the conv's gain / sqrt(fan-in), which a refill at batch-norm ranges would grow
    activations by sqrt(fan-in) a layer); and masks (at most two distinct values, e.g. a causal
    mask of 0 and the float minimum).
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    quant_params, payloads, standardizers = set(), set(), set()
    constant = {t.name for t in out.graph.initializer}
    for node in out.graph.node:  # in topological order, as ONNX requires
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            quant_params.update(node.input[1:])
        if node.op_type == "DequantizeLinear":
            payloads.add(node.input[0])
        if node.op_type == "BatchNormalization" and node.input[0] in constant:
            standardizers.update(node.input[1:])
        if all(v in constant for v in node.input if v):
            constant.update(node.output)
    for init in out.graph.initializer:
        n = math.prod(init.dims)
        if n <= SMALL_ELEMENTS or init.name in quant_params or init.name in standardizers:
            continue
        if init.data_type not in _FLOAT_TYPES and init.name not in payloads:
            continue
        arr = onnx.numpy_helper.to_array(init)
        flat = arr.reshape(-1)
        if np.all(flat == flat[0]):
            init.doc_string = f"corpus:const={flat[0].item()!r}"
        elif init.data_type in _FLOAT_TYPES and n <= 4096 and np.unique(flat).size <= 2:
            continue
        else:
            init.doc_string = "corpus:random"
        for fd in ("raw_data", "float_data", "double_data", "int32_data", "int64_data"):
            init.ClearField(fd)
    # The dynamo exporter annotates every node and value with its FX node and Python stack:
    # debugging aids, most of the file's size, and nothing the graph means.
    g = out.graph
    for item in [*g.node, *g.input, *g.output, *g.value_info, *g.initializer]:
        del item.metadata_props[:]
    for node in out.graph.node:
        # Constant nodes stay verbatim (shape vectors, swin's shifted-window masks); one big
        # enough to bloat the corpus would be a weight in disguise, and is refused.
        if node.op_type == "Constant":
            size = sum(a.t.ByteSize() for a in node.attribute)
            if size > 256 * 1024:
                raise RuntimeError(f"{entry.name}: Constant {node.output[0]} holds {size} bytes")
    spec = MODELS[entry.model]
    shape = list(spec.shape)
    for k, dim in (_symbolic_dims(spec) if entry.dynamic else {}).items():
        shape[k] = dim
    meta = {"corpus.model": entry.model, "corpus.source": spec.source,
            "corpus.exporter": {"ts": "torch.onnx TorchScript (dynamo=False)",
                                "dynamo": "torch.onnx dynamo (optimize=True, no BN fusion)",
                                "dynamo-noopt": "torch.onnx dynamo (optimize=False)",
                                "qdq": "torch.onnx TorchScript (dynamo=False), quantize_static QDQ int8 per tensor",
                                "qdq-pc": "torch.onnx TorchScript (dynamo=False), quantize_static QDQ int8 per channel",
                                }[entry.exporter],
            "corpus.opset": str(entry.opset), "corpus.input_shape": "x".join(map(str, shape)),
            "corpus.versions": _versions()}
    del out.metadata_props[:]
    for k, v in meta.items():
        out.metadata_props.add(key=k, value=v)
    return out


def _versions() -> str:
    parts = [f"torch {torch.__version__}", f"onnx {onnx.__version__}"]
    for mod in ("torchvision", "timm", "transformers", "onnxscript", "onnxruntime"):
        m = sys.modules.get(mod)
        if m is not None:
            parts.append(f"{mod} {m.__version__}")
    return ", ".join(parts)


def write_readme(folder: Path) -> None:
    """frontend/corpus/README.md: one row per stored skeleton, from what each one records."""
    rows, versions = [], {}
    order = {name: k for k, name in enumerate(ENTRIES)}
    for path in sorted(folder.glob("*.onnx"), key=lambda p: (order.get(p.stem, len(order)), p.stem)):
        model = onnx.load(path)
        meta = {p.key.removeprefix("corpus."): p.value for p in model.metadata_props}
        rows.append(f"| {path.stem} | {meta['model']} ({meta['source']}) | {meta['exporter']} | "
                    f"{meta['opset']} | {meta['input_shape']} | {len(model.graph.node)} | "
                    f"{path.stat().st_size // 1024} |")
        # Each entry records the packages its export imported: the README names them all.
        versions.update(dict.fromkeys(meta["versions"].split(", ")))
    text = f"""# Model corpus

Real models as torch's ONNX exporters write them, stored as skeletons: the graph, every
initializer's name, dims and dtype, and the values of the small ones (non-float tensors, float
tensors of at most {SMALL_ELEMENTS} elements, Constant nodes), of masks (two distinct values), of
the scales and zero points of quantized models and of NF-ResNet's weight-standardization
parameters. `saturate.frontend.corpus.load_model(NAME)` refills the rest with seeded weights (no
torch needed; int8 weights around their zero points, in range); `saturate optimize corpus:NAME
-o OUT` optimizes one. Weights are random (no pretrained download): the graphs are real, the
values not. HuggingFace models (`transformers`) are built from small configs (two layers, hidden
size 64) and read int64 `input_ids`; `-qdq` entries are the TorchScript export quantized to int8
by onnxruntime's `quant_pre_process` and `quantize_static` (QDQ format, `-qdq-pc` per channel).

Made by `python -m saturate.frontend.export_corpus` ({", ".join(versions)}). Batch norms are kept as
inference BatchNormalization nodes: the TorchScript exporter runs with
`training=TrainingMode.PRESERVE` on an eval-mode model, and the dynamo exporter's optimizer runs
without onnxscript's Conv+BN fusion rules. `batch` and `seq` are symbolic dimensions (`-dyn`
entries).

| entry | model (source) | exporter | opset | input | nodes | KiB |
|---|---|---|---|---|---|---|
""" + "\n".join(rows) + "\n"
    (folder / "README.md").write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", metavar="NAME",
                        help="entries (e.g. resnet18-ts) or models (e.g. resnet18) to export")
    parser.add_argument("--out", type=Path, default=CORPUS_DIR)
    args = parser.parse_args(argv)
    wanted = list(ENTRIES)
    if args.only:
        unknown = [n for n in args.only if n not in ENTRIES and n not in MODELS]
        if unknown:
            parser.error(f"unknown entries {unknown}; known: {', '.join(ENTRIES)}")
        wanted = [e for e in ENTRIES if e in args.only or ENTRIES[e].model in args.only]
    args.out.mkdir(parents=True, exist_ok=True)
    warnings.filterwarnings("ignore")
    failed = []
    for name in wanted:
        entry = ENTRIES[name]
        start = time.perf_counter()
        try:
            model = skeleton(export(entry), entry)
        except Exception as err:  # one model's exporter failure must not stop the others
            failed.append(name)
            print(f"{name}: FAILED {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
            continue
        path = args.out / f"{name}.onnx"
        onnx.save(model, path)
        print(f"{name}: {len(model.graph.node)} nodes, {path.stat().st_size / 1024:.0f} KiB, "
              f"{time.perf_counter() - start:.1f} s", flush=True)
    write_readme(args.out)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
