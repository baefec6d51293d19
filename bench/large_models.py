"""Benchmark of models with external data (several GB): saturate, onnxsim and `cp` side by side.

    python bench/large_models.py [--runs 3] [--dim 8192] [--blocks 12] [--decoder-layers 20] [--skip-decoder]
    python bench/large_models.py --model M.onnx [--runs 3] [--skip-checked]     # a model built before (only read)

Builds, in a temp dir, (1) an MLP of `--blocks` blocks of MatMul dim x dim, a per-column Mul, a
bias Add and Relu (float32, 3.2 GB at the defaults), and (2) a float16 decoder-shaped model of
`--decoder-layers` layers (RMS-norm scale, attention projections, a gated MLP; 8.1 GB at the
defaults), each built block by block without holding it in memory. Then runs, each in its own
process, the tools interleaved: `cp` of the model and its data file, `cp` then `sync` of the
copies (saturate syncs what it writes), `saturate optimize M -o OUT --check 0` (onnxsim's command
checks nothing either), `saturate optimize M -o OUT` (the default --check 1: the result against the
input in ONNX Runtime on one random input) and `onnxsim`; prints medians of wall time and peak RSS
(/usr/bin/time's: it counts the pages of mapped files the process touched, which the system can
drop at any time, as well as its own memory). saturate runs from this checkout (PYTHONPATH), its
modules compiled once into a cache in the temp dir, as an installed package has them (pip
compiles them on install), in a first run that is not counted. The decoder runs once, as it
takes most of the machine's disk, and without onnxsim when the memory available is under 2.5
times its weights (the machine may be shared).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from machine import cpu_name

_BLOCK_ROWS = 1024     # rows of a weight generated at a time


class DataWriter:
    """Initializers whose bytes go to one external data file as they are made."""

    def __init__(self, folder: Path, name: str, seed: int = 0):
        self.location = name
        self.file = open(folder / name, "wb")
        self.offset = 0
        self.initializers: list[TensorProto] = []
        self.rng = np.random.default_rng(seed)

    def add(self, name: str, shape: tuple[int, ...], dtype: np.dtype, scale: float = 1.0) -> str:
        """A random tensor `name`, written in slices of rows so memory stays at one slice."""
        dtype = np.dtype(dtype)
        rows = shape[0] if shape else 1
        rest = int(np.prod(shape[1:])) if len(shape) > 1 else 1
        start = self.offset
        for r in range(0, rows, _BLOCK_ROWS):
            n = min(_BLOCK_ROWS, rows - r)
            block = self.rng.standard_normal((n, rest), dtype=np.float32) * np.float32(scale)
            self.file.write(block.astype(dtype.newbyteorder("<")).tobytes())
        length = rows * rest * dtype.itemsize
        self.offset += length
        t = TensorProto()
        t.name = name
        t.data_type = helper.np_dtype_to_tensor_dtype(dtype)
        t.dims.extend(shape)
        t.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.location), ("offset", str(start)), ("length", str(length))):
            t.external_data.add(key=key, value=value)
        self.initializers.append(t)
        return name

    def close(self) -> None:
        self.file.close()


def build_mlp(folder: Path, dim: int = 8192, blocks: int = 12, batch: int = 4) -> Path:
    """`blocks` x (MatMul dim x dim, Mul by a per-column scale, Add a bias, Relu), float32."""
    data = DataWriter(folder, "mlp.onnx.data")
    nodes, x = [], "x"
    for b in range(blocks):
        w = data.add(f"w{b}", (dim, dim), np.float32, dim ** -0.5)
        s = data.add(f"s{b}", (dim,), np.float32)
        c = data.add(f"c{b}", (dim,), np.float32)
        nodes += [helper.make_node("MatMul", [x, w], [f"mm{b}"], name=f"mm{b}"),
                  helper.make_node("Mul", [f"mm{b}", s], [f"sc{b}"], name=f"sc{b}"),
                  helper.make_node("Add", [f"sc{b}", c], [f"ad{b}"], name=f"ad{b}"),
                  helper.make_node("Relu", [f"ad{b}"], [f"r{b}"], name=f"r{b}")]
        x = f"r{b}"
    data.close()
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, dim])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [batch, dim])],
                              initializer=data.initializers)
    path = folder / "mlp.onnx"
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def build_decoder(folder: Path, layers: int = 20, hidden: int = 4096, ffn: int = 11008,
                  heads: int = 32, seq: int = 8) -> Path:
    """A float16 decoder stack: per layer, an RMS norm (its scale a Mul before the projections),
    Q/K/V projections, causal-free attention over `heads` heads, the output projection and a
    residual Add; then an RMS norm and a gated MLP (SiLU(x W1) * (x W3)) W2 and a residual Add."""
    data = DataWriter(folder, "decoder.onnx.data", seed=1)
    f16 = np.float16
    head = hidden // heads
    shape_heads = helper.make_tensor("shape_heads", TensorProto.INT64, [4], [1, seq, heads, head])
    shape_flat = helper.make_tensor("shape_flat", TensorProto.INT64, [3], [1, seq, hidden])
    scale = helper.make_tensor("attn_scale", TensorProto.FLOAT16, [], np.array([head ** -0.5], f16).view(np.uint16))
    eps = helper.make_tensor("eps", TensorProto.FLOAT16, [], np.array([1e-5], f16).view(np.uint16))
    nodes: list = []
    x = "x"

    def rms_norm(src: str, tag: str) -> str:
        gamma = data.add(f"{tag}.gamma", (hidden,), f16, 0.1)
        nodes.extend([
            helper.make_node("Mul", [src, src], [f"{tag}.sq"]),
            helper.make_node("ReduceMean", [f"{tag}.sq", "axes_last"], [f"{tag}.ms"], keepdims=1),
            helper.make_node("Add", [f"{tag}.ms", "eps"], [f"{tag}.mse"]),
            helper.make_node("Sqrt", [f"{tag}.mse"], [f"{tag}.rms"]),
            helper.make_node("Div", [src, f"{tag}.rms"], [f"{tag}.n"]),
            helper.make_node("Mul", [f"{tag}.n", gamma], [f"{tag}.out"])])
        return f"{tag}.out"

    def linear(src: str, tag: str, rows: int, cols: int) -> str:
        w = data.add(f"{tag}.w", (rows, cols), f16, rows ** -0.5)
        nodes.append(helper.make_node("MatMul", [src, w], [f"{tag}.y"]))
        return f"{tag}.y"

    def split_heads(src: str, tag: str) -> str:
        nodes.extend([helper.make_node("Reshape", [src, "shape_heads"], [f"{tag}.r"]),
                      helper.make_node("Transpose", [f"{tag}.r"], [f"{tag}.t"], perm=[0, 2, 1, 3])])
        return f"{tag}.t"

    for i in range(layers):
        t = f"l{i}"
        n = rms_norm(x, f"{t}.ln1")
        q = split_heads(linear(n, f"{t}.q", hidden, hidden), f"{t}.qh")
        k = split_heads(linear(n, f"{t}.k", hidden, hidden), f"{t}.kh")
        v = split_heads(linear(n, f"{t}.v", hidden, hidden), f"{t}.vh")
        nodes.extend([
            helper.make_node("Transpose", [k], [f"{t}.kt"], perm=[0, 1, 3, 2]),
            helper.make_node("MatMul", [q, f"{t}.kt"], [f"{t}.s"]),
            helper.make_node("Mul", [f"{t}.s", "attn_scale"], [f"{t}.ss"]),
            helper.make_node("Softmax", [f"{t}.ss"], [f"{t}.p"], axis=-1),
            helper.make_node("MatMul", [f"{t}.p", v], [f"{t}.a"]),
            helper.make_node("Transpose", [f"{t}.a"], [f"{t}.at"], perm=[0, 2, 1, 3]),
            helper.make_node("Reshape", [f"{t}.at", "shape_flat"], [f"{t}.af"])])
        o = linear(f"{t}.af", f"{t}.o", hidden, hidden)
        nodes.append(helper.make_node("Add", [x, o], [f"{t}.h"]))
        n2 = rms_norm(f"{t}.h", f"{t}.ln2")
        gate = linear(n2, f"{t}.w1", hidden, ffn)
        up = linear(n2, f"{t}.w3", hidden, ffn)
        nodes.extend([helper.make_node("Sigmoid", [gate], [f"{t}.sg"]),
                      helper.make_node("Mul", [gate, f"{t}.sg"], [f"{t}.silu"]),
                      helper.make_node("Mul", [f"{t}.silu", up], [f"{t}.gu"])])
        down = linear(f"{t}.gu", f"{t}.w2", ffn, hidden)
        nodes.append(helper.make_node("Add", [f"{t}.h", down], [f"{t}.out"]))
        x = f"{t}.out"
    data.close()
    axes = helper.make_tensor("axes_last", TensorProto.INT64, [1], [-1])
    graph = helper.make_graph(
        nodes, "decoder", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, seq, hidden])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT16, [1, seq, hidden])],
        initializer=[shape_heads, shape_flat, scale, eps, axes] + data.initializers)
    path = folder / "decoder.onnx"
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    return path


REPO = Path(__file__).resolve().parents[1]


def child_env(folder: Path) -> dict[str, str]:
    """The tools' environment: saturate imported from this checkout, its compiled modules cached
    under `folder` (the checkout is not written to) even where PYTHONDONTWRITEBYTECODE is set."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["PYTHONPYCACHEPREFIX"] = str(folder / "pycache")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def measure(cmd: list[str], cwd: Path) -> tuple[float, int, int]:
    """Wall seconds, peak RSS in bytes and exit status of one run. The peak is /usr/bin/time's
    (its child's own ru_maxrss): a child forked from this process would count this process's
    pages too."""
    with tempfile.NamedTemporaryFile("r", suffix=".rss") as rss:
        start = time.perf_counter()
        done = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", rss.name, *cmd], cwd=cwd,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=child_env(cwd))
        wall = time.perf_counter() - start
        lines = [ln for ln in Path(rss.name).read_text().split() if ln.isdigit()]
    if done.returncode != 0:
        err = done.stderr.decode(errors="replace").strip()
        print(f"  {' '.join(cmd[:4])}... failed ({done.returncode}): {err[-400:]}", file=sys.stderr)
    return wall, int(lines[-1]) * 1024 if lines else 0, done.returncode


