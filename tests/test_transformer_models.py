"""bench/transformer_models.py and bench/machine.py: the BERT-, GPT-2- and Llama-style bench models compute what
ONNX Runtime does (reference interpreter, after saturate.optimize, compiled C); the header and --load helpers."""

from __future__ import annotations

import importlib.util
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from saturate.core.errors import SaturateError

BENCH = Path(__file__).resolve().parent.parent / "bench"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tm = _load("transformer_models")


def _ort(graph, feed):
    from saturate.backend.bench import ort_session

    sess = ort_session(graph, 1)
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feed)))


def _ids(seq: int) -> dict:
    return {"input_ids": np.random.default_rng(0).integers(0, tm.VOCAB, (1, seq)).astype(np.int64)}


@pytest.mark.parametrize("kind", tm.KINDS)
def test_interpreter_and_optimized_graph_match_onnxruntime(kind):
    from saturate import optimize
    from saturate.backend.bench import max_rel_error
    from saturate.interp.interpreter import run_graph

    graph = tm.graph(f"{kind}-8")
    feed = _ids(8)
    truth = _ort(graph, feed)
    assert truth["hidden"].shape == (1, 8, tm.WIDTH) and np.isfinite(truth["hidden"]).all()
    assert max_rel_error(run_graph(graph, feed), truth) <= 1e-4
    optimized, _ = optimize(graph)
    assert max_rel_error(run_graph(optimized, feed), truth) <= 1e-4


def test_causal_models_do_not_look_ahead():
    from saturate.interp.interpreter import run_graph

    for kind in ("gpt2", "llama"):
        graph = tm.graph(f"{kind}-6")
        a, b = _ids(6), _ids(6)
        b["input_ids"][0, -1] = (a["input_ids"][0, -1] + 1) % tm.VOCAB
        ya, yb = run_graph(graph, a)["hidden"], run_graph(graph, b)["hidden"]
        assert np.allclose(ya[0, :-1], yb[0, :-1], atol=1e-5) and not np.allclose(ya[0, -1], yb[0, -1])


@pytest.mark.parametrize("spec", ["bert", "bert-0", "t5-128", "bert-12-3"])
def test_a_bad_spec_is_one_line(spec):
    with pytest.raises(SaturateError, match="expected KIND-SEQ with KIND one of bert, gpt2, llama"):
        tm.model(spec)


@pytest.mark.compiler
@pytest.mark.parametrize("kind", tm.KINDS)
def test_compiled_c_matches_onnxruntime(kind):
    from saturate import optimize
    from saturate.backend.bench import max_rel_error
    from saturate.backend.runtime import compile_graph

    graph, _ = optimize(tm.graph(f"{kind}-16"))
    feed = _ids(16)
    assert max_rel_error(compile_graph(graph, threads=1)(feed), _ort(graph, feed)) <= 1e-4


def test_the_header_says_an_avx2_build_on_an_avx512_cpu_is_one(monkeypatch):
    from saturate.backend import build

    machine = _load("machine")
    monkeypatch.setenv("SATURATE_ISA", "avx2")
    monkeypatch.setattr(build, "cpu_has_avx512", lambda: True)
    assert machine.build_label() == "avx2 build on an AVX-512 CPU"
    monkeypatch.setattr(build, "cpu_has_avx512", lambda: False)
    assert machine.build_label() == "avx2 build on a CPU without AVX-512"
    monkeypatch.setenv("SATURATE_ISA", "native")
    assert machine.build_label() == "native build (no AVX-512 kernels)"


def test_the_load_option_spins_one_process_for_the_block_only():
    machine = _load("machine")
    with machine.Spinner(True) as spinner:
        proc = spinner.proc
        assert proc.poll() is None
    assert proc.poll() is not None and spinner.proc is None
    with machine.Spinner(False) as idle:
        assert idle.proc is None


def _can_hide_avx512(machine) -> bool:
    flags = machine.cpu_flags()
    return platform.machine() == "x86_64" and {"avx512f", "cpuid_fault"} <= flags


def test_avx2_only_hides_avx512_from_the_runtimes_and_from_nothing_else(tmp_path):
    """--avx2-only's library: numpy and ONNX Runtime, loaded after it, see AVX2 and no AVX-512 and still
    compute the same; programs the process starts see the real CPU; a real fault still ends the process."""
    machine = _load("machine")
    if not _can_hide_avx512(machine):
        pytest.skip("needs an x86-64 CPU with AVX-512 and CPUID faulting")
    library = machine.avx2_only_library(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONFAULTHANDLER"}
    env["LD_PRELOAD"] = str(library)
    probe = (
        "import os, subprocess, sys, numpy as np, onnxruntime as ort\n"
        "from numpy._core._multiarray_umath import __cpu_features__ as f\n"
        "from onnx import helper as h, TensorProto as T\n"
        "g = h.make_graph([h.make_node('MatMul', ['a', 'b'], ['c'])], 'm', "
        "[h.make_tensor_value_info(n, T.FLOAT, [64, 64]) for n in 'ab'], [h.make_tensor_value_info('c', T.FLOAT, None)])\n"
        "s = ort.InferenceSession(h.make_model(g, opset_imports=[h.make_opsetid('', 17)]).SerializeToString(), "
        "providers=['CPUExecutionProvider'])\n"
        "a = np.random.default_rng(0).standard_normal((2, 64, 64)).astype(np.float32)\n"
        "err = np.abs(s.run(None, {'a': a[0], 'b': a[1]})[0] - a[0].astype(np.float64) @ a[1]).max()\n"
        "child = subprocess.run([sys.executable, '-c', 'from numpy._core._multiarray_umath import __cpu_features__ "
        "as f; print(f[\"AVX512F\"])'], capture_output=True, text=True).stdout.strip()\n"
        "print(os.environ.get('SATURATE_AVX2_ONLY'), f['AVX512F'], f['AVX2'], f['FMA3'], 'LD_PRELOAD' in os.environ, "
        "err < 1e-3, child)\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["masked", "False", "True", "True", "False", "True", "True"]
    crash = subprocess.run([sys.executable, "-c", "import ctypes; ctypes.string_at(8)"], env=env,
                           capture_output=True, text=True, timeout=60)
    assert crash.returncode == -11


def test_avx2_only_is_refused_where_cpuid_cannot_fault(monkeypatch):
    machine = _load("machine")
    monkeypatch.setattr(machine, "cpu_flags", lambda: {"avx2", "fma", "avx512f"})
    with pytest.raises(SystemExit, match="cannot fault CPUID"):
        machine.exec_avx2_only([])
    monkeypatch.setattr(machine, "cpu_flags", lambda: {"avx2", "fma"})
    monkeypatch.setenv("SATURATE_ISA", "native")
    machine.exec_avx2_only([])  # an AVX2 machine: nothing to hide, the AVX2 build is chosen
    assert os.environ["SATURATE_ISA"] == "avx2" and not machine.avx2_only()
