"""Benchmark of folding on the model corpus: node counts after saturate, onnx-simplifier and ONNX Runtime's basic and extended levels.

    python bench/corpus_folding.py [--runs 3] [--only NAME ...] [--ops]

For each corpus model (frontend/corpus, weights refilled by saturate.frontend.corpus): nodes
before; after `saturate.optimize` (level 3, cpu, exported to ONNX as `saturate optimize` writes
it); after onnxsim's `simplify` (the `bench` extra); and in the model ONNX Runtime writes at
ORT_ENABLE_BASIC (constant folding and redundancy elimination, ORT's portable level) and at
ORT_ENABLE_EXTENDED (basic plus ORT's fusions: QDQ groups into QLinearConv/QLinearMatMul, Gelu,
LayerNormalization, attention; some of them into com.microsoft contrib ops that only ORT runs,
so that column is what ORT itself executes, not a portable model). Times are
medians over --runs of saturate's import+optimize+export and of onnxsim's simplify, both in this
process (bench/corpus_commands.py times the commands a user runs, start-up included); a last line
counts the models saturate took no longer on and gives both totals and the median ratio. `--ops`
adds, per model, the op counts where saturate's result and onnxsim's differ.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import tempfile
import time
from pathlib import Path

import onnx
import onnxruntime as ort

import saturate
from saturate.frontend import corpus
from saturate.frontend.onnx_io import export_model, import_model


def _ops(model: onnx.ModelProto) -> collections.Counter:
    return collections.Counter(n.op_type for n in model.graph.node)


def _timed(fn, runs: int):
    """The result of the last run and the median wall time of `runs` runs."""
    times, result = [], None
    for _ in range(runs):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return result, statistics.median(times)


def run_saturate(model: onnx.ModelProto) -> onnx.ModelProto:
    graph, _report = saturate.optimize(import_model(model), level=3, target="cpu")
    return export_model(graph)


def run_onnxsim(model: onnx.ModelProto) -> onnx.ModelProto:
    import onnxsim

    simplified, _ok = onnxsim.simplify(model, check_n=0)
    return simplified


def run_ort(model: onnx.ModelProto, workdir: Path, level: str = "basic") -> onnx.ModelProto:
    """The model ONNX Runtime writes (`optimized_model_filepath`) at level "basic" or "extended"."""
    out = workdir / f"ort_{level}.onnx"
    opts = ort.SessionOptions()
    opts.graph_optimization_level = {"basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                                     "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED}[level]
    opts.optimized_model_filepath = str(out)
    # Weights past 1 KiB go to a side file: VGG's would not fit protobuf's 2 GB limit twice over.
    opts.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                  f"ort_{level}.data")
    ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return onnx.load(out, load_external_data=False)


def corpus_parser(doc: str, runs: int) -> argparse.ArgumentParser:
    """The options of a corpus benchmark: --runs and --only (parse with `parse_corpus_args`)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--runs", type=int, default=runs)
    parser.add_argument("--only", nargs="+", metavar="NAME", help="corpus entries (default: all)")
    return parser


def parse_corpus_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """The parsed options and the corpus entries to run; an unknown entry is a usage error."""
    args = parser.parse_args(argv)
    names = args.only or corpus.names()
    unknown = sorted(set(names) - set(corpus.names()))
    if unknown:
        parser.error(f"unknown corpus entries: {', '.join(unknown)}")
    return args, names


def print_header(header: tuple[str, ...]) -> None:
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = corpus_parser(__doc__, runs=3)
    parser.add_argument("--ops", action="store_true", help="op counts where saturate and onnxsim differ")
    args, names = parse_corpus_args(parser, argv)
    print_header(("model", "nodes before", "saturate", "onnxsim", "ORT basic", "ORT extended", "optimize s",
                  "onnxsim s"))
    diffs = []
    times: list[tuple[float, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            model = corpus.load_model(name)
            row = [name, str(len(model.graph.node))]
            sat, t_sat = _timed(lambda: run_saturate(model), args.runs)
            row.append(str(len(sat.graph.node)))
            try:
                sim, t_sim = _timed(lambda: run_onnxsim(model), args.runs)
                row.append(str(len(sim.graph.node)))
            except Exception as err:  # one model onnxsim cannot take must not end the table
                sim, t_sim = None, float("nan")
                row.append(f"error ({type(err).__name__})")
            row.append(str(len(run_ort(model, Path(tmp), "basic").graph.node)))
            row.append(str(len(run_ort(model, Path(tmp), "extended").graph.node)))
            row += [f"{t_sat:.3f}", f"{t_sim:.3f}"]
            if sim is not None:
                times.append((t_sat, t_sim))
            print("| " + " | ".join(row) + " |", flush=True)
            if args.ops and sim is not None:
                a, b = _ops(sat), _ops(sim)
                delta = {op: (a[op], b[op]) for op in sorted(set(a) | set(b)) if a[op] != b[op]}
                if delta:
                    diffs.append((name, delta))
    if times:
        ratios = sorted(a / b for a, b in times)
        print(f"\nsaturate no slower than onnxsim on {sum(a <= b for a, b in times)} of {len(times)} models; "
              f"in all {sum(a for a, _ in times):.2f} s against {sum(b for _, b in times):.2f} s; "
              f"median model {statistics.median(ratios):.2f}x onnxsim's time")
    for name, delta in diffs:
        print(f"{name}: " + ", ".join(f"{op} {s} vs {o}" for op, (s, o) in delta.items())
              + "  (saturate vs onnxsim)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
