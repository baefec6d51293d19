"""Progress: shown on a terminal only, never when piped, silenced by --quiet on every command
that can show it."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time

import pytest

from saturate import progress
from saturate.cli import main

BN_RULES = os.path.join(os.path.dirname(__file__), "..", "rules", "batchnorm.rules")


class _Terminal(io.StringIO):
    """A stderr that says it is a terminal, and keeps what was written to it."""

    def isatty(self) -> bool:
        return True


@pytest.fixture
def fake_terminal(monkeypatch):
    """A function that makes stderr a terminal, with progress shown at once (a test run is shorter
    than DELAY). It is called in the test's body: pytest sets its own stderr back at the start of
    the call, over anything a fixture put there."""
    def make() -> _Terminal:
        monkeypatch.setattr(progress, "DELAY", 0.0)
        term = _Terminal()
        monkeypatch.setattr(sys, "stderr", term)
        return term
    return make


def test_optimize_shows_each_iteration_and_the_egraph_size_on_a_terminal(fake_terminal, tmp_path):
    terminal = fake_terminal()
    assert main(["optimize", "example:vgg", "-o", str(tmp_path / "v.onnx"), "--html", str(tmp_path / "r.html")]) == 0
    shown = terminal.getvalue()
    assert "saturate, iteration 1, e-graph " in shown and " nodes [" in shown
    assert all(f"\r{stage} [" in shown for stage in ("load", "export", "html"))
    assert shown.rstrip(" ").endswith("\r"), "the progress line is erased when the run ends"


def test_quiet_silences_optimize_and_a_pipe_shows_nothing(fake_terminal, tmp_path, monkeypatch):
    terminal = fake_terminal()
    assert main(["optimize", "example:vgg", "-o", str(tmp_path / "v.onnx"), "--quiet"]) == 0
    assert terminal.getvalue() == ""
    piped = io.StringIO()  # isatty() is False, as on a pipe or a file
    monkeypatch.setattr(sys, "stderr", piped)
    assert main(["optimize", "example:vgg", "-o", str(tmp_path / "v.onnx")]) == 0
    assert piped.getvalue() == ""


def test_trace_prints_its_own_lines_instead_of_the_progress_line(fake_terminal, tmp_path):
    terminal = fake_terminal()
    assert main(["optimize", "example:vgg", "-o", str(tmp_path / "v.onnx"), "--trace"]) == 0
    shown = terminal.getvalue()
    assert "  iteration   1  e-nodes" in shown and "\r" not in shown


def test_a_batch_counts_models_on_a_terminal_and_quiet_silences_it(fake_terminal, tmp_path):
    terminal = fake_terminal()
    assert main(["optimize", "example:vgg", "example:mlp", "-o", str(tmp_path / "out"), "--jobs", "1"]) == 0
    assert "optimize: 100%" in terminal.getvalue() and "2/2" in terminal.getvalue()
    terminal.seek(0)
    terminal.truncate()
    assert main(["optimize", "example:vgg", "example:mlp", "-o", str(tmp_path / "out"), "--jobs", "1",
                 "--quiet"]) == 0
    assert terminal.getvalue() == ""


def test_check_counts_rules_on_stderr_and_keeps_its_lines_on_stdout(fake_terminal, capsys):
    terminal = fake_terminal()
    assert main(["check", BN_RULES, "--examples", "5", "--seed", "0"]) == 0
    assert "check: 100%" in terminal.getvalue() and "2/2" in terminal.getvalue()
    out = capsys.readouterr().out
    assert out.startswith("PASS  batchnorm") and "2 of 2 rules pass" in out and "check:" not in out
    terminal.seek(0)
    terminal.truncate()
    assert main(["check", BN_RULES, "--examples", "5", "--seed", "0", "--quiet"]) == 0
    assert terminal.getvalue() == ""


def test_a_stage_that_takes_long_keeps_its_elapsed_time_moving(fake_terminal, monkeypatch):
    terminal = fake_terminal()
    monkeypatch.setattr(progress, "TICK", 0.05)
    with progress.status(False, "compile") as s:
        time.sleep(0.3)  # one long step: nothing is counted, the ticker redraws
        s.stage("export")
    lines = terminal.getvalue().split("\r")
    assert sum(line.startswith("compile [") for line in lines) >= 2
    assert any(line.startswith("export [") for line in lines)


def test_nothing_shows_before_the_delay(monkeypatch):
    term = _Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    with progress.status(False, "load") as s:  # the real DELAY: a short run prints nothing
        s.stage("saturate")
        s.step(1, "iteration 1")
        s.write("a line of output", file=io.StringIO())
    assert term.getvalue() == ""


@pytest.mark.parametrize("command", [["compile", "example:mlp", "-o", "{tmp}/c"],
                                     ["bench", "example:mlp", "--runs", "2", "--no-reference"]])
@pytest.mark.compiler
def test_compile_and_bench_name_their_stages_and_take_quiet(fake_terminal, tmp_path, capsys, command):
    terminal = fake_terminal()
    argv = [a.replace("{tmp}", str(tmp_path)) for a in command]
    assert main(argv) == 0
    shown = terminal.getvalue()
    assert "load [" in shown and "compile [" in shown
    if argv[0] == "bench":
        assert "warm-up [" in shown and "run 2/2 [" in shown
    assert "[0" not in capsys.readouterr().out, "progress goes to stderr, never into the command's output"
    terminal.seek(0)
    terminal.truncate()
    assert main(argv + ["--quiet"]) == 0
    assert terminal.getvalue() == ""


# The real thing, end to end: the CLI in a child process on a pseudo-terminal, and on a pipe.
_CHILD = ("import sys; import saturate.progress as p; p.DELAY = 0.0; from saturate.cli import main; "
          "sys.exit(main(sys.argv[1:]))")


def _on_a_terminal(argv: list[str]) -> str:
    """Everything the CLI writes to a pseudo-terminal (stdout and stderr both)."""
    import pty

    pid, fd = pty.fork()
    if pid == 0:  # the child: stdin, stdout and stderr are the terminal
        os.execv(sys.executable, [sys.executable, "-c", _CHILD, *argv])
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    _, code = os.waitpid(pid, 0)
    os.close(fd)
    assert os.waitstatus_to_exitcode(code) == 0, b"".join(chunks).decode(errors="replace")
    return b"".join(chunks).decode(errors="replace")


@pytest.mark.slow  # two fresh interpreters, about 5 s
def test_the_cli_on_a_pseudo_terminal_shows_progress_and_on_a_pipe_does_not(tmp_path):
    argv = ["optimize", "example:vgg", "-o", str(tmp_path / "v.onnx")]
    assert "saturate, iteration 1, e-graph" in _on_a_terminal(argv)
    piped = subprocess.run([sys.executable, "-c", _CHILD, *argv], capture_output=True, text=True, check=True)
    assert "iteration" not in piped.stderr and "\r" not in piped.stderr and piped.stdout.startswith("wrote ")


def test_the_library_prints_nothing_and_calls_back_after_each_iteration(capsys):
    import saturate
    from saturate.frontend import examples

    calls = []
    _, report = saturate.optimize(examples.build("vgg"), progress=lambda *args: calls.append(args))
    assert [c[0] for c in calls] == list(range(1, report.run.iterations + 1))
    assert [c[1] for c in calls] == report.run.sizes[1:] and all(isinstance(c[3], dict) for c in calls)
    assert capsys.readouterr() == ("", "")


@pytest.mark.parametrize("command,stages", [
    (["partition", "example:vgg", "--target", "fused", "-o", "{tmp}/p.onnx"],
     ("load", "saturate, iteration 1", "export")),
    (["show", "example:chain-20", "--svg", "{tmp}/c.svg"], ("load", "draw")),
])
def test_partition_and_show_name_their_stages_and_take_quiet(fake_terminal, tmp_path, command, stages):
    terminal = fake_terminal()
    argv = [a.replace("{tmp}", str(tmp_path)) for a in command]
    assert main(argv) == 0
    assert all(f"\r{stage}" in terminal.getvalue() for stage in stages)
    terminal.seek(0)
    terminal.truncate()
    assert main(argv + ["--quiet"]) == 0
    assert terminal.getvalue() == ""
