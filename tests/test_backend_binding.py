"""C backend binding: the compiled directory's Cython module, its C API and header, the C example of
docs/c-backend.md, and builds for the AVX2 and portable instruction sets."""

from __future__ import annotations

import array
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from backend_util import feed_for, make, own_cache, rel_error
from saturate.core.errors import SaturateError
from saturate.core.ir import Node

pytestmark = pytest.mark.compiler
HERE = Path(__file__).resolve().parent
C_BACKEND_DOC = HERE.parent / "docs" / "c-backend.md"
rng = np.random.default_rng(7)


def w(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def env_with_saturate() -> dict:
    """The environment of a shell that finds this Python's `saturate` command first."""
    return dict(os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))


def readme_block(lang: str, marker: str) -> str:
    page = C_BACKEND_DOC.read_text(encoding="utf-8")
    blocks = [b for b in re.findall(rf"```{lang}\n(.*?)```", page, re.S) if marker in b]
    assert len(blocks) == 1, f"expected one ```{lang} block with {marker!r} in docs/c-backend.md"
    return blocks[0]


def test_readme_c_example_links_without_python_and_matches_python(tmp_path):
    """docs/c-backend.md's main.c, built and run by its shell lines, prints what Python computes."""
    from saturate.backend import load
    from saturate.frontend import load_graph
    from saturate.interp.interpreter import run_graph

    (tmp_path / "main.c").write_text(readme_block("c", "main.c: run a model"), encoding="utf-8")
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", readme_block("bash", "./main")], cwd=tmp_path,
                          env=env_with_saturate(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    printed = {}
    for line in proc.stdout.splitlines():
        name, sep, values = line.partition(":")
        if sep and values.strip() and all(re.fullmatch(r"-?[0-9.e+-]+|nan|-?inf", v) for v in values.split()):
            printed[name] = np.array([float(v) for v in values.split()], np.float32)
    model = load(tmp_path / "mlp_c")
    (name, shape), = model.inputs
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape) * np.float32(0.01)  # what main.c feeds
    got = model(x)
    assert set(printed) == set(got) and printed
    for k, value in got.items():
        assert np.array_equal(printed[k], value.reshape(-1)), k  # %.9g round-trips float32 exactly
        ref = run_graph(load_graph("example:mlp"), {name: x})[k]
        assert rel_error(value, ref) <= 1e-4
    # The page's Python block imports the module from the directory with no saturate involved.
    script = readme_block("py", "saturate_model.Model()") + "\nprint(repr({k: v.tolist() for k, v in y.items()}))\n"
    proc = subprocess.run([sys.executable, "-I", "-c", script], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    plain = eval(proc.stdout.strip().splitlines()[-1])
    for k, value in got.items():
        assert np.array_equal(np.array(plain[k], np.float32), value), k


def test_header_documents_the_api_the_library_exports(tmp_path):
    """model.h names this model's tensors and declares every function model.so and the module export."""
    from saturate.backend import compile_graph
    from saturate.backend.build import EXTENSION

    g = make([Node("Relu", ["in:0"], ["r"]), Node("Add", ["r", "c"], ["out/1"])], {"in:0": (2, 3)}, {"c": w(3)},
             outputs=["out/1", "r"])
    compile_graph(g, out_dir=tmp_path / "m")
    text = (tmp_path / "m" / "model.h").read_text()
    declared = set(re.findall(r"\b(sat_\w+)\(", text.split("#ifndef SATURATE_API_H")[1]))
    assert {"sat_init", "sat_run", "sat_free", "sat_workspace_bytes", "sat_input_name", "sat_output_shape",
            "sat_input_dtype", "sat_num_outputs"} <= declared
    assert "'in:0'  float32[2, 3]" in text and "'out/1'  float32[2, 3]" in text and "#define SAT_NUM_OUTPUTS 2" in text
    for lib in ("model.so", EXTENSION):
        dyn = subprocess.run(["nm", "-D", "--defined-only", str(tmp_path / "m" / lib)], capture_output=True,
                             text=True, check=True).stdout
        assert declared <= set(re.findall(r"\b(sat_\w+)$", dyn, re.M)), lib


# Run in a process of its own: a process has one model.so loaded (dlopen finds a second by its soname).
WORKSPACE_PROBE = r"""
import ctypes, json, re, sys
import numpy as np
lib = ctypes.CDLL(sys.argv[1] + "/model.so")
lib.sat_workspace_bytes.restype = ctypes.c_int64
lib.sat_workspace_alloc.restype = ctypes.c_void_p
lib.sat_workspace_free.argtypes = [ctypes.c_void_p]
lib.sat_run.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]


def vm_flags(address):
    lines = open("/proc/self/smaps").read().splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line)
        if m and int(m[1], 16) <= address < int(m[2], 16):
            return next(ln.split()[1:] for ln in lines[i + 1:] if ln.startswith("VmFlags:"))
    return None


ws = lib.sat_workspace_alloc()
flags = vm_flags(ws)
x = np.load(sys.argv[1] + "/x.npy")
y = np.empty_like(x)
ins, outs = (ctypes.c_void_p * 1)(x.ctypes.data), (ctypes.c_void_p * 1)(y.ctypes.data)
rc = [lib.sat_init((sys.argv[1] + "/weights.bin").encode()), lib.sat_run(ins, outs, ws, 1)]
lib.sat_workspace_free(ctypes.c_void_p(ws))
np.save(sys.argv[1] + "/y.npy", y)
print(json.dumps({"bytes": lib.sat_workspace_bytes(), "ws": ws, "flags": flags, "rc": rc, "after": vm_flags(ws)}))
"""


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="reads the mappings from /proc (Linux)")
@pytest.mark.parametrize("n, huge", [(3 << 18, True), (1 << 10, False)])
def test_workspace_alloc_asks_for_huge_pages_from_two_megabytes(tmp_path, n, huge):
    """sat_workspace_alloc maps a workspace of 2 MB or more 2 MB-aligned and advised for huge pages (VmFlags hg),
    a smaller one on plain pages; the model runs on it and sat_workspace_free unmaps it."""
    from saturate.backend import compile_graph

    g = make([Node("Relu", ["x"], ["r"]), Node("Mul", ["r", "r"], ["s"]), Node("Add", ["s", "x"], ["y"])],
             {"x": (1, n)}, {})
    m = compile_graph(g, out_dir=tmp_path / "m")
    x = w(1, n)
    np.save(tmp_path / "m" / "x.npy", x)
    out = subprocess.run([sys.executable, "-c", WORKSPACE_PROBE, str(tmp_path / "m")], capture_output=True,
                         text=True, check=True).stdout
    got = json.loads(out)
    assert (got["bytes"] >= 2 << 20) == huge and got["rc"] == [0, 0]
    assert got["ws"] % ((2 << 20) if huge else 4096) == 0
    assert ("hg" in got["flags"]) == huge and got["after"] is None
    expect = np.maximum(x, 0) ** 2 + x
    assert rel_error(np.load(tmp_path / "m" / "y.npy"), expect) < 1e-6 and rel_error(m({"x": x})["y"], expect) < 1e-6


