"""Batch optimization: many models, parallel processes or Ray, one failure never stops the rest."""

from __future__ import annotations

import json

import numpy as np
import pytest

from saturate import batch
from saturate.cli import main
from saturate.frontend import examples, load_graph, save_graph
from saturate.interp import run_graph


def _models(folder, names=("vgg", "mobilenet", "mlp")):
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        save_graph(examples.build(name), str(folder / f"{name}.onnx"))
    return folder


def _same_outputs(source, output):
    want, got = load_graph(source), load_graph(output)
    feeds = examples.random_inputs(want)
    for name, value in run_graph(want, feeds).items():
        np.testing.assert_allclose(run_graph(got, feeds)[name], value, rtol=1e-4, atol=1e-5)


def test_a_directory_is_optimized_and_one_broken_model_stops_nothing(tmp_path, capsys):
    models = _models(tmp_path / "zoo")
    (models / "broken.onnx").write_bytes(b"not a model")
    out = tmp_path / "out"
    assert main(["optimize", str(models), "-o", str(out), "--jobs", "1"]) == 2
    summary = json.loads((out / "summary.json").read_text())
    results = {r["source"].rsplit("/", 1)[-1]: r for r in summary["results"]}
    assert summary["models"] == 4 and summary["failed"] == 1
    assert not results["broken.onnx"]["ok"] and "not an ONNX model" in results["broken.onnx"]["error"]
    for name in ("vgg.onnx", "mobilenet.onnx", "mlp.onnx"):
        assert results[name]["ok"] and results[name]["nodes_after"] <= results[name]["nodes_before"]
        assert 0 < results[name]["cpu_seconds"], "the CPU a model took, beside its wall time"
        _same_outputs(str(models / name), str(out / name))
    printed = capsys.readouterr()
    assert "3 of 4 models optimized" in printed.out and "broken.onnx" in printed.err


def test_file_names_with_line_breaks_and_escapes_print_escaped_and_keep_their_error(tmp_path, capsys):
    # A row of the table was split by a line break and wrote a terminal escape as it is; a failed
    # model's error was cut at the carriage return in its path, leaving only "…/bad".
    zoo = tmp_path / "zoo"
    zoo.mkdir()
    save_graph(examples.build("mlp"), str(zoo / "a\nb\x1b[31m.onnx"))
    (zoo / "bad\rx.onnx").write_bytes(b"not a model")
    out = tmp_path / "out"
    assert main(["optimize", str(zoo), "-o", str(out), "--jobs", "1", "--check", "0"]) == 2
    printed = capsys.readouterr()
    rows = printed.out.splitlines()
    assert len(rows) == 4 and "a\\nb\\x1b[31m.onnx" in rows[1] and "\x1b" not in printed.out
    err = printed.err.splitlines()
    assert len(err) == 1 and "bad\\rx.onnx: not an ONNX model" in err[0], err
    (result,) = [r for r in json.loads((out / "summary.json").read_text())["results"] if not r["ok"]]
    assert result["error"].endswith("bad\rx.onnx: not an ONNX model (protobuf decoding failed)")


