"""Files as an attacker writes them: only regular files of a bounded size are read (targets
here; rules files and includes in test_dsl.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from saturate.cli import main
from saturate.core.errors import SaturateError, SourceError
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