def test_plain_import_of_the_module_describes_and_runs_the_model(tmp_path):
    from saturate.backend import compile_graph

    g = make([Node("Conv", ["x", "k", "b"], ["c"], {"pads": [1, 1, 1, 1]}), Node("Relu", ["c"], ["y"])],
             {"x": (1, 3, 8, 8)}, {"k": w(4, 3, 3, 3), "b": w(4)})
    feed = feed_for(g)
    want = compile_graph(g, out_dir=tmp_path / "m")(feed)["y"]
    np.save(tmp_path / "x.npy", feed["x"])
    script = ("import sys, numpy as np; sys.path.insert(0, sys.argv[1]); import saturate_model as s\n"
              "m = s.Model(); x = np.load(sys.argv[2])\n"
              "assert s.INPUTS == [('x', (1, 3, 8, 8), 'float32')] and s.OUTPUTS == [('y', (1, 4, 8, 8), 'float32')]\n"
              "out = np.empty((1, 4, 8, 8), np.float32); assert m.run([x], threads=2, outputs=[out])[0] is out\n"
              "np.save(sys.argv[3], m(x)['y']); assert np.array_equal(out, m(x=x)['y'])\n"
              "for bad in (x.astype(np.float64), x[:, :, ::2], x[:, :2].copy()):\n"
              "    try: m(bad)\n"
              "    except (TypeError, ValueError) as e: print(type(e).__name__, e)\n")
    proc = subprocess.run([sys.executable, "-I", "-c", script, str(tmp_path / "m"), str(tmp_path / "x.npy"),
                           str(tmp_path / "y.npy")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert np.array_equal(np.load(tmp_path / "y.npy"), want)
    assert proc.stdout.splitlines() == [
        "TypeError input 'x' has item format 'd'; the compiled model takes float32",
        "TypeError input 'x' must be a C-contiguous float32 array, got ndarray",
        "ValueError input 'x' has shape (1, 2, 8, 8); the compiled model expects (1, 3, 8, 8)"]


def test_weights_of_2_mb_and_more_are_copied_onto_huge_pages_and_smaller_ones_stay_mapped(tmp_path):
    """A model's weights from 2 MB to 1 GiB are copied once, at load, into memory the kernel is asked to back with
    2 MB pages (their file is no longer mapped); smaller ones stay a shared mapping of weights.bin. Both run the
    same, and release() frees either (a new Model loads them again)."""
    from saturate.backend import compile_graph

    dirs, wants, feeds = {}, {}, {}
    for name, n in (("small", 64), ("large", 1024)):  # 16 KB and 4 MB of weights
        g = make([Node("MatMul", ["x", "k"], ["m"]), Node("Relu", ["m"], ["y"])], {"x": (4, n)}, {"k": w(n, n)})
        feeds[name] = feed_for(g)
        wants[name] = compile_graph(g, out_dir=tmp_path / name)(feeds[name])["y"]
        np.save(tmp_path / f"{name}.npy", feeds[name]["x"])
        dirs[name] = tmp_path / name
    script = ("import sys, json, numpy as np; sys.path.insert(0, sys.argv[1]); import saturate_model as s\n"
              "def huge():\n"
              "    return sum(int(l.split()[1]) for l in open('/proc/self/smaps_rollup') if l.startswith('AnonHugePages'))\n"
              "def mapped():\n"
              "    return any(l.rstrip().endswith('/weights.bin') for l in open('/proc/self/maps'))\n"
              "x = np.load(sys.argv[2]); before = huge(); m = s.Model(); after = huge(); y = m(x)['y']\n"
              "was_mapped = mapped(); s.release(); gone = not mapped()\n"
              "again = s.Model()(x)['y']; np.save(sys.argv[3], y)\n"
              "thp = open('/sys/kernel/mm/transparent_hugepage/enabled').read()\n"
              "print(json.dumps({'mapped': was_mapped, 'huge_kb': after - before, 'gone': gone,\n"
              "                  'same': bool(np.array_equal(y, again)), 'thp': thp}))\n")
    seen = {}
    for name in dirs:
        proc = subprocess.run([sys.executable, "-I", "-c", script, str(dirs[name]), str(tmp_path / f"{name}.npy"),
                               str(tmp_path / f"{name}_y.npy")], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        seen[name] = json.loads(proc.stdout.strip().splitlines()[-1])
        assert np.array_equal(np.load(tmp_path / f"{name}_y.npy"), wants[name])
        assert seen[name]["same"] and seen[name]["gone"], seen[name]
    assert seen["small"]["mapped"] and not seen["large"]["mapped"], seen
    if "[never]" not in seen["large"]["thp"]:
        assert seen["large"]["huge_kb"] >= 2048, seen["large"]
    assert seen["small"]["huge_kb"] == 0, seen["small"]


def test_load_runs_a_directory_like_the_compiled_model_and_refuses_what_is_not_one(tmp_path, monkeypatch):
    from saturate.backend import compile_graph, load

    monkeypatch.setenv("SATURATE_ISA", "native")     # the refusal below is of a native build moved

    g = make([Node("MatMul", ["a", "m"], ["p"]), Node("Sigmoid", ["p"], ["y"])], {"a": (3, 5)}, {"m": w(5, 4)})
    feed = feed_for(g)
    want = compile_graph(g, out_dir=tmp_path / "m")(feed)
    model = load(tmp_path / "m", threads=2)
    assert model.inputs == [("a", (3, 5))] and model.outputs == [("y", (3, 4))]
    assert np.array_equal(model(feed)["y"], want["y"]) and np.array_equal(model(a=feed["a"])["y"], want["y"])
    with pytest.raises(SaturateError, match=r"input 'a' has shape \(5, 3\); the compiled model expects \(3, 5\)"):
        model(np.zeros((5, 3), np.float32))
    (tmp_path / "empty").mkdir()
    with pytest.raises(SaturateError, match="no compiled model"):
        load(tmp_path / "empty")
    shutil.copytree(tmp_path / "m", tmp_path / "moved")  # as if built on another machine
    facts = json.loads((tmp_path / "moved" / "build.json").read_text())
    assert facts["isa"] == "native" and facts["key"] == (tmp_path / "m" / "build.key").read_text()
    (tmp_path / "moved" / "build.json").write_text(json.dumps({**facts, "cpu": "model name\t: Other CPU\nflags\t: fpu"}))
    with pytest.raises(SaturateError, match="built with -march=native for Other CPU, not this CPU; compile it again"):
        load(tmp_path / "moved")
    shutil.copytree(tmp_path / "m", tmp_path / "cut")  # a fresh path: the loaded library keeps its weights
    (tmp_path / "cut" / "weights.bin").write_bytes(b"\0" * 12)
    with pytest.raises(SaturateError, match="cannot load weights"):
        load(tmp_path / "cut")


def test_directories_rebuilt_or_side_by_side_in_one_process_keep_their_own_code_and_weights(tmp_path):
    """Every compiled module exports the same sat_* names and the loader reuses a library by file name:
    models loaded side by side, and a directory rebuilt after it was loaded, must each run their own."""
    from saturate.backend import compile_graph, load

    graphs = [make([Node("Mul", ["x", "c"], ["y"])], {"x": (4,)}, {"c": np.full(4, v, np.float32)}) for v in (2, 3)]
    graphs.append(make([Node("Sub", ["x", "c"], ["y"])], {"x": (4,)}, {"c": np.full(4, 1, np.float32)}))
    x = np.arange(4, dtype=np.float32)
    models = [compile_graph(g, out_dir=tmp_path / f"m{k}") for k, g in enumerate(graphs)]
    for model, factor in zip(models[:2], (2, 3)):
        assert np.array_equal(model(x)["y"], factor * x)
    for k, g in enumerate(graphs):  # each graph into the same directory in turn, loaded each time
        compile_graph(g, out_dir=tmp_path / "same")
        assert np.array_equal(load(tmp_path / "same")(x)["y"], [2 * x, 3 * x, x - 1][k])
    assert np.array_equal(models[0](x)["y"], 2 * x)


def test_the_gil_is_released_while_the_c_runs_and_threads_take_turns(tmp_path):
    from saturate.backend import compile_graph

    nodes = [Node("Conv", ["x", "k0"], ["c0"], {"pads": [1, 1, 1, 1]})]
    for i in range(1, 6):
        nodes.append(Node("Conv", [f"c{i - 1}", f"k{i}"], [f"c{i}"], {"pads": [1, 1, 1, 1]}))
    # Calls of about 0.1 s and more: far longer than the pauses a busy machine's scheduler causes.
    g = make(nodes, {"x": (1, 64, 112, 112)}, {f"k{i}": w(64, 64, 3, 3) * 0.05 for i in range(6)})
    model = compile_graph(g)
    feeds = [feed_for(g, seed) for seed in range(2)]
    want = [model(f)["c5"] for f in feeds]
    start = time.perf_counter()
    model(feeds[0])
    call = time.perf_counter() - start
    # While another thread is inside one long call, this thread keeps running Python.
    worker = threading.Thread(target=model, args=(feeds[0],))
    gaps, last = [], time.perf_counter()
    worker.start()
    while worker.is_alive():
        now = time.perf_counter()
        gaps.append(now - last)
        last = now
    worker.join()
    assert max(gaps) < 0.5 * call, f"longest pause {max(gaps):.3f} s in a {call:.3f} s call"
    # Concurrent calls on one model serialize inside the module: each gets its own result.
    got = [None] * 4
    threads = [threading.Thread(target=lambda k=k: got.__setitem__(k, model(feeds[k % 2])["c5"])) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(np.array_equal(got[k], want[k % 2]) for k in range(4))


def test_the_fast_call_path_gives_what_the_checked_path_gives_and_keeps_every_error(tmp_path):
    """A whole-C model is called straight through the module's Model.call (numpy arrays taken by pointer,
    outputs allocated through numpy's C API); CompiledModel._call is the checked path it falls back to.
    The per-call time of both is measured by bench/backend_speed.py --overhead, not here."""
    from saturate.backend import compile_graph, load

    g = make([Node("Relu", ["x"], ["r"]), Node("Add", ["r", "z"], ["y"]), Node("Sigmoid", ["x"], ["s"])],
             {"x": (2, 3), "z": (3,)}, outputs=["y", "s"])
    model = compile_graph(g, out_dir=tmp_path / "m")
    loaded = load(tmp_path / "m")
    assert model._direct_call is not None and loaded._direct_call is not None
    x, z = (rng.standard_normal(s).astype(np.float32) for s in ((2, 3), (3,)))
    want = model._call((x, z), {}, 1)
    assert list(want) == ["y", "s"]
    for m in (model, loaded):
        for got in (m(x, z), m({"x": x, "z": z}), m(x, z=z), m(z=z, x=x), m(x, z, threads=2)):
            assert list(got) == ["y", "s"] and all(np.array_equal(got[k], want[k]) for k in want)
            assert all(v.dtype == np.float32 and v.flags.c_contiguous and v.flags.writeable for v in got.values())
        # What the module refuses (not C-contiguous, unaligned, big-endian) the checked path copies or names.
        wide = np.zeros((2, 6), np.float32)
        wide[:, ::2] = x
        raw = np.zeros(4 * 6 + 1, np.uint8)
        unaligned = raw[1:].view(np.float32).reshape(2, 3)
        unaligned[...] = x
        for odd in (wide[:, ::2], np.asfortranarray(x), unaligned):
            assert np.array_equal(m(odd, z)["y"], want["y"])
    # A later call never overwrites what an earlier one returned while anything holds it (the dict, a
    # view, a memoryview); the model writes into its last outputs again only once the caller dropped them.
    first = model(x, z)
    kept = {k: v.copy() for k, v in first.items()}
    second = model(-x, z)
    assert all(np.array_equal(first[k], kept[k]) and first[k] is not second[k] for k in first)
    address = second["y"].ctypes.data
    del second
    again = model(x, z)
    assert again["y"].ctypes.data == address and all(np.array_equal(again[k], want[k]) for k in want)
    row, view = again["y"][1], memoryview(again["s"])
    del again
    third = model(-x, z)
    assert np.array_equal(row, want["y"][1]) and np.array_equal(np.asarray(view), want["s"])
    third["y"].shape = (6,)  # changed in place, then dropped: the next call's "y" has the compiled shape
    third["s"].flags.writeable = False
    del third
    fourth = model(x, z)
    assert all(fourth[k].shape == (2, 3) and np.array_equal(fourth[k], want[k]) for k in want)
    # Every error of the public path is one line naming the problem in the model's terms.
    errors = [((x.astype(np.float64), z), {}, r"input 'x' has dtype float64; the compiled model expects float32"),
              ((x.T.copy(), z), {}, r"input 'x' has shape \(3, 2\); the compiled model expects \(2, 3\)"),
              ((x.astype(">f4"), z), {}, r"input 'x' has dtype >f4"),
              ((x.tolist(), z), {}, r"input 'x' must be a numpy array, got list"),
              ((x,), {}, r"missing input 'z'"),
              (({"x": x, "z": z, "w": z},), {}, r"unknown input\(s\) \['w'\]"),
              ((x, z, z), {}, r"model takes 2 inputs, got 3"),
              ((x, z), {"threads": -1}, r"thread count must be at least 1, got -1")]
    for m in (model, loaded):
        for args, kwargs, message in errors:
            with pytest.raises(SaturateError, match=message) as err:
                m(*args, **kwargs)
            assert "\n" not in str(err.value)
    # The module itself: TypeError or ValueError, one line each, for inputs and output buffers alike.
    module = model.segments[0].model
    out = [np.empty((2, 3), np.float32), np.empty((2, 3), np.float32)]
    assert module.run([x, z], outputs=out) is out and np.array_equal(out[0], want["y"])
    assert np.array_equal(module.run([memoryview(x), array.array("f", z.tolist())])[0], want["y"])  # buffer protocol
    frozen = np.empty((2, 3), np.float32)
    frozen.flags.writeable = False
    refused = [(lambda: module.run([x.astype(np.float64), z]), TypeError, "input 'x' has item format 'd'"),
               (lambda: module.run([x[:, :2], z]), TypeError, "input 'x' must be a C-contiguous float32 array"),
               (lambda: module.run([x.T.copy(), z]), ValueError, r"input 'x' has shape \(3, 2\)"),
               (lambda: module.run([x.astype(">f4"), z]), TypeError, "input 'x' has item format '>f'"),
               (lambda: module.run([x]), ValueError, r"the model takes 2 input\(s\), got 1"),
               (lambda: module.run([x, z], outputs=[frozen, out[1]]), TypeError, "output buffer 'y' must be a "
                "C-contiguous float32 array that can be written"),
               (lambda: module.run([x, z], outputs=[out[0], z]), ValueError, r"output buffer 's' has shape \(3,\)"),
               (lambda: module({"x": x}), ValueError, r"missing input\(s\) \['z'\]"),
               (lambda: module(x, z, y=x), ValueError, r"unknown input\(s\) \['y'\]"),
               (lambda: module.call((x, z), 0), ValueError, "thread count must be at least 1")]
    for call, kind, message in refused:
        with pytest.raises(kind, match=message) as err:
            call()
        assert "\n" not in str(err.value)
    # More values than the module keeps pointers for on the stack.
    chain = [Node("Relu", ["x"], ["r0"])] + [Node("Add", [f"r{i}", "x"], [f"r{i + 1}"]) for i in range(19)]
    many = compile_graph(make(chain, {"x": (3,)}, outputs=[f"r{i}" for i in range(20)]))
    got, want = many(x[0]), many._call((x[0],), {}, 1)
    assert many._direct_call is not None and list(got) == list(want) and all(np.array_equal(got[k], want[k]) for k in want)


def test_kernel_scratch_of_extra_threads_is_measured_and_counted_in_the_reported_workspace(tmp_path, capsys, monkeypatch):
    from saturate.backend import compile_graph
    from saturate.cli import main
    from saturate.frontend import save_graph

    g = make([Node("Conv", ["x", "k"], ["y"], {"pads": [1, 1, 1, 1]})], {"x": (1, 16, 32, 32)}, {"k": w(32, 16, 3, 3)})
    # The im2col path, whose extra threads get their tiles before the loop (pgemm.h's grow per thread as
    # items reach them, so how much depends on which thread wakes in time; AVX-512 builds' direct conv
    # shares one padded input between threads).
    from saturate.backend.build import BuildConfig, isa

    # (the CLI's compile below too)
    monkeypatch.setattr(BuildConfig, "from_env", classmethod(lambda cls, **kw: cls(isa=isa(), im2col=True, **kw)))
    model = compile_graph(g)
    one, two = model.scratch_bytes(1), model.scratch_bytes(2)
    # Each extra thread unfolds its own im2col tile: about what the plan counts for the calling thread.
    assert two - one >= 0.9 * model.segments[0].emitted.plan.scratch_bytes > 0
    assert model.scratch_bytes(1) == one  # what a call allocates it frees, or keeps for the next call
    save_graph(g, str(tmp_path / "conv.onnx"))
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert main(["compile", str(tmp_path / "conv.onnx"), "-o", str(tmp_path / "c"), "--quiet"]) == 0
    peak = model.workspace_bytes
    assert f"peak workspace: {peak + one} bytes at 1 thread, {peak + two} bytes at 2 threads" in capsys.readouterr().out


@pytest.mark.parametrize("which", ["avx2", "portable"])
def test_backend_checks_pass_when_built_for_avx2_and_portable(tmp_path, which):
    _run_isa_cases(tmp_path, which, [])


def test_avx512_kernels_build_warning_free_on_any_machine(tmp_path):
    """SATURATE_ISA=avx512 builds the AVX-512 kernels (run as well where the CPU has them)."""
    _run_isa_cases(tmp_path, "avx512", [])


@pytest.mark.slow
@pytest.mark.parametrize("which", ["avx2", "portable"])
def test_corpus_models_pass_when_built_for_avx2_and_portable(tmp_path, which):
    _run_isa_cases(tmp_path, which, ["corpus:mobilenet_v3_small-ts", "corpus:deit_tiny-ts", "corpus:resnet18-ts"])


def _run_isa_cases(tmp_path, which: str, corpus: list[str]) -> None:
    env = dict(os.environ, SATURATE_ISA=which, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(HERE / "backend_isa_cases.py"), which, *corpus], env=env, cwd=HERE,
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0 and "isa cases ok" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_a_bad_isa_is_a_one_line_error(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "saturate", "compile", "example:mlp", "-o", str(tmp_path / "o")],
                          env=dict(os.environ, SATURATE_ISA="sse9"), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["saturate: error: SATURATE_ISA='sse9': expected one of native, avx2, portable, avx512"]


def test_builds_are_warning_free_and_keyed_by_compiler_flags_and_cpu(monkeypatch):
    from saturate.backend import build

    monkeypatch.setenv("SATURATE_ISA", "native")     # the key of a native build, then of an avx2 one
    flags = build.compile_flags()
    assert "-Wall" in flags and "-Werror" in flags and "-w" not in flags
    key = build.build_key("int x;", b"\0")
    with monkeypatch.context() as patch:
        patch.setattr(build, "cpu_features", lambda: "flags: fpu sse2")
        assert build.build_key("int x;", b"\0") != key
    with monkeypatch.context() as patch:
        patch.setattr(build, "compiler_version", lambda cc: "cc (other) 99.1")
        assert build.build_key("int x;", b"\0") != key
    monkeypatch.setenv("SATURATE_ISA", "avx2")
    assert "-march=x86-64-v3" in build.compile_flags() and build.build_key("int x;", b"\0") != key
    monkeypatch.setenv("SATURATE_ISA", "native")
    assert build.build_key("int x;", b"\0") == key and build.build_key("int x;", b"\1") != key


def test_a_failed_build_names_the_source_it_keeps_and_leaves_no_partial_build(tmp_path, monkeypatch):
    from saturate.backend import build

    cache = own_cache(tmp_path)
    monkeypatch.setenv("SATURATE_CACHE", str(cache))
    with pytest.raises(SaturateError, match=r"C compiler failed on .*failed-\w+\.c: failed-\w+\.c:1:\d+: error: .*nope") as err:
        build.build("int f(void) { return nope; }\n", b"", "")
    kept = Path(str(err.value).split(" on ")[1].split(": ")[0])
    assert "return nope" in kept.read_text()
    assert sorted(p.name for p in cache.iterdir() if not p.name.startswith(("binding-", "libsat-", "prelude-"))) == [kept.name]


def _fake_build(root: Path, name: str, megabytes: float, used: float) -> Path:
    d = root / name
    d.mkdir()
    (d / "weights.bin").write_bytes(b"\0" * int(megabytes * 1024 * 1024))
    (d / "build.key").write_text(name)
    os.utime(d / "build.key", (used, used))
    return d


def test_the_build_cache_evicts_least_recently_used_builds_past_its_limit(tmp_path, monkeypatch):
    """Builds hold their weights, so an unbounded cache filled the disk: past $SATURATE_CACHE_MB the least
    recently used builds go, but never the one just made, one used in the last minutes, or files that are
    not builds; a staging directory a killed process left an hour ago goes too."""
    from saturate.backend import cache

    monkeypatch.setenv("SATURATE_CACHE", str(tmp_path))
    monkeypatch.setenv("SATURATE_CACHE_MB", "2.5")
    now = time.time()
    old = _fake_build(tmp_path, "old", 1, now - 3000)
    older = _fake_build(tmp_path, "older", 1, now - 4000)
    kept = _fake_build(tmp_path, "kept", 1, now - 5000)
    recent = _fake_build(tmp_path, "recent", 1, now - 10)
    (tmp_path / "binding-x.o").write_bytes(b"\0" * 2 * 1024 * 1024)
    stale, fresh = tmp_path / ".abc.stage", tmp_path / ".def.stage"
    stale.mkdir(), fresh.mkdir()
    os.utime(stale, (now - 2 * cache.STALE_SECONDS, now - 2 * cache.STALE_SECONDS))
    assert cache.prune_cache(keep=kept, now=now) == [older, old]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".def.stage", "binding-x.o", "kept", "recent"]
    # Within the limit nothing more goes; a use counts as recent.
    cache.mark_used(kept)
    monkeypatch.setenv("SATURATE_CACHE_MB", "0")
    assert cache.prune_cache(now=time.time()) == []
    assert cache.prune_cache(now=time.time() + cache.IN_USE_SECONDS + 1) == [recent, kept]


def test_a_build_found_while_the_cache_is_sized_is_not_evicted(tmp_path, monkeypatch):
    """A prune sizes every build before it evicts (most of a second for thousands of builds); another process
    that found a build in the cache meanwhile and is loading it has marked it used, and the prune leaves it."""
    from saturate.backend import cache

    monkeypatch.setenv("SATURATE_CACHE", str(tmp_path))
    monkeypatch.setenv("SATURATE_CACHE_MB", "0")
    now = time.time()
    found, idle = _fake_build(tmp_path, "found", 1, now - 3000), _fake_build(tmp_path, "idle", 1, now - 4000)
    sized = cache._tree_bytes

    def sizing(directory):  # the other process's cache hit lands while this one sizes the builds
        cache.mark_used(found)
        return sized(directory)

    monkeypatch.setattr(cache, "_tree_bytes", sizing)
    assert cache.prune_cache(now=now) == [idle]
    assert (found / "build.key").exists()


@pytest.mark.compiler
def test_shared_cache_entries_unused_for_two_weeks_are_pruned_and_a_use_keeps_them(tmp_path, monkeypatch):
    """The binding object, kernel library, precompiled headers, peak figure and a failed compile's source are
    keyed by the sources, flags, compiler and CPU, so an upgrade strands the old ones (28 MB of headers a
    set): unused for SUPPORT_STALE_SECONDS, each goes with its .sha256 and .lock; the ones the build in
    force uses are kept, since every use records itself."""
    from saturate.backend import build, cache

    root = own_cache(tmp_path)
    monkeypatch.setenv("SATURATE_CACHE", str(root))
    lib, obj = build.kernel_library(), build.binding_object()
    prelude = build.model_prelude(build.BuildConfig.from_env())
    stale = [root / "libsat-0123456789abcdef01234567.a", root / "libsat-0123456789abcdef01234567.sha256",
             root / "libsat-0123456789abcdef01234567.lock", root / "binding-0123456789abcdef01234567.o",
             root / "peak-0123456789abcdef01234567.json", root / "failed-0123456789abcdef01234567.c"]
    for p in stale:
        p.write_bytes(b"old")
    (root / "prelude-0123456789abcdef01234567").mkdir()
    (root / "prelude-0123456789abcdef01234567" / build.PRELUDE).write_text("old")
    stale.append(root / "prelude-0123456789abcdef01234567")
    fresh = root / "failed-fedcba9876543210fedcba98.c"
    fresh.write_text("recent")
    long_ago = time.time() - 2 * cache.SUPPORT_STALE_SECONDS
    for p in [*stale, lib, lib.with_suffix(".sha256"), obj, obj.with_suffix(".sha256"),
              *([prelude] if prelude else [])]:
        os.utime(p, (long_ago, long_ago))
    # What the build in force needs is used again before the prune: it stays.
    assert build.kernel_library() == lib and build.binding_object() == obj
    assert build.model_prelude(build.BuildConfig.from_env()) == prelude
    cache.prune_cache(now=time.time())
    assert not [p for p in stale if os.path.lexists(p)]
    assert lib.is_file() and lib.with_suffix(".sha256").is_file() and obj.is_file() and fresh.is_file()
    assert prelude is None or (prelude / build.PRELUDE).is_file()
    assert not [p.name for p in root.iterdir() if p.name.startswith(".")]  # nothing half removed left


def test_a_build_prunes_the_cache_at_most_every_half_minute(tmp_path, monkeypatch):
    from saturate.backend import cache

    monkeypatch.setenv("SATURATE_CACHE", str(tmp_path))
    now = time.time()
    assert cache.prune_due(now) and not cache.prune_due(now + 1)
    assert cache.prune_due(now + cache.PRUNE_EVERY_SECONDS + 1)


@pytest.mark.parametrize("text", ["lots", "-1", "inf", "nan", "1e400"])   # float() reads the last three
def test_a_bad_cache_limit_is_a_one_line_error(tmp_path, text):
    proc = subprocess.run([sys.executable, "-m", "saturate", "compile", "example:mlp", "-o", str(tmp_path / "o")],
                          env=dict(os.environ, SATURATE_CACHE=str(tmp_path / "c"), SATURATE_CACHE_MB=text),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and not (tmp_path / "o").exists()
    assert proc.stderr.strip().splitlines() == [f"saturate: error: SATURATE_CACHE_MB={text!r}: expected a number of megabytes"
                                                + (", not a negative one" if text == "-1" else "")]
