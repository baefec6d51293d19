"""bench/transformer_models.py and bench/machine.py: the BERT-, GPT-2- and Llama-style bench models compute what
ONNX Runtime does (reference interpreter, after saturate.optimize, compiled C); the header and --load helpers."""

from __future__ import annotations

import importlib.util
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
