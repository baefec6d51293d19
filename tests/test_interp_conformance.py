"""Interpreter conformance: ONNX's own backend node tests, imported and run by saturate."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import AttributeProto, numpy_helper

from saturate.frontend.onnx_io import import_model
from saturate.interp import run_graph
from saturate.interp.reference import unsupported_reason

# ---- every skip, in one place -----------------------------------------------------------------
# Whole categories, decided by rule from each model (see `_category`): they are not counted.
CATEGORIES = {
    "domain": "ops outside the default domain (ai.onnx.ml, ai.onnx.preview.training, ai.onnx.preview)",
    "control-flow": "subgraph attributes (If, Loop, Scan, SequenceMap): their cases run in tests/test_control_flow.py",
    "sequence": "sequence, optional or map values: sequence and optional cases run in tests/test_sequences.py",
}
# Single cases that are counted but fail, each with why (strict xfail: a fix makes them fail
# loudly, so this list only shrinks).
KNOWN_FAILURES: dict[str, str] = {}
# Cases of a random op: the expected output is one draw (made when the cases are generated, unseeded), which
# another draw matches by chance ((2/3)^10 for ten uniform probabilities: a strict xfail failed so in CI). Their
# outputs are checked for what every draw has: shape, dtype and values of 0 and 1 only.
RANDOM_CASES = ("test_bernoulli", "test_bernoulli_double", "test_bernoulli_double_expanded",
                "test_bernoulli_expanded", "test_bernoulli_seed", "test_bernoulli_seed_expanded")
MIN_PASS_RATE = 0.95


def _category(model: onnx.ModelProto) -> str | None:
    """Which excluded category a backend test model falls in, from its structure alone."""
    domains = {n.domain for n in model.graph.node} | {o.domain for o in model.opset_import if o.version}
    if domains - {"", "ai.onnx"}:
        return "domain"
    if any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for n in model.graph.node for a in n.attribute):
        return "control-flow"
    io = list(model.graph.input) + list(model.graph.output)
    if any(not vi.type.HasField("tensor_type") for vi in io):
        return "sequence"
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    for n in model.graph.node:
        if n.domain in ("", "ai.onnx") and opset and "sequence" in (unsupported_reason(n.op_type, opset) or ""):
            return "sequence"
    return None


# ---- the cases, generated once into a cache -------------------------------------------------
def _cache_dir() -> Path:
    """One directory per onnx version, under the user's cache (the temp dir if that is read-only)."""
    folder = f"onnx-node-tests-{onnx.__version__}"
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "saturate"
    try:
        root.mkdir(parents=True, exist_ok=True)
        if os.access(root, os.W_OK) or (root / folder / "index.json").exists():
            return root / folder
    except OSError:
        pass
    return Path(tempfile.gettempdir()) / f"saturate-{folder}"


def _generate(target: Path) -> None:
    """Write every node test of the installed onnx as model.onnx + input_K.pb / output_K.pb."""
    from onnx.backend.test.case.node import collect_testcases

    with np.errstate(all="ignore"):
        cases = collect_testcases()
    # Build beside the target and rename at the end: a concurrent session either sees the
    # whole directory or none of it.
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    index = {}
    for case in cases:
        category = _category(case.model)
        index[case.name] = {"category": category, "rtol": case.rtol, "atol": case.atol}
        if category is not None:
            continue
        folder = tmp / case.name
        folder.mkdir()
        (folder / "model.onnx").write_bytes(case.model.SerializeToString())
        inputs, outputs = case.data_sets[0]
        for kind, values in (("input", inputs), ("output", outputs)):
            for k, value in enumerate(values):
                proto = value if isinstance(value, onnx.TensorProto) else numpy_helper.from_array(np.asarray(value))
                (folder / f"{kind}_{k}.pb").write_bytes(proto.SerializeToString())
    (tmp / "index.json").write_text(json.dumps(index, indent=0, sort_keys=True))
    try:
        tmp.rename(target)
    except OSError:  # another session finished first
        shutil.rmtree(tmp, ignore_errors=True)


def _index() -> dict[str, dict]:
    if not (CACHE / "index.json").exists():
        CACHE.parent.mkdir(parents=True, exist_ok=True)
        _generate(CACHE)
    return json.loads((CACHE / "index.json").read_text())


CACHE = _cache_dir()
INDEX = _index()
COUNTED = sorted(name for name, entry in INDEX.items() if entry["category"] is None)


def _params():
    for name in sorted(INDEX):
        category = INDEX[name]["category"]
        if category is not None:
            yield pytest.param(name, marks=pytest.mark.skip(reason=CATEGORIES[category]), id=name)
        elif name in KNOWN_FAILURES:
            yield pytest.param(name, marks=pytest.mark.xfail(reason=KNOWN_FAILURES[name], strict=True), id=name)
        else:
            yield pytest.param(name, id=name)


def _read(path: Path) -> np.ndarray:
    proto = onnx.TensorProto()
    proto.ParseFromString(path.read_bytes())
    return numpy_helper.to_array(proto)


def _assert_similar(got: np.ndarray, want: np.ndarray, rtol: float, atol: float, k: int) -> None:
    # onnx.backend.test.runner.Runner.assert_similar_outputs, for tensors.
    assert got.shape == want.shape, f"output {k}: shape {got.shape} != {want.shape}"
    if want.dtype == object:
        np.testing.assert_array_equal(got, want)
        return
    assert got.dtype == want.dtype, f"output {k}: dtype {got.dtype} != {want.dtype}"
    if want.dtype.name == "bfloat16":
        rtol = max(rtol, 2**-6)  # two bfloat16 ulps, as the ONNX runner allows
    if want.dtype.isbuiltin != 1:  # ml_dtypes' types (float8, int4...): compare as float32
        got, want = got.astype(np.float32), want.astype(np.float32)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=f"output {k}")


@pytest.mark.parametrize("name", list(_params()))
def test_node_case(name):
    folder = CACHE / name
    model = onnx.load(folder / "model.onnx")
    graph = import_model(model)
    inputs = {vi.name: _read(folder / f"input_{k}.pb") for k, vi in enumerate(model.graph.input)}
    got = run_graph(graph, inputs)
    entry = INDEX[name]
    for k, vi in enumerate(model.graph.output):
        want = _read(folder / f"output_{k}.pb")
        if name in RANDOM_CASES:
            value = got[vi.name]
            assert value.shape == want.shape and value.dtype == want.dtype, (value.shape, value.dtype)
            assert set(np.unique(value).tolist()) <= {0, 1}, np.unique(value)
            continue
        _assert_similar(got[vi.name], want, entry["rtol"], entry["atol"], k)


def test_pass_rate_and_skip_list():
    # Known failures are counted against the rate; the list may only name counted cases.
    assert set(KNOWN_FAILURES) <= set(COUNTED), sorted(set(KNOWN_FAILURES) - set(COUNTED))
    assert 1 - len(KNOWN_FAILURES) / len(COUNTED) >= MIN_PASS_RATE

