"""Signals end the work promptly: a batch stopped by SIGINT or SIGTERM kills its workers, leaves no
temp files, prints one line and writes summary.json for what finished; a killed run's temp file is
swept by the next write to its folder."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from saturate.cli import main

# The first model to finish (a worker's start-up and a second of work) comes long before vgg11_bn,
# the corpus's largest, which starts first and is still running when the signal is sent.
BATCH = ["corpus:vgg11_bn-ts", "corpus:mobilenet_v3_small-ts", "corpus:squeezenet1_1-ts",
         "corpus:squeezenet1_1-dynamo"]


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_for(condition, timeout: float = 120.0, what: str = "") -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.01)


def _signal_and_wait(proc: subprocess.Popen, sig: int, within: float = 2.0) -> str:
    """Send `sig` to `proc` and wait for it to end, at most `within` seconds after the signal; its stderr."""
    sent = time.monotonic()
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=60)
    took = time.monotonic() - sent
    assert took < within, (proc.returncode, took, stderr)
    return stderr


def _temps(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


@pytest.mark.slow
@pytest.mark.parametrize("sig,code,word,jobs", [(signal.SIGINT, 130, "interrupted", 2),
                                                (signal.SIGTERM, 143, "terminated", 2),
                                                (signal.SIGTERM, 143, "terminated", 1)])
def test_a_signal_ends_a_batch_within_two_seconds_with_a_summary_of_what_finished(tmp_path, sig, code, word, jobs):
    out = tmp_path / "out"
    # One job at a time runs the models in the order given, in the command's own process.
    models = BATCH if jobs > 1 else BATCH[1:3] + BATCH[:1] + BATCH[3:]
    proc = subprocess.Popen([sys.executable, "-m", "saturate", "optimize", *models, "-o", str(out), "--jobs",
                             str(jobs)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        _wait_for(lambda: out.is_dir() and any(p.suffix == ".onnx" for p in out.iterdir()), what="a first model")
        workers = _children(proc.pid)
        assert len(workers) >= (jobs if jobs > 1 else 0)
        # A worker renames its model into place, then reports it: a signal in between (a poll that saw the
        # file at once) found no model done (it failed so once in a fresh-clone CI run). Half a second lets
        # the report arrive.
        time.sleep(0.5)
        stderr = _signal_and_wait(proc, sig)
    finally:
        proc.kill()
    assert proc.returncode == code, (proc.returncode, stderr)
    summary = json.loads((out / "summary.json").read_text())
    done = [r["source"] for r in summary["results"]]
    assert stderr.splitlines() == [f"saturate: {word}: {len(done)} of 4 models done; "
                                   f"summary in {out / 'summary.json'}"], stderr
    assert summary["interrupted"] and summary["models"] == len(done) >= 1 and summary["failed"] == 0
    assert "corpus:vgg11_bn-ts" in summary["not_done"] and sorted(done + summary["not_done"]) == sorted(BATCH)
    assert sorted(p.name for p in out.iterdir()) == sorted([Path(r["output"]).name for r in summary["results"]]
                                                           + ["summary.json"])
    assert _temps(out) == [] and not any(_alive(w) for w in workers)


@pytest.mark.slow
def test_ctrl_c_while_the_workers_start_prints_one_line(tmp_path):
    """A Ctrl-C at the terminal goes to the whole foreground process group: workers still starting
    must not each print a traceback."""
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "saturate", "optimize", *BATCH, "-o", str(out), "--jobs", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            start_new_session=True)
    try:
        _wait_for(lambda: len(_children(proc.pid)) >= 2, what="the workers")
        workers = _children(proc.pid)
        time.sleep(0.3)  # the workers are importing their stages
        sent = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        proc.kill()
    assert proc.returncode == 130 and took < 2.0, (proc.returncode, took, stderr)
    assert stderr.splitlines() == [f"saturate: interrupted: 0 of 4 models done; summary in {out / 'summary.json'}"]
    assert json.loads((out / "summary.json").read_text())["not_done"] == BATCH
    assert not any(_alive(w) for w in workers)


@pytest.mark.slow
def test_a_batch_worker_that_dies_fails_its_model_and_the_rest_go_on(tmp_path, monkeypatch):
    """A worker killed from outside (the out-of-memory killer) costs its own model only."""
    from saturate import batch

    started = []
    real = batch._Worker.take

    def take(self, order, jobs):
        real(self, order, jobs)
        if self.job is not None and jobs[self.job].source == "example:vgg" and not started:
            started.append(self.proc.pid)
            os.kill(self.proc.pid, signal.SIGKILL)

    monkeypatch.setattr(batch._Worker, "take", take)
    out = tmp_path / "out"
    assert main(["optimize", "example:vgg", "example:mlp", "example:mobilenet", "-o", str(out), "--jobs", "2",
                 "--quiet"]) == 2
    results = {r["source"]: r for r in json.loads((out / "summary.json").read_text())["results"]}
    assert results["example:vgg"]["error"] == "worker process failed (killed by SIGKILL)"
    assert results["example:mlp"]["ok"] and results["example:mobilenet"]["ok"]


@pytest.mark.slow
def test_a_temp_file_left_by_sigkill_is_swept_by_the_next_write_there(tmp_path):
    out = tmp_path / "out.onnx"
    # The temp file lives only while the outputs are written: a busy machine's poll can miss it, or see it
    # just before it is renamed, so the run is repeated (its outputs removed) until one is killed with it on
    # disk.
    for _ in range(10):
        for done in (out, tmp_path / "out.html"):
            done.unlink(missing_ok=True)
        proc = subprocess.Popen([sys.executable, "-m", "saturate", "optimize", "corpus:mobilenet_v3_small-ts",
                                 "-o", str(out), "--html", str(tmp_path / "out.html")],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
        try:
            _wait_for(lambda: _temps(tmp_path) or proc.poll() is not None, what="a temp file")
            proc.kill()
            proc.wait()
        finally:
            proc.kill()
        if _temps(tmp_path):
            break
        assert proc.returncode in (0, -signal.SIGKILL), "the run failed before it wrote"
    left = _temps(tmp_path)
    assert left, "every run ended before it wrote"
    assert main(["optimize", "example:mlp", "-o", str(tmp_path / "other.onnx"), "--quiet"]) == 0
    assert _temps(tmp_path) == []


def _endless_loop_model(path: Path) -> None:
    """A Loop of 2^62 iterations (ONNX Runtime runs it for ever, in C++ that never returns to Python)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    body = helper.make_graph(
        [helper.make_node("Identity", ["c_in"], ["c_out"]), helper.make_node("Add", ["v_in", "one"], ["v_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [1])])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "go", "x"], ["y"], body=body)], "endless",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        [numpy_helper.from_array(np.array(2**62, np.int64), "trips"), numpy_helper.from_array(np.array(True), "go"),
         numpy_helper.from_array(np.array([1.0], np.float32), "one")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


@pytest.mark.parametrize("sig,code,word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_a_signal_ends_the_check_of_a_model_that_loops_for_ever(tmp_path, sig, code, word):
    # The check runs the model in ONNX Runtime, whose run does not return to Python until it ends:
    # a signal sets the run's terminate flag, and the command ends as it ends elsewhere.
    model, out = tmp_path / "endless.onnx", tmp_path / "out.onnx"
    _endless_loop_model(model)
    before = model.read_bytes()
    proc = subprocess.Popen([sys.executable, "-m", "saturate", "optimize", str(model), "-o", str(out)],
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        time.sleep(5)       # import, optimize (the Loop is kept as it is) and into the check
        assert proc.poll() is None
        stderr = _signal_and_wait(proc, sig)
    finally:
        proc.kill()
    assert proc.returncode == code, (proc.returncode, stderr)
    assert stderr.splitlines() == [f"saturate: {word}"], stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["endless.onnx"] and model.read_bytes() == before


@pytest.mark.compiler
def test_a_signal_ends_bench_of_a_model_that_loops_for_ever(tmp_path):
    # bench's warm-up runs ONNX Runtime where a signal can stop it, and its one line is all that is printed.
    model = tmp_path / "endless.onnx"
    _endless_loop_model(model)
    proc = subprocess.Popen([sys.executable, "-m", "saturate", "bench", str(model), "--no-reference", "--runs", "1",
                             "--quiet"], stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        time.sleep(8)       # import, compile (the Loop stays in the interpreter) and into the warm-up
        assert proc.poll() is None, proc.stderr.read()
        stderr = _signal_and_wait(proc, signal.SIGINT)
    finally:
        proc.kill()
    assert proc.returncode == 130, (proc.returncode, stderr)
    assert stderr.splitlines() == ["saturate: interrupted"], stderr
