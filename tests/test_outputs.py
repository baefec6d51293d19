"""Every output is distinct from every input and from the other outputs (by resolved path and by
inode); a command's outputs are checked before the work and renamed into place together, so an
error leaves none of them changed; a stale temp file of ours is swept by the next write there."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest

from saturate.cli import main
from saturate.core import fileio
from saturate.frontend import examples, save_graph
from saturate.frontend.onnx_io import export_model

RULES = "ruleset mine level 1\n"


def _one_error_line(capsys, *words: str) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("saturate: error: ") and all(w in err for w in words), err
    return err


def _snapshot(folder: Path) -> dict[str, bytes]:
    """Every file in the folder, hidden ones (temp files) too, with its bytes."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture
def files(tmp_path, monkeypatch):
    """A model, a rules file, a target file and an input array in the working directory."""
    monkeypatch.chdir(tmp_path)
    save_graph(examples.build("mlp"), "m.onnx")
    Path("my.rules").write_text(RULES)
    Path("my.target").write_text((Path(fileio.__file__).parents[2] / "rules" / "targets" / "cpu.target").read_text())
    np.save("x.npy", np.ones((2, 64), np.float32))
    # A model whose weights live in an external file beside it.
    # Models whose weights live in a file beside them.
    for name, location in (("ext.onnx", "weights.bin"), ("extp.onnx", "weights.onnx")):
        onnx.save_model(export_model(examples.build("mlp")), name, save_as_external_data=True,
                        all_tensors_to_one_file=True, location=location, size_threshold=64)
    os.symlink("x.npy", "link.npy")
    os.link("x.npy", "hard.npy")
    os.mkdir("out")
    Path("out/summary.json").write_text(RULES)
    return tmp_path


@pytest.mark.parametrize("argv,words", [
    (["optimize", "m.onnx", "--rules", "my.rules", "-o", "my.rules"], ["my.rules", "is the input"]),
    (["optimize", "m.onnx", "--rules", ".", "-o", "o.onnx", "--report", "./my.rules"], ["is the input 'my.rules'"]),
    (["optimize", "m.onnx", "--target", "my.target", "-o", "my.target"], ["is the input 'my.target'"]),
    (["optimize", "m.onnx", "--target", "my.target", "-o", "o.onnx", "--html", "my.target"], ["is the input"]),
    (["optimize", "ext.onnx", "-o", "o.onnx", "--report", "weights.bin"], ["weights.bin", "is the input"]),
    (["optimize", "m.onnx", "-o", "o.onnx", "--report", "o.onnx"], ["--report is the same file as -o"]),
    (["optimize", "m.onnx", "-o", "o.onnx", "--html", "o.onnx.data"], ["--html is the same file as -o's external"]),
    (["partition", "extp.onnx", "-o", "weights.onnx"], ["weights.onnx", "is the input"]),
    (["run", "m.onnx", "--input", "x.npy", "-o", "x.npy"], ["x.npy", "is the input"]),
    (["run", "m.onnx", "--input", "x.npy", "-o", "./link.npy"], ["is the input 'x.npy'"]),
    (["run", "m.onnx", "--input", "x.npy", "-o", "hard.npy"], ["is the input 'x.npy'"]),
    (["show", "ext.onnx", "--svg", "weights.bin"], ["is the input"]),
    (["optimize", "m.onnx", "ext.onnx", "--rules", "out/summary.json", "-o", "out"], ["summary.json", "is the input"]),
])
def test_an_output_that_is_an_input_or_another_output_is_refused_and_nothing_changes(files, capsys, argv, words):
    before = _snapshot(files), _snapshot(files / "out")
    assert main(argv) == 2
    _one_error_line(capsys, *words)
    assert (_snapshot(files), _snapshot(files / "out")) == before


def test_an_output_that_is_an_included_rules_file_is_refused_and_nothing_changes(files, capsys):
    """An include is found only when the rules are read: checked again before the renames."""
    Path("a.rules").write_text('include "b.rules"\n')
    Path("b.rules").write_text(RULES + "rule my-relu-twice Relu(Relu(x)) => Relu(x)\n")
    before = _snapshot(files)
    assert main(["optimize", "m.onnx", "--rules", "a.rules", "-o", "o.onnx", "--report", "b.rules"]) == 2
    _one_error_line(capsys, "b.rules", "is the input")
    assert _snapshot(files) == before


