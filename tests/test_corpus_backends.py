"""Corpus end to end: every real model's optimized graph runs in the numpy interpreter and as
compiled C, and both agree with ONNX Runtime on the original model."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from backend_util import corpus_reference

import saturate
from saturate.frontend import corpus
from saturate.interp import run_graph

RTOL = 1e-4


@functools.lru_cache(maxsize=1)
def _case(name: str):
    """The original model's ORT outputs and the optimized graph (one model held at a time)."""
    return corpus_reference(name)


def _assert_close(got: dict, want: dict) -> None:
    for name, value in want.items():
        scale = max(float(np.max(np.abs(value))), 1e-6)
        err = float(np.max(np.abs(got[name].astype(np.float64) - value))) / scale
        assert err <= RTOL, f"{name}: relative error {err:.2e}"


@pytest.mark.slow
@pytest.mark.parametrize("name", corpus.names())
def test_interpreter_runs_the_optimized_model_like_ort(name):
    feeds, want, optimized = _case(name)
    _assert_close(run_graph(optimized, feeds), want)


@pytest.mark.slow
@pytest.mark.compiler
@pytest.mark.parametrize("name", corpus.names())
def test_compiled_c_runs_the_optimized_model_like_ort(name, tmp_path):
    feeds, want, optimized = _case(name)
    shapes = {k: v.shape for k, v in feeds.items()}
    compiled = saturate.compile_graph(optimized, input_shapes=shapes, out_dir=tmp_path / "build")
    _assert_close(compiled(**feeds), want)
