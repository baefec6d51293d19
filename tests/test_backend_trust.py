"""The C backend treats every model file and cache entry as written by an attacker: a model's names never
become code, cached builds are used only when their files match the digests recorded at build time, a
signal during a compile leaves no compiler running and no temp files, and oversized or unwritable
things fail in one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from backend_util import TOL, feed_for, make, own_cache, rel_error
from saturate.core.errors import SaturateError
from saturate.core.ir import Node

pytestmark = pytest.mark.compiler

# A name that, written as it is into a C comment, ends it and defines a function the loader runs: the
# marker file it creates is the test's witness that model text ran as code.
MARKER = "saturate-trust-marker"


def payload(directory: Path) -> str:
    return ('*/ extern int system(const char *); __attribute__((constructor)) static void satx_f(void) '
            '{ system("touch \'' + str(directory / MARKER) + '\'"); } /*')


# Pieces hostile names are made of: comment and preprocessor syntax, quotes, escapes, a trigraph and a
# line splice, format directives, non-ASCII text, C keywords and identifiers the emitter itself makes.
PIECES = ["*/", "/*", "//", "\n", "\r", "\\", "\\\n", "#", "#include <stdio.h>", "#define float int", '"', "'",
          "??/", "??=", "%s%n", "%", "é", "名前", "\U0001F600", "\u202e", "int", "return", "static", "v12", "WT",
          "pw_0", "IN", "sat_run", "main", " ", "x", "_", "%2A%2F"]
hostile = st.lists(st.sampled_from(PIECES), min_size=1, max_size=6).map("".join)


def hostile_graph(names: list[str], graph_name: str):
    """x, y -> Relu, Add with a constant, Mul -> two outputs, every value, node and the graph named from
    `names` (made distinct by a suffix where two draws are equal)."""
    seen: set[str] = set()
    unique = []
    for k, name in enumerate(names):
        while name in seen or not name:
            name = f"{name}{k}"
        seen.add(name)
        unique.append(name)
    x, y, c, r, s, out1, out2 = unique[:7]
    nodes = [Node("Relu", [x], [r], name=unique[7]), Node("Add", [r, c], [s], name=unique[8]),
             Node("Mul", [s, y], [out1], name=unique[9]), Node("Sigmoid", [s], [out2], name=unique[9] + "*/")]
    rng = np.random.default_rng(0)
    g = make(nodes, {x: (2, 3), y: (2, 3)}, {c: rng.standard_normal(3).astype(np.float32)}, outputs=[out1, out2])
    g.name = graph_name
    return g


def check_against_ort(model, graph) -> None:
    from saturate.backend.bench import ort_session

    feed = feed_for(graph)
    got = model(feed)
    sess = ort_session(graph, 1)
    want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feed)))
    assert set(got) == set(want) == set(graph.outputs)
    for k, v in want.items():
        assert got[k].shape == v.shape and rel_error(got[k], np.asarray(v, np.float64)) <= TOL, k


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=st.lists(hostile, min_size=10, max_size=10), graph_name=hostile)
@example(names=["*/", "/*", "??/", "\\\n", "#", "v12", "int", "é" * 10_000, "%", "\n"], graph_name="*/ /*")
@example(names=["a*b", "a%2Ab", "a_b", "a b", "a?b", "a\\b", "a\nb", "pw_0", "WT", "main"], graph_name="??/\n#error x")
def test_hostile_names_never_become_code(tmp_path, names, graph_name):
    """Names of the graph, its nodes, values, inputs and outputs reach model.c and model.h only escaped:
    the build compiles, nothing of them runs, model.h compiles in a C program, the library and the loaded
    directory give every name back as it is, and the outputs match ONNX Runtime's."""
    from saturate.backend import compile_graph, load
    from saturate.backend.build import compiler

    out = tmp_path / "m"
    graph = hostile_graph(names + [payload(tmp_path)], payload(tmp_path) + graph_name)
    model = compile_graph(graph, out_dir=out)
    assert not (tmp_path / MARKER).exists()
    check_against_ort(model, graph)
    loaded = load(out)
    assert not (tmp_path / MARKER).exists()
    assert [n for n, _ in loaded.inputs] == [n for n in graph.inputs]
    assert [n for n, _ in loaded.outputs] == list(graph.outputs)
    check_against_ort(loaded, graph)
    (tmp_path / "main.c").write_text('#include "model.h"\nint main(void) { return sat_num_inputs(); }\n')
    proc = subprocess.run([compiler(), "-fsyntax-only", "-Wall", "-Werror", "-Wcomment", "-Wtrigraphs", "-trigraphs",
                           f"-I{out}", str(tmp_path / "main.c")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for name in ("model.c", "model.h"):
        text = (out / name).read_text(encoding="ascii")
        assert "*/ __attribute__" not in text and "??/" not in text and "\\\n" not in text


@given(st.text(max_size=200))
def test_escaped_comment_text_cannot_end_a_comment_or_splice_a_line(text):
    from saturate.backend.emit import comment_text

    for limit in (5, 80, 10_000):
        out = f"/* {comment_text(text, limit)} */"
        assert out.isascii() and out.isprintable()
        assert out.count("*/") == 1 and out.count("/*") == 1 and "??" not in out and "\\" not in out


def test_the_issue_payload_in_a_graph_name_does_not_run_during_compile(tmp_path):
    """The graph name of issue 26, in an ONNX file compiled by the command: exit 0, no marker file."""
    import onnx
    from onnx import TensorProto, helper

    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in ("x", "y")]
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], payload(tmp_path), vi[:1], vi[1:])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "evil.onnx")
    proc = subprocess.run([sys.executable, "-m", "saturate", "compile", str(tmp_path / "evil.onnx"), "-o",
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not (tmp_path / MARKER).exists()


@pytest.mark.parametrize("bad, why", [("in\0put", "NUL character"), ("\udc80", "not valid Unicode")])
def test_an_input_name_the_c_api_cannot_give_back_is_a_one_line_error(bad, why):
    from saturate.backend.capi import api_source
    from saturate.backend.emit import emit

    g = make([Node("Relu", [bad], ["y"])], {bad: (2,)})
    with pytest.raises(SaturateError, match=why):
        api_source(emit(g))


def small_graph(scale: float = 2.0):
    rng = np.random.default_rng(3)
    return make([Node("Mul", ["x", "c"], ["m"]), Node("Relu", ["m"], ["y"])], {"x": (4, 8)},
                {"c": (scale * rng.standard_normal(8)).astype(np.float32)})


def corrupt(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "flip":  # the right size, other bytes
        path.write_bytes(bytes(b ^ 0x5A for b in data))
    elif how == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "digests":  # a build.json without the digests (as builds before them wrote)
        facts = json.loads(data)
        del facts["files"]
        path.write_text(json.dumps(facts))


def expected(graph, feed):
    from saturate.interp.interpreter import run_graph

    return run_graph(graph, feed)


def saturate_cli(*args, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "saturate", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, **kw)


@pytest.mark.parametrize("name, how", [("weights.bin", "flip"), ("weights.bin", "truncate"), ("model.so", "truncate"),
                                       ("module", "empty"), ("build.json", "digests")])
def test_a_cache_entry_that_does_not_match_its_digests_is_rebuilt(tmp_path, name, how):
    """A cached build whose files changed since it was built (same-size weights of other bytes, truncated
    files, no digests) is rebuilt with one line saying so: exit 0, a good -o with the right outputs, and
    the entry is good again."""
    from saturate.backend.build import EXTENSION
    from saturate.frontend import save_graph

    name = EXTENSION if name == "module" else name
    graph, out = small_graph(), tmp_path / "out"
    save_graph(graph, str(tmp_path / "m.onnx"))
    feed = feed_for(graph)
    np.save(tmp_path / "x.npy", feed["x"])
    cache = own_cache(tmp_path)
    env = dict(os.environ, SATURATE_CACHE=str(cache))
    assert saturate_cli("compile", tmp_path / "m.onnx", "-o", out, env=env).returncode == 0
    entry = cache / (out / "build.key").read_text()
    good = (entry / "weights.bin").read_bytes()
    corrupt(entry / name, how)
    proc = saturate_cli("compile", tmp_path / "m.onnx", "-o", out, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stderr.startswith(f"saturate: cache entry {entry.name} did not match its digests (") \
        and proc.stderr.endswith("; rebuilding\n") and proc.stderr.count("\n") == 1, proc.stderr
    assert (out / "weights.bin").read_bytes() == (entry / "weights.bin").read_bytes() == good
    assert saturate_cli("run", out, "-i", tmp_path / "x.npy", "-o", tmp_path / "y.npy").returncode == 0
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), expected(graph, feed)["y"], rtol=1e-5, atol=1e-6)
    proc = saturate_cli("compile", tmp_path / "m.onnx", "-o", out, env=env)  # the rebuilt entry is used as it is
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


def test_a_compiled_directory_whose_files_changed_is_a_one_line_error(tmp_path):
    """`saturate run DIR` of a directory whose weights, library or module changed since it was compiled, or
    holds a FIFO in a file's place: exit 2 and one line naming the file, not wrong outputs, a traceback or
    a hang."""
    import shutil

    from saturate.backend import compile_graph
    from saturate.backend.build import EXTENSION

    compile_graph(small_graph(), out_dir=tmp_path / "good")
    cases = [("weights.bin", "flip"), ("weights.bin", "truncate"), ("model.so", "truncate"), (EXTENSION, "truncate"),
             ("build.key", "flip")]
    for k, (name, how) in enumerate(cases):
        bad = tmp_path / f"bad{k}"
        shutil.copytree(tmp_path / "good", bad)
        corrupt(bad / name, how)
        proc = saturate_cli("run", bad)
        assert proc.returncode == 2, (name, how, proc.stderr[-2000:])
        assert proc.stderr.count("\n") == 1, proc.stderr
        assert proc.stderr == (f"saturate: error: {bad}: cannot load {name}: it does not match the sha256 "
                               "build.json records; compile the model again\n"), proc.stderr
    # A FIFO in a file's place would block a read forever: refused unread.
    for k, (name, why) in enumerate([("weights.bin", "cannot load weights.bin: it is missing or not a regular file"),
                                     ("build.json", "no readable build.json")]):
        bad = tmp_path / f"fifo{k}"
        shutil.copytree(tmp_path / "good", bad)
        (bad / name).unlink()
        os.mkfifo(bad / name)
        proc = saturate_cli("run", bad, timeout=60)
        assert proc.returncode == 2 and proc.stderr == f"saturate: error: {bad}: {why}; compile the model again\n", \
            proc.stderr


@pytest.mark.slow
@pytest.mark.compiler
def test_a_key_or_digest_file_too_large_or_not_a_file_is_never_read(tmp_path, monkeypatch, capfd):
    """Whoever could write the folder wrote a compiled directory's build.key and the cache's digest files, so
    they are read only as small regular files: a build.key past the limit, even one build.json vouches
    for, is one line at load; a digest file the size of the disk beside the kernel library is not read
    whole but the library is rebuilt; a FIFO never blocks a read."""
    import hashlib

    from saturate.backend import build, cache, compile_graph

    monkeypatch.setenv("SATURATE_CACHE", str(own_cache(tmp_path)))
    compile_graph(small_graph(), out_dir=tmp_path / "good")
    bad = tmp_path / "bad"
    import shutil

    shutil.copytree(tmp_path / "good", bad)
    with open(bad / "build.key", "wb") as f:
        f.truncate(cache.SMALL_FILE_MAX_BYTES + 1)
    facts = json.loads((bad / "build.json").read_text())
    facts["files"]["build.key"] = hashlib.sha256(b"\0" * (cache.SMALL_FILE_MAX_BYTES + 1)).hexdigest()
    (bad / "build.json").write_text(json.dumps(facts))
    proc = saturate_cli("run", bad)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"saturate: error: {bad}: cannot load build.key: "), proc.stderr

    lib = build.kernel_library()
    stamp = lib.with_suffix(".sha256")
    stamp.unlink()
    with open(stamp, "wb") as f:
        f.truncate(1 << 40)  # sparse: a terabyte nothing may read
    capfd.readouterr()
    assert build.kernel_library() == lib and cache.read_small(stamp).strip() == cache.file_digest(lib)
    assert f"cache entry {lib.name} did not match its digest; rebuilding" in capfd.readouterr().err
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(OSError, match="not a regular file"):
        cache.read_small(tmp_path / "fifo")


def test_a_changed_binding_object_in_the_cache_is_rebuilt(tmp_path, monkeypatch, capfd):
    """The Cython module's object every build links is checked against its digest too."""
    from saturate.backend import compile_graph
    from saturate.backend.build import binding_key

    cache = own_cache(tmp_path)
    monkeypatch.setenv("SATURATE_CACHE", str(cache))
    obj = cache / f"binding-{binding_key()}.o"
    corrupt(obj, "truncate")
    capfd.readouterr()
    feed = feed_for(small_graph(3.0))
    model = compile_graph(small_graph(3.0))
    assert f"saturate: cache entry {obj.name} did not match its digest; rebuilding" in capfd.readouterr().err
    np.testing.assert_allclose(model(feed)["y"], expected(small_graph(3.0), feed)["y"], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["flip", "truncate"])
def test_a_changed_kernel_library_in_the_cache_is_rebuilt_before_a_model_links_it(tmp_path, monkeypatch, capfd, how):
    """The kernel library every build links is checked against its digest before each link; a FIFO in place
    of its lock is refused in one line rather than waited on."""
    from saturate.backend import compile_graph
    from saturate.backend.build import kernel_library

    cache = own_cache(tmp_path)
    monkeypatch.setenv("SATURATE_CACHE", str(cache))
    lib = kernel_library()
    corrupt(lib, how)
    capfd.readouterr()
    feed = feed_for(small_graph(5.0))
    model = compile_graph(small_graph(5.0))
    assert f"saturate: cache entry {lib.name} did not match its digest; rebuilding" in capfd.readouterr().err
    np.testing.assert_allclose(model(feed)["y"], expected(small_graph(5.0), feed)["y"], rtol=1e-5, atol=1e-6)
    assert kernel_library() == lib and "rebuilding" not in capfd.readouterr().err
    if how == "truncate":
        corrupt(lib, how)
        lock = lib.with_suffix(".lock")
        lock.unlink(missing_ok=True)
        os.mkfifo(lock)
        with pytest.raises(SaturateError, match=r"\.lock: not a regular file; remove it"):
            kernel_library()


def test_models_compile_with_the_kernels_headers_precompiled_and_a_changed_one_is_rebuilt(tmp_path, monkeypatch,
                                                                                          capfd):
    """A model's compile reads the kernels' headers precompiled (sat_prelude.h.gch, built once per set of
    flags); one changed in the cache is built again before a compile reads it: a precompiled header is code."""
    from saturate.backend import compile_graph
    from saturate.backend.build import PRELUDE, BuildConfig, compile_command, model_prelude
    from saturate.backend.toolchain import compiler, compiler_version

    if "clang" in compiler_version(compiler()).lower():
        pytest.skip("precompiled headers are gcc's")
    cache = own_cache(tmp_path)
    monkeypatch.setenv("SATURATE_CACHE", str(cache))
    config = BuildConfig.from_env()
    prelude = model_prelude(config)
    assert prelude is not None and prelude.parent == cache
    source = tmp_path / "m.c"
    source.write_text('#include "kernels.h"\nint sat_probe(void) { return SAT_PN; }\n')
    done = subprocess.run(compile_command(source, tmp_path / "m.o", config, prelude=prelude) + ["-H"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert f"! {prelude / PRELUDE}.gch" in done.stderr.splitlines()     # '!': read precompiled
    corrupt(prelude / f"{PRELUDE}.gch", "flip")
    capfd.readouterr()
    feed = feed_for(small_graph(7.0))
    model = compile_graph(small_graph(7.0))
    assert f"saturate: cache entry {prelude.name} did not match its digest; rebuilding" in capfd.readouterr().err
    np.testing.assert_allclose(model(feed)["y"], expected(small_graph(7.0), feed)["y"], rtol=1e-5, atol=1e-6)
    assert model_prelude(config) == prelude and "rebuilding" not in capfd.readouterr().err


def processes() -> dict[int, tuple[int, int, str, str]]:
    """Every process: pid -> (parent pid, process group, command name, state), from /proc."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            text = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        comm = text[text.index("(") + 1: text.rindex(")")]
        fields = text[text.rindex(")") + 2:].split()
        out[int(entry)] = (int(fields[1]), int(fields[2]), comm, fields[0])
    return out


def descendants(pid: int) -> dict[int, tuple[int, int, str, str]]:
    table = processes()
    found, frontier = {}, [pid]
    while frontier:
        parent = frontier.pop()
        for child, row in table.items():
            if row[0] == parent and child not in found:
                found[child] = row
                frontier.append(child)
    return found


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_during_compile_ends_the_compiler_and_leaves_no_temp_files(tmp_path, sig, code):
    """SIGTERM or SIGINT while gcc runs: the command exits with 143 or 130 within 2 s, with one line, no
    compiler process of its left (cc1 included), no staging folder in the cache or beside -o, and no
    temp file in $TMPDIR."""
    from saturate.frontend import save_graph

    save_graph(small_graph(4.0), str(tmp_path / "m.onnx"))
    (tmp_path / "tmp").mkdir()
    env = dict(os.environ, SATURATE_CACHE=str(own_cache(tmp_path)), TMPDIR=str(tmp_path / "tmp"))
    # SIGINT at its default in the child: a run started in the background by a shell without job
    # control ignores it, and Python then never turns it into KeyboardInterrupt.
    proc = subprocess.Popen([sys.executable, "-m", "saturate", "compile", str(tmp_path / "m.onnx"), "-o",
                             str(tmp_path / "out")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline, seen = time.monotonic() + 120, {}
        while time.monotonic() < deadline and not any(row[2] == "cc1" for row in seen.values()):
            assert proc.poll() is None, proc.communicate()
            seen.update(descendants(proc.pid))
            time.sleep(0.02)
        assert any(row[2] == "cc1" for row in seen.values()), "gcc never ran"
        seen.update(descendants(proc.pid))
        start = time.monotonic()
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=10)
        took = time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == code, err
    assert took < 2.0, took
    assert err.strip().splitlines() == ["saturate: terminated" if sig == signal.SIGTERM else "saturate: interrupted"]
    groups = {row[1] for row in seen.values()} - {os.getpgrp()}  # the compiler's own groups
    time.sleep(0.2)  # an orphan's last reaping by init
    left = {pid: row for pid, row in processes().items() if (pid in seen or row[1] in groups) and row[3] != "Z"}
    assert not left, left
    assert not [p.name for p in (tmp_path / "cache").iterdir() if p.name.startswith(".")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "m.onnx", "tmp"]
    assert list((tmp_path / "tmp").iterdir()) == []


def test_an_input_of_terabytes_is_refused_before_anything_is_built(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1 << 40]) for n in ("x", "y")]
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "big", vi[:1], vi[1:])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "big.onnx")
    proc = saturate_cli("compile", tmp_path / "big.onnx", "-o", tmp_path / "out",
                        env=dict(os.environ, SATURATE_CACHE=str(tmp_path / "cache")))
    assert proc.returncode == 2
    assert proc.stderr == ("saturate: error: graph input 'x' would take 4.0 TiB, over the memory limit of "
                           f"{proc.stderr.split('memory limit of ')[1].split(' (')[0]} (--max-memory)\n")
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache").exists()


def test_a_workspace_over_the_memory_limit_is_refused_before_the_compile(tmp_path):
    """Small input and output, an intermediate of 4 MiB: --max-memory 1M refuses the workspace."""
    from saturate.frontend import save_graph

    g = make([Node("Expand", ["x", "shape"], ["big"]), Node("ReduceSum", ["big"], ["y"], {"keepdims": 0})],
             {"x": (1, 4)}, {"shape": np.array([256 * 1024, 4], np.int64)})
    save_graph(g, str(tmp_path / "m.onnx"))
    proc = saturate_cli("compile", tmp_path / "m.onnx", "-o", tmp_path / "out", "--max-memory", "1M",
                        env=dict(os.environ, SATURATE_CACHE=str(tmp_path / "cache")))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("saturate: error: the workspace of graph ") and proc.stderr.endswith(
        "over the memory limit of 1.0 MiB (--max-memory)\n") and proc.stderr.count("\n") == 1, proc.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache").exists()


def test_running_a_compiled_directory_checks_the_memory_limit_before_allocating(tmp_path):
    from saturate.backend import compile_graph

    compile_graph(small_graph(), out_dir=tmp_path / "m")
    proc = saturate_cli("run", tmp_path / "m", "--max-memory", "100")
    assert proc.returncode == 2
    assert proc.stderr.endswith(f"saturate: error: {tmp_path / 'm'}: input 'x' would take 128 bytes, over the "
                                "memory limit of 100 bytes (--max-memory)\n"), proc.stderr


def test_an_unwritable_cache_is_one_line(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    save = tmp_path / "m.onnx"
    from saturate.frontend import save_graph

    save_graph(small_graph(5.0), str(save))
    proc = saturate_cli("compile", save, "-o", tmp_path / "out",
                        env=dict(os.environ, SATURATE_CACHE=str(tmp_path / "file" / "cache")))
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"saturate: error: cannot write the build cache {tmp_path / 'file' / 'cache'}") \
        and proc.stderr.count("\n") == 1, proc.stderr
    assert "Not a directory" in proc.stderr and not (tmp_path / "out").exists()


@pytest.mark.parametrize("where", ["cache", "output"])
def test_a_full_disk_during_compile_is_one_line_and_keeps_the_earlier_output(tmp_path, monkeypatch, where):
    """ENOSPC writing the build into the cache or copying it beside -o: a SaturateError, no staging folder
    left, and the -o an earlier compile wrote is as it was."""
    import errno
    import pathlib
    import shutil

    from saturate.backend import compile_graph

    monkeypatch.setenv("SATURATE_CACHE", str(own_cache(tmp_path)))
    out = tmp_path / "out"
    compile_graph(small_graph(), out_dir=out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real_write, real_copy = pathlib.Path.write_bytes, shutil.copyfile

    def write_bytes(self, data):
        if self.name == "weights.bin":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))
        return real_write(self, data)

    def copyfile(src, dst, **kwargs):
        if Path(dst).name == "model.so":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst))
        return real_copy(src, dst, **kwargs)

    if where == "cache":
        monkeypatch.setattr(pathlib.Path, "write_bytes", write_bytes)
    else:
        monkeypatch.setattr(shutil, "copyfile", copyfile)
    with pytest.raises(SaturateError, match="No space left on device") as err:
        compile_graph(small_graph(6.0), out_dir=out)
    assert "\n" not in str(err.value)
    assert str(tmp_path / "cache" if where == "cache" else out) in str(err.value)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert not [p for p in (tmp_path / "cache").iterdir() if p.name.startswith(".") and p.is_dir()]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "out"]


def test_weights_past_the_memory_limit_together_compile_when_each_fits(tmp_path):
    """The weights go to disk one at a time and the compiled model maps them: --max-memory bounds each
    weight's float32 copy, so three weights of 1 MiB compile under a 1.5 MiB limit and run like the graph;
    a weight past the limit is refused by name, before the build."""
    from saturate.backend.runtime import load
    from saturate.interp.interpreter import run_graph

    rng = np.random.default_rng(5)
    g = make([Node("MatMul", ["x", "w0"], ["h0"]), Node("Relu", ["h0"], ["r0"]),
              Node("MatMul", ["r0", "w1"], ["h1"]), Node("Relu", ["h1"], ["r1"]),
              Node("MatMul", ["r1", "w2"], ["y"])], {"x": (2, 512)},
             {k: (rng.standard_normal((512, 512)) / 16).astype(np.float32) for k in ("w0", "w1", "w2")})
    save_external(g, tmp_path / "m.onnx")
    env = dict(os.environ, SATURATE_CACHE=str(own_cache(tmp_path)))
    proc = saturate_cli("compile", tmp_path / "m.onnx", "-o", tmp_path / "out", "--max-memory", "1.5M", env=env)
    assert proc.returncode == 0, proc.stderr
    x = feed_for(g)["x"]
    got = load(tmp_path / "out")(x=x)["y"]
    assert rel_error(got, run_graph(g, {"x": x})["y"]) <= TOL

    g.constants["w1"] = (rng.standard_normal((512, 1024)) / 16).astype(np.float32)
    g.constants["w2"] = (rng.standard_normal((1024, 512)) / 16).astype(np.float32)
    save_external(g, tmp_path / "big.onnx")
    proc = saturate_cli("compile", tmp_path / "big.onnx", "-o", tmp_path / "out2", "--max-memory", "1.5M", env=env)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "'w1'" in proc.stderr and proc.stderr.endswith(
        "over the memory limit of 1.5 MiB (--max-memory)\n"), proc.stderr
    assert not (tmp_path / "out2").exists()


def save_external(graph, path: Path) -> None:
    """`graph` as an ONNX model whose weights lie in PATH.data (read by mapping, not into memory)."""
    import onnx

    from saturate.frontend import save_graph

    save_graph(graph, str(path))
    onnx.save_model(onnx.load(path), path, save_as_external_data=True, location=path.name + ".data",
                    size_threshold=0)
