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

# What fails today, by (entry, check): each is an xfail(strict=True), so a fix flips it to a
# failure that asks for the line to go. Checks: "interp" (the numpy interpreter), "c" (compiled C).
XFAIL: dict[tuple[str, str], str] = {}

# Models built through one export only: another export of the same model is one more C build,
# the dearest step of the suite, for a graph the interpreter test already runs.
COMPILED_ONCE = {"bert-dynamo", "bert-ts-dyn", "llama-dynamo-dyn", "edgenext-dynamo", "nf_resnet26-ts",
                 "swinv2_cr-ts"}


@functools.lru_cache(maxsize=1)
def _case(name: str):
    """The original model's ORT outputs and the optimized graph (one model held at a time)."""
    return corpus_reference(name)


def _params() -> list:
    """(entry, check) pairs, an entry's checks side by side: _case holds one model, so its
    optimized graph and ORT's outputs are made once for both."""
    out = []
    for n in corpus.names():
        for check in ("interp", "c"):
            if check == "c" and n in COMPILED_ONCE:
                continue
            marks = [pytest.mark.compiler] if check == "c" else []
            if (n, check) in XFAIL:
                marks.append(pytest.mark.xfail(strict=True, reason=XFAIL[n, check]))
            out.append(pytest.param(n, check, id=f"{n}-{check}", marks=marks))
    return out


def _assert_close(name: str, got: dict, want: dict) -> None:
    steps = corpus.output_steps(name)
    for out, value in want.items():
        diff = float(np.max(np.abs(got[out].astype(np.float64) - value)))
        if out in steps:  # a quantized output: within one quantization step
            assert diff <= steps[out] * (1 + RTOL), f"{out}: max|diff| {diff:.3g}, step {steps[out]:.3g}"
            continue
        err = diff / max(float(np.max(np.abs(value))), 1e-6)
        assert err <= RTOL, f"{out}: relative error {err:.2e}"


@pytest.mark.slow
@pytest.mark.parametrize("name,check", _params())
def test_optimized_model_runs_like_ort(name, check, tmp_path):
    """The optimized graph in the numpy interpreter ("interp") or compiled to C ("c") gives ORT's
    outputs on the original model."""
    feeds, want, optimized = _case(name)
    if check == "interp":
        got = run_graph(optimized, feeds)
    else:
        shapes = {k: v.shape for k, v in feeds.items()}
        got = saturate.compile_graph(optimized, input_shapes=shapes, out_dir=tmp_path / "build")(**feeds)
    _assert_close(name, got, want)
