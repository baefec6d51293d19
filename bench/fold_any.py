"""Benchmark of folding constant subgraphs of any op (fold-any) on models that are full of them.

    python bench/fold_any.py --export DIR            # export the three timm models below into DIR
    python bench/fold_any.py DIR/*.onnx [--runs 3] [--max-fold-bytes SIZE]

Swin V2 (relative-position tables: Range, Expand, Equal, Where, ScatterND, Exp, Clip), NF-ResNet
(weight standardization: ReduceMean, Sub, Mul, BatchNormalization on weights) and EdgeNeXt
(positional encoding: CumSum, Sin, Cos, a conv on a constant) from timm with random weights.
For each model: nodes before; after `saturate.optimize` (exported as `saturate optimize` writes
it); after onnxsim's `simplify`; in the model ONNX Runtime writes at ORT_ENABLE_BASIC. Times are
medians over --runs of saturate's import+optimize+export and of onnxsim's simplify, in this
process. torch and timm are needed for --export only.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import onnx
import onnxruntime as ort

from machine import cpu_name

MODELS = {"swinv2_cr_tiny_ns_224": (1, 3, 224, 224), "nf_resnet26": (1, 3, 64, 64),
          "edgenext_xx_small": (1, 3, 64, 64)}


def export(folder: Path) -> None:
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from frontend.export_corpus import _import_torchvision

    _import_torchvision()          # timm imports torchvision
    import timm

    folder.mkdir(parents=True, exist_ok=True)
    for name, shape in MODELS.items():
        model = timm.create_model(name, pretrained=False).eval()
        torch.onnx.export(model, (torch.randn(*shape),), str(folder / f"{name}.onnx"), opset_version=17,
                          dynamo=False, input_names=["input"], output_names=["output"])
        print(f"exported {folder / name}.onnx")


def _median_time(fn, runs: int):
    times, out = [], None
    for _ in range(runs):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return out, statistics.median(times)


def measure(path: Path, runs: int, max_fold_bytes: str | None) -> list[str]:
    from saturate.frontend.onnx_io import export_model, import_model
    from saturate.pipeline import optimize

    model = onnx.load(str(path))

    def run_saturate() -> onnx.ModelProto:
        result, _ = optimize(import_model(onnx.load(str(path))), max_fold_bytes=max_fold_bytes)
        return export_model(result)

    sat, sat_s = _median_time(run_saturate, runs)
    try:
        from onnxsim import simplify

        (sim, _), sim_s = _median_time(lambda: simplify(onnx.load(str(path))), runs)
        sim_nodes, sim_time = str(len(sim.graph.node)), f"{sim_s:.2f}"
    except ImportError:
        sim_nodes = sim_time = "-"
    with tempfile.TemporaryDirectory() as tmp:
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        opts.optimized_model_filepath = str(Path(tmp) / "basic.onnx")
        ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        basic = len(onnx.load(opts.optimized_model_filepath).graph.node)
    return [path.stem, str(len(model.graph.node)), str(len(sat.graph.node)), sim_nodes, str(basic),
            f"{sat_s:.2f}", sim_time]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", type=Path)
    parser.add_argument("--export", type=Path, metavar="DIR")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--max-fold-bytes", default=None)
    args = parser.parse_args()
    if args.export:
        export(args.export)
    if not args.models:
        return
    head = ["model", "before", "saturate", "onnxsim", "ort-basic", "saturate s", "onnxsim s"]
    rows = [measure(p, args.runs, args.max_fold_bytes) for p in args.models]
    widths = [max(len(r[k]) for r in [head, *rows]) for k in range(len(head))]
    print(f"CPU: {cpu_name()}; medians of {args.runs} runs")
    for r in [head, *rows]:
        print("  ".join(c.rjust(w) if k else c.ljust(w) for k, (c, w) in enumerate(zip(r, widths))))


if __name__ == "__main__":
    main()