def test_globs_and_example_names_in_parallel_processes(tmp_path):
    models = _models(tmp_path / "zoo", ("vgg", "mlp"))
    out = tmp_path / "out"
    assert main(["optimize", str(models / "*.onnx"), "example:mobilenet", "-o", str(out), "--jobs", "2",
                 "--quiet"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["mlp.onnx", "mobilenet.onnx", "summary.json", "vgg.onnx"]
    _same_outputs("example:mobilenet", str(out / "mobilenet.onnx"))


def test_models_that_share_a_file_name_are_told_apart_by_their_folder(tmp_path):
    jobs = batch.plan_jobs([str(tmp_path / "a" / "m.onnx"), str(tmp_path / "b" / "m.onnx")], tmp_path / "out")
    assert [j.output.rsplit("/", 1)[-1] for j in jobs] == ["a__m.onnx", "b__m.onnx"]


@pytest.mark.parametrize("argv,words", [
    (["nothing-here/*.onnx"], "no such file, directory or matching models"),
    (["example:vgg", "example:mlp", "--report", "r.json"], "--report takes one model"),
    (["example:vgg", "example:mlp", "--jobs", "0"], "--jobs must be at least 1"),
])
def test_batch_mistakes_are_one_line_errors(tmp_path, capsys, monkeypatch, argv, words):
    monkeypatch.chdir(tmp_path)
    assert main(["optimize", *argv, "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err


@pytest.mark.slow
def test_a_batch_runs_on_a_local_ray_cluster(tmp_path):
    pytest.importorskip("ray", reason="Ray is the optional extra saturate[cluster]")
    import ray

    models = _models(tmp_path / "zoo", ("vgg", "mlp"))
    out = tmp_path / "out"
    try:
        assert main(["optimize", str(models), "-o", str(out), "--cluster", "local", "--quiet"]) == 0
    finally:
        ray.shutdown()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["failed"] == 0 and summary["models"] == 2
    _same_outputs(str(models / "vgg.onnx"), str(out / "vgg.onnx"))


def test_corpus_globs_pick_corpus_models():
    picked = batch.expand_models(["corpus:resnet18-ts*", "example:vgg"])
    assert picked == ["corpus:resnet18-ts", "corpus:resnet18-ts-dyn", "example:vgg"]
    assert [j.output for j in batch.plan_jobs(picked[:1], "out")] == ["out/resnet18-ts.onnx"]
    with pytest.raises(batch.SaturateError, match="no corpus model matches"):
        batch.expand_models(["corpus:nothing*"])


def test_the_largest_models_start_first(tmp_path):
    """Started last, a large model would leave the other workers idle while it finishes alone."""
    models = _models(tmp_path / "zoo", ("vgg", "mlp"))
    picked = ["example:mobilenet", str(models / "mlp.onnx"), "corpus:squeezenet1_1-ts", str(models / "vgg.onnx"),
              "corpus:vgg11_bn-ts"]
    jobs = batch.plan_jobs(picked, tmp_path / "out")
    order = [jobs[k].source for k in batch.largest_first(jobs)]
    assert order[0] == "corpus:vgg11_bn-ts" and order[-1] == "example:mobilenet"
    assert order.index(str(models / "vgg.onnx")) < order.index(str(models / "mlp.onnx"))
    assert batch.estimated_work("corpus:squeezenet1_1-ts") > (models / "mlp.onnx").stat().st_size


def test_a_stopped_batch_counts_the_outcomes_its_workers_already_sent():
    """Stopped (SIGINT, SIGTERM) before it read them, the batch still records the outcomes waiting on its
    workers' pipes: their models were written. A worker with nothing sent, or a line cut short, adds none."""
    import os
    from dataclasses import asdict
    from types import SimpleNamespace

    sent = batch.Outcome("a.onnx", "out/a.onnx", True, 1.5, 10, 8, "saturated")
    pipes = [os.pipe() for _ in range(3)]
    os.write(pipes[0][1], json.dumps(asdict(sent)).encode() + b"\n")
    os.write(pipes[2][1], b'{"source": "c.onnx", "out')  # the rest never came
    workers = []
    for k, (r, w) in enumerate(pipes):
        os.close(w)
        worker = batch._Worker.__new__(batch._Worker)
        worker.proc = SimpleNamespace(stdout=os.fdopen(r, "rb"))
        worker.job, worker._partial = k, b""
        workers.append(worker)
    outcomes, seen = {}, []
    try:
        batch._collect_sent(workers[:1], outcomes, seen.append)
        assert outcomes == {0: sent} and seen == [sent] and workers[0].job is None
        # an empty pipe (its writer gone) and a partial line record nothing
        batch._collect_sent(workers[1:], outcomes, seen.append)
        assert list(outcomes) == [0] and workers[1].job == 1 and workers[2].job == 2
    finally:
        for worker in workers:
            worker.proc.stdout.close()
