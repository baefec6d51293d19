"""Benchmark of the commands a user runs on the model corpus: `saturate optimize` against onnxsim.

    python bench/corpus_commands.py [--runs 5] [--only NAME ...]

Each corpus model (frontend/corpus, weights refilled by saturate.frontend.corpus) is written to a
temporary .onnx file; then three commands run in turn --runs times, after one warm-up each, so
that a change in the machine's speed falls on all three:

- `python -m saturate optimize MODEL -o OUT --check 0`: default options but the numeric check
  against ONNX Runtime (on by default), since onnxsim's command checks no outputs by default;
- `python -m onnxsim MODEL OUT` (the `bench` extra), default options: its command also prints a
  table of op counts, FLOPs and memory of both models;
- onnxsim's API alone, as a user's script calls it: load, `onnxsim.simplify(model, check_n=0)`,
  save (`python -c`), onnxsim at its fastest.

Times are whole processes, wall clock, start-up and the writing of the output included, as a user
waits for them. Printed per model: the median of each command's times; the median of the pairwise
ratios of saturate's time to the faster of onnxsim's two (per run, the faster one of that round);
the nodes each output holds. A last line counts the models saturate took no longer on and gives
the totals and the median ratio. bench/corpus_folding.py times the same work inside one process,
where the start-up of neither tool counts.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import onnx

from corpus_folding import corpus_parser, parse_corpus_args, print_header  # this folder's bench
from saturate.frontend import corpus


# onnxsim called from a user's script: what the `onnxsim` command does, less its report.
API_SCRIPT = ("import sys, onnx, onnxsim; "
              "onnx.save(onnxsim.simplify(onnx.load(sys.argv[1]), check_n=0)[0], sys.argv[2])")


def _wall(command: list[str]) -> float:
    """Seconds `command` took, from its start to its exit; a failure ends the benchmark."""
    start = time.perf_counter()
    done = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        sys.exit(f"{' '.join(command)}: exit {done.returncode}: {last}")
    return seconds


def _nodes(path: Path) -> int:
    return len(onnx.load(path, load_external_data=False).graph.node)


def main(argv: list[str] | None = None) -> int:
    args, names = parse_corpus_args(corpus_parser(__doc__, runs=5), argv)
    print_header(("model", "saturate s", "onnxsim s", "onnxsim API s", "ratio", "saturate nodes", "onnxsim nodes"))
    rows: list[tuple[float, float, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name in names:
            model = work / f"{name}.onnx"
            onnx.save(corpus.load_model(name), model)
            ours, theirs = work / "saturate.onnx", work / "onnxsim.onnx"
            a = [sys.executable, "-m", "saturate", "optimize", str(model), "-o", str(ours), "--check", "0"]
            b = [sys.executable, "-m", "onnxsim", str(model), str(theirs)]
            c = [sys.executable, "-c", API_SCRIPT, str(model), str(theirs)]
            for command in (a, b, c):
                _wall(command)
            times: list[tuple[float, float, float]] = []
            for _ in range(args.runs):
                times.append((_wall(a), _wall(b), _wall(c)))
            t_a, t_b, t_c = (statistics.median(column) for column in zip(*times))
            ratio = statistics.median(x / min(y, z) for x, y, z in times)
            rows.append((t_a, min(t_b, t_c), ratio))
            print(f"| {name} | {t_a:.3f} | {t_b:.3f} | {t_c:.3f} | {ratio:.2f} | {_nodes(ours)} "
                  f"| {_nodes(theirs)} |", flush=True)
            model.unlink()
    if rows:
        print(f"\nsaturate no slower than onnxsim on {sum(r <= 1 for _, _, r in rows)} of {len(rows)} models "
              f"(median of paired ratios); in all {sum(a for a, _, _ in rows):.2f} s against "
              f"{sum(b for _, b, _ in rows):.2f} s (onnxsim's faster command per model); median model {statistics.median(r for _, _, r in rows):.2f}x "
              "onnxsim's time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