def _tools(model: Path, out: Path, tiny: Path | None = None) -> dict[str, list[list[str]]]:
    """Each tool's commands, run one after another (their times and peaks taken together). `tiny`
    is the MLP's shape at dim 64: the same command on it is what a run costs before any weight."""
    data = model.with_name(model.name + ".data")
    return {
        "cp": [["cp", str(model), str(data), str(out)]],
        "cp + sync": [["cp", str(model), str(data), str(out)],
                      ["sync", str(out / model.name), str(out / data.name)]],
        "saturate": [[sys.executable, "-m", "saturate", "optimize", str(model), "-o", str(out / "sat.onnx"),
                      "--check", "0", "--quiet", "--report", str(out / "report.json")]],
        "sat default": [[sys.executable, "-m", "saturate", "optimize", str(model), "-o", str(out / "sat.onnx"),
                         "--quiet"]],
        "onnxsim": [["onnxsim", str(model), str(out / "sim.onnx"), "--save-as-external-data"]],
        "sat start": [[sys.executable, "-m", "saturate", "optimize", str(tiny), "-o", str(out / "tiny.onnx"),
                       "--check", "0", "--quiet"]],
    }


def run_tools(model: Path, runs: int, tools: list[str], stages: dict[str, list[float]] | None = None,
              work: Path | None = None) -> dict[str, tuple[float, float, int]]:
    """Median wall seconds, median peak RSS and failures of each tool on `model`, the tools
    interleaved run by run (the machine is shared: its load drifts); outputs (in `work`, by
    default the model's folder) removed each time. `stages` gets saturate's time per stage of
    each run (its --report)."""
    work = work or model.parent
    results: dict[str, list[tuple[float, int, int]]] = {t: [] for t in tools}
    tiny = None
    if "sat start" in tools:
        (work / "start-up").mkdir(exist_ok=True)
        tiny = build_mlp(work / "start-up", dim=64)
    out = Path(tempfile.mkdtemp(prefix="warm-up-", dir=work))
    try:
        measure(_tools(model, out)["saturate"][0], work)     # compiles saturate's modules
    finally:
        shutil.rmtree(out, ignore_errors=True)
    for _ in range(runs):
        for tool in tools:
            out = Path(tempfile.mkdtemp(prefix=f"{tool.split()[0]}-", dir=work))
            try:
                wall, peak, failed = 0.0, 0, 0
                for cmd in _tools(model, out, tiny)[tool]:
                    w, p, code = measure(cmd, work)
                    wall, peak, failed = wall + w, max(peak, p), failed or code
                results[tool].append((wall, peak, failed))
                report = out / "report.json"
                if stages is not None and report.is_file():
                    for stage, seconds in json.loads(report.read_text())["times"].items():
                        stages.setdefault(stage, []).append(seconds)
            finally:
                shutil.rmtree(out, ignore_errors=True)
                # Untimed: what one tool left dirty in the page cache is not the next one's to write.
                os.sync()
    return {t: (statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs),
                sum(1 for r in rs if r[2])) for t, rs in results.items()}


