"""Files and rules as an attacker writes them: only regular files of a bounded size are read
(targets here; rules files and includes in test_dsl.py), and a constant expression is refused
before it allocates more than --max-memory."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from saturate.cli import main
from saturate.core.errors import SaturateError, SourceError
from saturate.lang.builtins import CONST_FUNCS
from saturate.targets.target import load_target


# ---- the helper ------------------------------------------------------------------------------------

def test_read_regular_reads_a_regular_file_and_bounds_what_it_reads(tmp_path):
    from saturate.core.inputs import RefusedFile, open_regular, read_regular

    path = tmp_path / "f.bin"
    path.write_bytes(b"abc")
    assert read_regular(path, 3, "model") == b"abc"
    with open_regular(path, 3, "model") as f:
        assert f.read() == b"abc"
    with pytest.raises(RefusedFile, match=r"^model '.*f.bin': 3 bytes, over the 2 bytes a model may take$"):
        read_regular(path, 2, "model")
    # /proc files say they hold 0 bytes: the read itself is bounded.
    with pytest.raises(RefusedFile, match="over the 4 bytes a model may take"):
        read_regular("/proc/self/environ", 4, "model")
    with pytest.raises(RefusedFile, match="No such file or directory"):
        read_regular(tmp_path / "missing", 10, "model")


@pytest.mark.timeout(20)
def test_open_regular_refuses_a_fifo_without_blocking(tmp_path):
    from saturate.core.inputs import RefusedFile, open_regular

    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(RefusedFile) as err:
        open_regular(tmp_path / "pipe", 10, "model")
    assert str(err.value) == f"model '{tmp_path / 'pipe'}': not a regular file (a FIFO)"
    assert err.value.reason == "not a regular file (a FIFO)"


# ---- target files ----------------------------------------------------------------------------------

@pytest.mark.timeout(20)
@pytest.mark.parametrize("kind, what", [("fifo", "a FIFO"), ("device", "a character device")])
def test_a_target_that_is_not_a_regular_file_is_refused_in_one_line(tmp_path, kind, what):
    if kind == "fifo":
        special = tmp_path / "pipe.target"
        os.mkfifo(special)
    else:
        special = Path("/dev/zero")
    with pytest.raises(SaturateError) as err:
        load_target(str(special))
    assert str(err.value) == f"target file '{special}': not a regular file ({what})"


def test_a_huge_target_is_refused_by_its_size(tmp_path):
    huge = tmp_path / "huge.target"
    with open(huge, "wb") as f:      # sparse: takes no disk
        f.truncate((4 << 20) + 1)    # the limit, MAX_TARGET_BYTES, and a byte
    with pytest.raises(SaturateError, match="4.0 MiB, over the 4.0 MiB a target file may take"):
        load_target(str(huge))


def test_a_target_that_is_not_a_target_file_shows_none_of_its_text(tmp_path, capsys):
    secret = tmp_path / "secret.txt"
    secret.write_text("API_TOKEN=hunter2\n")
    with pytest.raises(SourceError) as err:
        load_target(str(secret))
    assert (err.value.line, err.value.col) == (1, 1) and "hunter2" not in str(err.value)
    assert main(["optimize", "example:mlp", "-o", str(tmp_path / "o.onnx"), "--target", str(secret)]) == 2
    out = capsys.readouterr().err
    assert "hunter2" not in out and "API_TOKEN" not in out and out.count("\n") == 1
    assert not (tmp_path / "o.onnx").exists()
    # A .target file is the user's own: its errors quote the line.
    (tmp_path / "mine.target").write_text("API_TOKEN=hunter2\n")
    with pytest.raises(SourceError, match="API_TOKEN=hunter2"):
        load_target(str(tmp_path / "mine.target"))


# ---- constant expressions --------------------------------------------------------------------------

@pytest.mark.parametrize("fn, args", [
    ("constant_of_shape", ((1 << 20, 1 << 20), np.float32(0))),
    ("expand", (np.ones((1, 1), np.float32), (1 << 20, 1 << 20))),
    ("add", (np.ones((1 << 20, 1), np.float32), np.ones((1, 1 << 20), np.float32))),
    ("matmul", (np.ones((1 << 20, 1), np.float32), np.ones((1, 1 << 20), np.float32))),
    ("range", (np.int64(0), np.int64(1 << 40), np.int64(1))),
    ("broadcast_vec", (np.float32(1), 1 << 40)),
])
def test_a_constant_expression_over_the_memory_limit_is_refused_before_it_allocates(fn, args):
    # Each result takes terabytes: numpy would fail with a MemoryError, or take the machine.
    with pytest.raises(SaturateError, match=r"^constant expression .+ would take [0-9.]+ TiB, over the memory limit"):
        CONST_FUNCS[fn].impl(*args)


def test_a_rule_building_a_constant_over_max_memory_fails_in_one_line(tmp_path, capsys, monkeypatch):
    from saturate.core import limits

    monkeypatch.delenv(limits.ENV, raising=False)   # --max-memory sets it: restored after the test
    model = tmp_path / "m.sat"
    model.write_text("graph g opset 17\n  input %x: float32[1024, 1024]\n  %y = Relu(%x)\n  output %y\n")
    rules = tmp_path / "big.rules"
    rules.write_text("ruleset big level 1\n"
                     "rule big Relu(x) => Add(x, constant_of_shape([1024, 1024], 0.0))\n"
                     "rule add-zero Add(x, c:const) => x if zeros(c)\n")
    out = tmp_path / "out.sat"
    args = ["optimize", str(model), "-o", str(out), "--no-std", "--rules", str(rules)]
    assert main([*args, "--max-memory", "1M"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "constant expression constant_of_shape" in err
    # add-zero's guard asks for the constant first: `big` is named, which builds it.
    assert "over the memory limit of 1.0 MiB" in err and "big.rules:2:28: rule 'big'" in err
    assert not out.exists()
    assert main([*args, "--max-memory", "64M", "--check", "0"]) == 0   # `big` drops the Relu: no check