def test_an_output_that_is_a_fifo_is_refused_not_replaced(files, capsys):
    """A rename would replace the FIFO (or, run as root, /dev/null itself: not tried here, where a
    regression would break the machine) with a regular file."""
    os.mkfifo("pipe.npy")
    assert main(["run", "m.onnx", "-o", "pipe.npy"]) == 2
    _one_error_line(capsys, "pipe.npy", "not a regular file")
    assert Path("pipe.npy").is_fifo()


def test_an_unwritable_report_is_refused_before_the_model_is_written(files, capsys):
    for flag in ("--report", "--html"):
        assert main(["optimize", "m.onnx", "-o", "o.onnx", flag, "/proc/nowhere.json"]) == 2
        _one_error_line(capsys, "/proc/nowhere.json", "cannot write")
        assert not Path("o.onnx").exists()


@pytest.mark.parametrize("failure", [RuntimeError, KeyboardInterrupt])
def test_a_failure_after_the_model_is_written_leaves_every_output_as_it_was(files, monkeypatch, failure):
    """-o, --report and --html are renamed into place together at the end: the page failing last
    (a bug, a full disk, a Ctrl-C) keeps the earlier model and report, and leaves no temp file."""
    import saturate.report.html as html

    Path("o.onnx").write_bytes(b"the earlier model")
    Path("r.json").write_text("the earlier report")

    def fail(path, *args, **kwargs):
        fileio.write_atomic(path, lambda f: f.write(b"<html>"))
        raise failure("disk full")

    monkeypatch.setattr(html, "write_html", fail)
    before = _snapshot(files)
    argv = ["optimize", "m.onnx", "-o", "o.onnx", "--report", "r.json", "--html", "o.html"]
    if failure is KeyboardInterrupt:
        assert main(argv) == 130
    else:
        with pytest.raises(failure):
            main(argv)
    assert _snapshot(files) == before


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_stale_temp_files_of_ours_are_swept_on_the_next_write_and_nothing_else(files):
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        dead = _dead_pid()
        stale = {f".o.onnx.{dead}.abcd1234.tmp", f".old.onnx.{live.pid}.zzzz_999.tmp"}
        kept = {f".o.onnx.{live.pid}.abcd1234.tmp",  # a concurrent writer's, being written
                ".notes.tmp", ".o.onnx.abcd1234.tmp", f"o.onnx.{dead}.abcd1234.tmp", f".x.{dead}.ab.tmp"}
        for name in stale | kept:
            Path(name).write_bytes(b"partial")
        old = time.time() - 2 * fileio.STALE_SECONDS  # untouched that long: nobody is writing it
        os.utime(f".old.onnx.{live.pid}.zzzz_999.tmp", (old, old))
        os.mkdir(f".d.onnx.{dead}.abcd1234.tmp")  # not a regular file: not ours
        kept.add(f".d.onnx.{dead}.abcd1234.tmp")
        assert main(["optimize", "m.onnx", "-o", "other.onnx", "--quiet"]) == 0
        assert {p for p in os.listdir() if p.endswith(".tmp")} == kept
    finally:
        live.kill()
        live.wait()


def test_model_files_names_external_data_and_not_built_in_models(files):
    assert fileio.model_files("m.onnx") == ["m.onnx"]
    assert fileio.model_files("ext.onnx") == ["ext.onnx", str(files / "weights.bin")]
    assert fileio.model_files("example:mlp") == [] and fileio.model_files("missing.onnx") == []
    Path("bad.onnx").write_bytes(b"\x0a\x08location\x12 not a model")
    assert fileio.model_files("bad.onnx") == ["bad.onnx"]
    # Tensors of Constant nodes, inside an If's branches, stored apart too.
    from onnx import TensorProto, helper, numpy_helper

    value = numpy_helper.from_array(np.arange(100, dtype=np.float32), "c")
    branch = helper.make_graph([helper.make_node("Constant", [], ["y"], value=value)], "b", [],
                               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [100])])
    graph = helper.make_graph([helper.make_node("If", ["x"], ["y"], then_branch=branch, else_branch=branch)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [100])])
    model = helper.make_model(graph)
    onnx.external_data_helper.convert_model_to_external_data(model, location="deep.bin", size_threshold=0,
                                                              convert_attribute=True)
    for tensor in onnx.external_data_helper._get_all_tensors(model):
        if tensor.data_location == TensorProto.EXTERNAL:
            tensor.external_data[0].value = f"deep{tensor.name}.bin"  # one file per tensor
    Path("if.onnx").write_bytes(model.SerializeToString())
    assert fileio.model_files("if.onnx")[1:] == [str(files / "deepc.bin")]