def _weights(model: Path) -> tuple[int, int]:
    """Bytes of the model's external data, and of its largest weight."""
    proto = onnx.load(str(model), load_external_data=False)
    sizes = [int(e.value) for t in proto.graph.initializer for e in t.external_data if e.key == "length"]
    return sum(sizes), max(sizes, default=0)


def print_table(name: str, model: Path, results: dict, runs: int, stages: dict | None = None) -> None:
    total, largest = _weights(model)
    print(f"\n{name}: {total / 2**30:.2f} GiB of weights, largest {largest / 2**20:.0f} MiB "
          f"(median of {runs} run{'s' if runs > 1 else ''})")
    print(f"  {'tool':<12}{'wall s':>9}{'peak RSS MiB':>14}{'x cp':>7}{'x cp+sync':>11}  failed")
    cp, synced = results.get("cp", (0,))[0], results.get("cp + sync", (0,))[0]
    for tool, (wall, peak, failed) in results.items():
        print(f"  {tool:<12}{wall:>9.2f}{peak / 2**20:>14.0f}{wall / cp if cp else 0:>7.2f}"
              f"{wall / synced if synced else 0:>11.2f}  {failed or ''}")
    print("  saturate: `saturate optimize M -o OUT --check 0`; sat default: `saturate optimize M -o OUT` "
          "(--check 1); both --quiet; sat start: the first on the MLP's shape at dim 64 (a process's fixed cost)")
    sat, start = results.get("saturate"), results.get("sat start")
    if sat and start and cp:
        print(f"  saturate less its start: {sat[0] - start[0]:.2f} s, x cp {(sat[0] - start[0]) / cp:.2f}")
    if stages:
        print("  saturate's stages, median s: "
              + ", ".join(f"{k} {statistics.median(v):.2f}" for k, v in stages.items()))
        if cp and "extract" in stages:
            # The folds (read the weights, compute, write them into the output's data file) are
            # the extract stage: against `cp` of the same files, the physical bound of that work.
            extract = statistics.median(stages["extract"])
            print(f"  the folds (extract) / cp: {extract / cp:.2f}; / cp + sync: {extract / synced if synced else 0:.2f}")
    print(f"  load average after the runs: {os.getloadavg()[0]:.1f}")
    sim = results.get("onnxsim")
    if sat and sim and sim[0]:
        print(f"  saturate / onnxsim: {sat[0] / sim[0]:.2f}x time, {sat[1] / max(sim[1], 1):.2f}x peak RSS")


