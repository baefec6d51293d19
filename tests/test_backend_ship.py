"""A compiled directory ships on its own: OpenBLAS is copied beside model.so and found through an $ORIGIN
RUNPATH, so the C library, a C program linked with it and the Python module run where the directory is
copied, without the venv; the cache holds one OpenBLAS copy its builds hard-link, covered by their digests."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np
import pytest

from backend_util import make, own_cache, rel_error
from saturate.backend import cache
from saturate.core.errors import SaturateError
from saturate.core.ir import Node
from test_backend_binding import readme_block

rng = np.random.default_rng(11)
SITE_PATHS = {str(Path(sysconfig.get_paths()[k]).resolve()) for k in ("purelib", "platlib")}
VENV_PATHS = SITE_PATHS | {str(Path(sys.prefix).resolve())}


def w(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def bare_env(home: Path) -> dict:
    """An environment with no trace of the venv: system PATH only, no LD_LIBRARY_PATH or PYTHON* variables."""
    cc = shutil.which(os.environ.get("CC", "cc"))
    path = os.pathsep.join(dict.fromkeys([str(Path(cc).parent), "/usr/bin", "/bin"]))
    return {"PATH": path, "HOME": str(home), "LANG": "C"}


def runpaths(lib: Path) -> list[str]:
    dyn = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True, check=True).stdout
    return re.findall(r"\((?:RUNPATH|RPATH)\)\s+Library (?:runpath|rpath): \[(.*)\]", dyn)


def resolved(binary: Path, env: dict) -> dict[str, str]:
    """What the dynamic loader resolves each needed library of `binary` to (ldd), by name."""
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, env=env, check=True).stdout
    found = {}
    for line in out.splitlines():
        name, arrow, rest = line.strip().partition(" => ")
        if arrow:
            assert not rest.startswith("not found"), f"{binary}: {name} not found"
            found[name] = rest.split(" (")[0]
    return found


def assert_outside(paths, places: set[str], where: str) -> None:
    for p in paths:
        real = str(Path(p).resolve())
        assert not any(real == v or real.startswith(v + os.sep) for v in places), f"{where}: {p} is in {places}"


@pytest.mark.compiler
@pytest.mark.slow
def test_a_compiled_directory_copied_elsewhere_runs_from_c_and_python_without_the_venv(tmp_path):
    """example:mlp compiled by docs/c-backend.md's lines, its directory copied elsewhere and the original removed;
    there the page's main.c builds and runs with no venv on PATH or LD_LIBRARY_PATH, every library it
    and the module load resolves outside the venv, and the module imports with numpy alone."""
    from saturate.backend.build import BLAS_FILE, EXTENSION
    from saturate.frontend import load_graph
    from saturate.interp.interpreter import run_graph

    script = readme_block("bash", "./main")
    compile_lines = [line for line in script.splitlines() if line.startswith("saturate compile")]
    assert compile_lines == ["saturate compile example:mlp -o mlp_c"]
    (tmp_path / "build").mkdir()
    env = dict(os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    subprocess.run(["bash", "-euo", "pipefail", "-c", compile_lines[0]], cwd=tmp_path / "build", env=env,
                   check=True, capture_output=True, timeout=300)
    ship = tmp_path / "elsewhere"
    ship.mkdir()
    shutil.copytree(tmp_path / "build" / "mlp_c", ship / "mlp_c")
    shutil.rmtree(tmp_path / "build")
    lib_dir = ship / "mlp_c"
    assert (lib_dir / BLAS_FILE).stat().st_nlink == 1  # a real copy, not a link into the cache

    # The page's C program, built and run in the new place by the page's own lines.
    (ship / "main.c").write_text(readme_block("c", "main.c: run a model"), encoding="utf-8")
    rest = "\n".join(line for line in script.splitlines() if not line.startswith("saturate "))
    env = bare_env(tmp_path)
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", rest], cwd=ship, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for lib in ("model.so", EXTENSION):
        assert runpaths(lib_dir / lib) == ["$ORIGIN"], lib
    for binary in (ship / "main", lib_dir / "model.so", lib_dir / EXTENSION):
        found = resolved(binary, env)
        assert found[BLAS_FILE] == str(lib_dir / BLAS_FILE), binary
        assert_outside(found.values(), VENV_PATHS, binary.name)
    printed = {}
    for line in proc.stdout.splitlines():
        name, sep, values = line.partition(":")
        if sep and values.strip():
            printed[name] = np.array([float(v) for v in values.split()], np.float32)

    # The Python module in the new place, imported by a Python that sees no site-packages, only numpy.
    numpy_only = tmp_path / "numpy_only"
    numpy_only.mkdir()
    numpy_dir = Path(np.__file__).resolve().parent
    for name in ("numpy", "numpy.libs"):
        if (numpy_dir.parent / name).exists():
            (numpy_only / name).symlink_to(numpy_dir.parent / name)
    module_script = (
        "import sys, json; sys.path[:0] = [sys.argv[1], sys.argv[2]]\n"
        "import numpy as np, saturate_model\n"
        "m = saturate_model.Model()\n"
        "(name, shape, _), = saturate_model.INPUTS\n"
        "x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) * np.float32(0.01)\n"
        "y = m(x)\n"
        "maps = sorted({l.split(None, 5)[5].strip() for l in open('/proc/self/maps') if len(l.split(None, 5)) == 6})\n"
        "print(json.dumps({'y': {k: v.reshape(-1).tolist() for k, v in y.items()}, 'maps': maps,\n"
        "                  'modules': sorted(sys.modules)}))\n")
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", module_script, str(lib_dir), str(numpy_only)], env=env,
                          cwd=ship, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not [m for m in seen["modules"] if m.split(".")[0] in ("saturate", "scipy_openblas32", "site")]
    blas = [p for p in seen["maps"] if "openblas" in p and "numpy" not in p]
    assert blas == [str(lib_dir / BLAS_FILE)]
    numpy_paths = {str(numpy_dir), str(numpy_dir.parent / "numpy.libs")}
    assert_outside([p for p in seen["maps"] if p.startswith("/") and not any(p.startswith(n + os.sep) for n in numpy_paths)],
                   SITE_PATHS, "the module")

    mlp = load_graph("example:mlp")
    shape = mlp.info(mlp.inputs[0]).shape
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) * np.float32(0.01)  # what main.c feeds
    ref = run_graph(mlp, {mlp.inputs[0]: x})
    assert set(printed) == set(seen["y"]) == set(ref) and printed
    for k, value in printed.items():
        assert np.array_equal(value, np.array(seen["y"][k], np.float32)), k  # %.9g round-trips float32
        assert rel_error(value, np.asarray(ref[k]).reshape(-1)) <= 1e-4, k


@pytest.mark.compiler
def test_builds_share_one_cached_openblas_and_an_output_directory_holds_its_own(tmp_path, monkeypatch):
    """Two cache entries hard-link the cache's one OpenBLAS copy, which their digests cover and the cache's
    size counts once; -o DIR gets a copy of its own; the build key names the library."""
    from saturate.backend import compile_graph
    from saturate.backend import build as b

    # A cache of its own: the run's shared cache gains other tests' builds meanwhile.
    monkeypatch.setenv("SATURATE_CACHE", str(own_cache(tmp_path)))

    def cached() -> set[Path]:
        return {p for p in b.cache_root().iterdir() if (p / "build.key").is_file()} if b.cache_root().is_dir() else set()

    g1 = make([Node("MatMul", ["a", "m"], ["y"])], {"a": (2, 5)}, {"m": w(5, 3)})
    g2 = make([Node("MatMul", ["a", "m"], ["y"])], {"a": (2, 5)}, {"m": w(5, 3)})
    before = cached()
    e1 = compile_graph(g1).directory
    e2 = compile_graph(g2, out_dir=tmp_path / "out").segments[0]
    entries = cached() - before
    assert e1 in entries and len(entries) == 2
    shared, = b.cache_root().glob(b.SHARED_BLAS_PREFIX + "*.so")
    digest = b.openblas_digest()
    assert digest == b.file_digest(b.openblas_library()) and shared.name.startswith(b.SHARED_BLAS_PREFIX + digest[:24])
    for entry in entries:
        assert os.path.samefile(entry / b.BLAS_FILE, shared)
        assert json.loads((entry / b.FACTS).read_text())["files"][b.BLAS_FILE] == digest
        assert cache._tree_bytes(entry) < shared.stat().st_size / 2
    out = tmp_path / "out" / b.BLAS_FILE
    assert e2.directory == tmp_path / "out" and out.stat().st_nlink == 1 and not os.path.samefile(out, shared)
    assert json.loads((tmp_path / "out" / b.FACTS).read_text())["files"][b.BLAS_FILE] == digest
    assert b.file_digest(out) == digest


def test_the_build_key_names_the_openblas_library(monkeypatch):
    from saturate.backend import build as b

    before = b.build_key("int x;", b"")
    monkeypatch.setattr(b, "openblas_digest", lambda: "0" * 64)
    assert b.build_key("int x;", b"") != before


@pytest.mark.compiler
def test_a_changed_openblas_in_the_cache_or_a_directory_is_refused_and_rebuilt(tmp_path, monkeypatch, capsys):
    """A cached build whose OpenBLAS copy changed is rebuilt (the shared copy too), one line saying so; a
    compiled directory whose copy changed is refused at load in one line naming the file."""
    from saturate.backend import compile_graph, load
    from saturate.backend import build as b

    # Its own cache: the shared copy this test changes is hard-linked into every build of the cache, and
    # the run's other workers load theirs meanwhile.
    monkeypatch.setenv("SATURATE_CACHE", str(own_cache(tmp_path)))

    g = make([Node("MatMul", ["a", "m"], ["p"]), Node("Relu", ["p"], ["y"])], {"a": (3, 4)}, {"m": w(4, 6)})
    feed = {"a": w(3, 4)}
    want = compile_graph(g, out_dir=tmp_path / "m")(feed)["y"]
    entry = compile_graph(g).directory
    with open(entry / b.BLAS_FILE, "r+b") as f:  # the shared copy changes with it: they are one file
        f.seek(4096)
        f.write(b"\xcc" * 16)
    capsys.readouterr()
    again = compile_graph(g)
    assert again.directory == entry
    err = capsys.readouterr().err
    assert f"did not match its digests ({b.BLAS_FILE}: it does not match the sha256" in err
    assert b.mismatch(entry) is None and b.file_digest(entry / b.BLAS_FILE) == b.openblas_digest()
    shared, = b.cache_root().glob(b.SHARED_BLAS_PREFIX + "*.so")
    assert b.file_digest(shared) == b.openblas_digest()
    assert np.array_equal(again(feed)["y"], want)

    shutil.copytree(tmp_path / "m", tmp_path / "m2")
    (tmp_path / "m2" / b.BLAS_FILE).write_bytes(b"\x7fELF not openblas")
    with pytest.raises(SaturateError, match=rf"cannot load {re.escape(b.BLAS_FILE)}: it does not match the sha256"):
        load(tmp_path / "m2")


@pytest.mark.compiler
def test_the_segments_of_a_cut_graph_each_find_openblas_in_their_own_folder(tmp_path):
    from saturate.backend import compile_graph, load
    from saturate.backend import build as b

    g = make([Node("MatMul", ["a", "m"], ["p"]), Node("CumSum", ["p", "ax"], ["c"]), Node("Relu", ["c"], ["y"])],
             {"a": (3, 4)}, {"m": w(4, 6), "ax": np.array(1, np.int64)})
    feed = {"a": w(3, 4)}
    want = compile_graph(g, out_dir=tmp_path / "m")(feed)["y"]
    segs = sorted((tmp_path / "m").glob("seg*"))
    assert len(segs) == 2  # one copy of OpenBLAS in the directory, which both segments hold
    assert os.path.samefile(segs[0] / b.BLAS_FILE, segs[1] / b.BLAS_FILE)
    assert (segs[0] / b.BLAS_FILE).stat().st_nlink == 2
    shutil.copytree(tmp_path / "m", tmp_path / "moved")
    shutil.rmtree(tmp_path / "m")
    for seg in sorted((tmp_path / "moved").glob("seg*")):
        assert runpaths(seg / "model.so") == ["$ORIGIN"]
        assert resolved(seg / "model.so", bare_env(tmp_path))[b.BLAS_FILE] == str(seg / b.BLAS_FILE)
    assert np.array_equal(load(tmp_path / "moved")(feed)["y"], want)


def test_an_unused_shared_openblas_is_pruned_and_one_in_use_is_kept(tmp_path, monkeypatch):
    from saturate.backend import build as b

    monkeypatch.setenv("SATURATE_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "cache"
    root.mkdir()
    old, linked, fresh = (root / f"{b.SHARED_BLAS_PREFIX}{n}.so" for n in ("a" * 24, "b" * 24, "c" * 24))
    for p in (old, linked, fresh):
        p.write_bytes(b"x" * 100)
    (root / "entry").mkdir()
    os.link(linked, root / "entry" / b.BLAS_FILE)
    (root / "entry" / "build.key").write_text("entry")
    now = time.time()
    for p in (old, linked):
        os.utime(p, (now - 2 * cache.STALE_SECONDS, now - 2 * cache.STALE_SECONDS))
    b.prune_cache(now=now)
    assert not old.exists() and linked.exists() and fresh.exists() and (root / "entry").is_dir()


def test_openblas_is_linked_from_the_cache_copied_without_hard_links_and_a_changed_copy_replaced(tmp_path,
                                                                                                 monkeypatch):
    from saturate.backend import build as b

    monkeypatch.setenv("SATURATE_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    digest = b.openblas_digest()
    assert b.place_openblas(tmp_path / "one") == digest
    shared, = (tmp_path / "cache").glob(b.SHARED_BLAS_PREFIX + "*.so")
    assert os.path.samefile(tmp_path / "one", shared) and b.file_digest(shared) == digest
    with open(shared, "r+b") as f:  # changed in the cache: the next build gets a fresh copy, the old inode stays
        f.write(b"\0" * 64)
    assert b.place_openblas(tmp_path / "two") == digest and b.file_digest(tmp_path / "two") == digest
    assert os.path.samefile(tmp_path / "two", shared) and not os.path.samefile(tmp_path / "one", shared)

    def no_links(*args):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    assert b.place_openblas(tmp_path / "three") == digest
    assert (tmp_path / "three").stat().st_nlink == 1 and b.file_digest(tmp_path / "three") == digest
