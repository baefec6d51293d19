"""Corpus stage (export): real torchvision/timm models through both torch ONNX exporters, stored as weightless skeletons.

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
    source: str  # "torchvision", "timm" or "torch"


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
}


@dataclass
class Entry:
    name: str
    model: str
    exporter: str  # "ts", "dynamo" or "dynamo-noopt"
    dynamic: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def opset(self) -> int:
        return TS_OPSET if self.exporter == "ts" else DYNAMO_OPSET


def _entries() -> list[Entry]:
    out = []
    for model in MODELS:
        out.append(Entry(f"{model}-ts", model, "ts"))
        # VGG's 130 M-weight classifier costs most of a minute of test time per entry, and its
        # 36-node graph is the same from both exporters: one copy is enough.
        if model != "vgg11_bn":
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
    x = torch.randn(shape, generator=torch.Generator().manual_seed(_seed(entry.name, "x")))
    if entry.exporter == "ts":
        buf = io.BytesIO()
        # PRESERVE with an eval-mode model keeps BatchNormalization as an inference node;
        # TrainingMode.EVAL would let the exporter's peephole fold it into the conv.
        torch.onnx.export(model, (x,), buf, dynamo=False, opset_version=TS_OPSET,
                          training=torch.onnx.TrainingMode.PRESERVE, do_constant_folding=True,
                          input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}} if entry.dynamic else None)
        return onnx.load_from_string(buf.getvalue())
    kwargs = {}
    if entry.dynamic:
        kwargs["dynamic_shapes"] = ({0: torch.export.Dim("batch", min=1, max=64)},)
    optimize = entry.exporter == "dynamo"
    with _no_batchnorm_fusion() if optimize else contextlib.nullcontext():
        program = torch.onnx.export(model, (x,), dynamo=True, opset_version=DYNAMO_OPSET,
                                    optimize=optimize, input_names=["x"], output_names=["y"],
                                    verbose=False, **kwargs)
    return program.model_proto


def skeleton(model: onnx.ModelProto, entry: Entry) -> onnx.ModelProto:
    """The model without the values of its large float initializers.

    Each such initializer keeps name, dims and dtype, and its doc_string says how corpus.py
    refills it: `corpus:const=V` when every element is V (a folded ones/zeros tensor, whose
    value is structure, not a weight), `corpus:random` otherwise.
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for init in out.graph.initializer:
        n = math.prod(init.dims)
        if init.data_type not in _FLOAT_TYPES or n <= SMALL_ELEMENTS:
            continue
        arr = onnx.numpy_helper.to_array(init)
        flat = arr.reshape(-1)
        if np.all(flat == flat[0]):
            init.doc_string = f"corpus:const={float(flat[0])!r}"
        else:
            init.doc_string = "corpus:random"
        for fd in ("raw_data", "float_data", "double_data", "int32_data"):
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
    shape = ("batch",) + spec.shape[1:] if entry.dynamic else spec.shape
    meta = {"corpus.model": entry.model, "corpus.source": spec.source,
            "corpus.exporter": {"ts": "torch.onnx TorchScript (dynamo=False)",
                                "dynamo": "torch.onnx dynamo (optimize=True, no BN fusion)",
                                "dynamo-noopt": "torch.onnx dynamo (optimize=False)"}[entry.exporter],
            "corpus.opset": str(entry.opset), "corpus.input_shape": "x".join(map(str, shape)),
            "corpus.versions": _versions()}
    del out.metadata_props[:]
    for k, v in meta.items():
        out.metadata_props.add(key=k, value=v)
    return out


def _versions() -> str:
    parts = [f"torch {torch.__version__}", f"onnx {onnx.__version__}"]
    for mod in ("torchvision", "timm", "onnxscript"):
        m = sys.modules.get(mod)
        if m is not None:
            parts.append(f"{mod} {m.__version__}")
    return ", ".join(parts)


def write_readme(folder: Path) -> None:
    """frontend/corpus/README.md: one row per stored skeleton, from what each one records."""
    rows = []
    order = {name: k for k, name in enumerate(ENTRIES)}
    for path in sorted(folder.glob("*.onnx"), key=lambda p: (order.get(p.stem, len(order)), p.stem)):
        model = onnx.load(path)
        meta = {p.key.removeprefix("corpus."): p.value for p in model.metadata_props}
        rows.append(f"| {path.stem} | {meta['model']} ({meta['source']}) | {meta['exporter']} | "
                    f"{meta['opset']} | {meta['input_shape']} | {len(model.graph.node)} | "
                    f"{path.stat().st_size // 1024} |")
    versions = meta["versions"] if rows else ""
    text = f"""# Model corpus

Real models as torch's ONNX exporters write them, stored as skeletons: the graph, every
initializer's name, dims and dtype, and the values of the small ones (non-float tensors, float
tensors of at most {SMALL_ELEMENTS} elements, Constant nodes). `saturate.frontend.corpus.load_model(NAME)`
refills the rest with seeded weights (no torch needed); `saturate optimize corpus:NAME -o OUT`
optimizes one. Weights are random (no pretrained download): the graphs are real, the values not.

Made by `python -m saturate.frontend.export_corpus` ({versions}). Batch norms are kept as
inference BatchNormalization nodes: the TorchScript exporter runs with
`training=TrainingMode.PRESERVE` on an eval-mode model, and the dynamo exporter's optimizer runs
without onnxscript's Conv+BN fusion rules. `batch` is a symbolic dimension (`-dyn` entries).

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