def _available() -> int:
    """Bytes of memory available (MemAvailable), 0 if unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dim", type=int, default=8192)
    parser.add_argument("--blocks", type=int, default=12)
    parser.add_argument("--decoder-layers", type=int, default=20)
    parser.add_argument("--skip-decoder", action="store_true")
    parser.add_argument("--skip-onnxsim", action="store_true")
    parser.add_argument("--skip-checked", action="store_true", help="leave out `saturate optimize` with its check")
    parser.add_argument("--dir", default=None, help="where to build the models (default: a temp dir)")
    parser.add_argument("--model", default=None,
                        help="run on this model (its data file beside it) instead of building the MLP and "
                             "the decoder; it is only read, the outputs go to --dir or a temp dir")
    args = parser.parse_args()
    tools = (["cp", "cp + sync", "saturate", "sat start"] + ([] if args.skip_checked else ["sat default"])
             + ([] if args.skip_onnxsim or not shutil.which("onnxsim") else ["onnxsim"]))
    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores; {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} "
          f"GiB RAM; load {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="large-models-", dir=args.dir) as tmp:
        folder = Path(tmp)
        if args.model:
            model = Path(args.model).resolve()
            stages = {}
            print_table(model.name, model, run_tools(model, args.runs, tools, stages, folder), args.runs, stages)
            return 0
        start = time.perf_counter()
        model = build_mlp(folder, args.dim, args.blocks)
        print(f"built the MLP in {time.perf_counter() - start:.1f} s")
        stages: dict[str, list[float]] = {}
        print_table(f"MLP {args.blocks} x MatMul {args.dim}x{args.dim} float32", model,
                    run_tools(model, args.runs, tools, stages), args.runs, stages)
        for f in folder.iterdir():
            if f.is_file():         # the compiled modules (a folder) stay for the next model
                f.unlink()
        if not args.skip_decoder:
            start = time.perf_counter()
            model = build_decoder(folder, args.decoder_layers)
            print(f"built the decoder in {time.perf_counter() - start:.1f} s")
            weights = _weights(model)[0]
            if "onnxsim" in tools and _available() < 2.5 * weights:
                # onnxsim holds the model about twice over: not on a machine others share.
                print(f"  onnxsim left out: {_available() / 2**30:.1f} GiB available, it needs about "
                      f"{2.5 * weights / 2**30:.0f}")
                tools.remove("onnxsim")
            stages = {}
            print_table(f"decoder {args.decoder_layers} layers, hidden 4096, float16", model,
                        run_tools(model, 1, tools, stages), 1, stages)
    return 0


if __name__ == "__main__":
    sys.exit(main())
