"""Packaging: the wheel works without the checkout; each optional part, when missing, names its extra."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from saturate.cli import main
from saturate.core.errors import SaturateError
from saturate.core.extras import DISTRIBUTION

ROOT = Path(__file__).resolve().parents[1]
SMALL_RULES = """\
ruleset small level 2

rule add-zero  Add(x, c:const)  => x  if zeros(c), broadcasts_into(c, x)
"""


def _hint(extra: str) -> str:
    return re.escape(f": pip install '{DISTRIBUTION}[{extra}]'")


def test_check_without_hypothesis_names_the_check_extra(tmp_path, capsys, monkeypatch):
    rules = tmp_path / "small.rules"
    rules.write_text(SMALL_RULES)
    for name in [m for m in sys.modules if m == "hypothesis" or m.startswith(("hypothesis.", "saturate.check"))]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "hypothesis", None)   # import hypothesis raises ModuleNotFoundError
    assert main(["check", str(rules)]) == 2
    err = capsys.readouterr().err
    assert re.fullmatch(r"saturate: error: saturate check needs hypothesis" + _hint("check") + r"\n", err), err


def test_import_saturate_check_without_hypothesis_is_one_import_error_naming_the_extra():
    """In a fresh interpreter where hypothesis cannot be found, as on a plain install."""
    code = """if True:
        import sys

        class NoHypothesis:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "hypothesis":
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)

        sys.meta_path.insert(0, NoHypothesis())
        from saturate.core.errors import SaturateError
        for statement in ("import saturate.check", "from saturate import check", "import saturate.check.checker"):
            try:
                exec(statement)
            except ImportError as err:
                print(type(err).__name__, isinstance(err, SaturateError), err.name, err)
        """
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    line = f"MissingExtra True hypothesis saturate.check needs hypothesis: pip install '{DISTRIBUTION}[check]'"
    assert done.stdout.splitlines() == [line] * 3


def test_optimize_run_show_and_the_api_need_no_extra(tmp_path):
    """The runtime is what optimize, run and show need: with every extra's modules unfindable (a plain
    install), they work, and so do `import saturate` and saturate.simplify."""
    code = """if True:
        import sys

        EXTRAS = {"hypothesis", "Cython", "scipy_openblas32", "ray", "PIL", "onnxsim", "torch", "pytest"}

        class NoExtras:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in EXTRAS:
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)

        sys.meta_path.insert(0, NoExtras())
        from saturate.cli import main
        import saturate
        codes = [main(["optimize", "example:mlp", "-o", "mlp.onnx", "--quiet"]),
                 main(["run", "mlp.onnx", "-o", "y.npy"]), main(["show", "mlp.onnx", "--svg", "mlp.svg"])]
        _, ok = saturate.simplify("mlp.onnx")
        print(codes, ok, sorted(m for m in sys.modules if m.split(".")[0] in EXTRAS))
        """
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSTARTUP"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[0, 0, 0] True []", done.stdout
    assert {"mlp.onnx", "y.npy", "mlp.svg"} <= {p.name for p in tmp_path.iterdir()}


@pytest.mark.parametrize("module,package", [("Cython", "cython"), ("scipy_openblas32", "scipy-openblas32")])
def test_the_c_backend_without_its_build_needs_names_the_c_extra(tmp_path, capsys, monkeypatch, module, package):
    from saturate.backend import build

    monkeypatch.setitem(sys.modules, module, None)
    assert main(["compile", "example:mlp", "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert re.fullmatch(rf"saturate: error: the C backend needs {package}" + _hint("c") + r"\n", err), err
    assert not (tmp_path / "out").exists()
    with pytest.raises(SaturateError, match=_hint("c")):
        build.binding_key() if module == "Cython" else build.openblas()


def test_bench_without_onnxruntime_names_the_bench_extra(monkeypatch):
    from saturate.backend.bench import ort_session
    from saturate.frontend import examples

    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(SaturateError, match="^saturate bench needs onnxruntime" + _hint("bench") + "$"):
        ort_session(examples.build("mlp"), threads=1)


def test_a_batch_on_a_cluster_without_ray_names_the_cluster_extra(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    assert main(["optimize", "example:mlp", "example:chain-3", "-o", str(tmp_path / "out"), "--cluster", "local"]) == 2
    err = capsys.readouterr().err
    assert re.fullmatch(r"saturate: error: --cluster needs Ray" + _hint("cluster") + r"\n", err), err


def test_a_module_that_fails_inside_is_not_called_missing(tmp_path, monkeypatch):
    """Only the extra's own module missing is the extra's message; a broken install raises as it is."""
    from saturate.core.extras import need

    (tmp_path / "half_installed.py").write_text("import a_dependency_that_is_not_there\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="a_dependency_that_is_not_there"):
        need("half_installed", "check", "x")
    with pytest.raises(SaturateError, match="^x needs not_there" + _hint("check") + "$"):
        need("not_there", "check", "x")


def test_install_hints_name_the_distribution_not_the_unrelated_saturate():
    """`pip install 'saturate[...]'` would install another project from the package index."""
    texts = [p.read_text() for p in sorted((ROOT / "saturate").rglob("*.py"))] + [(ROOT / "README.md").read_text()]
    wrong = [line for t in texts for line in t.splitlines() if re.search(r"pip install\W+saturate\b(?!-onnx)", line)]
    assert wrong == []
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'\nname = "{DISTRIBUTION}"\n' in pyproject


def test_the_readme_states_the_python_and_build_requirements_pyproject_sets():
    """Issue 32, item 8: the Python version pyproject.toml requires, and the C backend's compiler and headers."""
    minimum = re.search(r'\nrequires-python = ">=(3\.\d+)"\n', (ROOT / "pyproject.toml").read_text()).group(1)
    requirements = (ROOT / "README.md").read_text().split("## Requirements", 1)[1].split("\n## ", 1)[0]
    assert f"Python {minimum} or newer" in requirements
    assert "C compiler" in " ".join(requirements.split()) and "headers" in requirements
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    assert "## Unreleased" in (ROOT / "CHANGELOG.md").read_text()


def test_the_package_data_is_found_through_the_package():
    """Rules, targets, grammars and headers are read from inside the saturate package (a wheel has no
    rules/ beside site-packages); in a checkout saturate/rules links to rules/ at the top."""
    from importlib import resources

    from saturate.backend.build import KERNELS_DIR
    from saturate.lang.parser import RULES_DIR
    from saturate.targets.target import TARGETS_DIR, target_files

    package = resources.files("saturate")
    assert RULES_DIR == Path(str(package / "rules")).resolve()
    assert TARGETS_DIR == RULES_DIR / "targets" and "cpu" in target_files()
    assert (ROOT / "saturate" / "rules").resolve() == (ROOT / "rules").resolve()
    assert KERNELS_DIR == Path(str(resources.files("saturate.backend"))).resolve()
    assert (ROOT / "saturate" / "py.typed").is_file()


def _checkout_copy(dest: Path) -> Path:
    """The checkout's files as git knows them (tracked and new, not ignored), so the build sees what a
    clone would, and writes its build/ and egg-info there rather than in the checkout."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True).stdout.split(b"\0")
    archive = dest.with_suffix(".tar")
    with tarfile.open(archive, "w") as tar:
        for f in filter(None, files):
            if os.path.lexists(ROOT / os.fsdecode(f)):
                tar.add(ROOT / os.fsdecode(f), arcname=os.fsdecode(f), recursive=False)
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="tar")
    return dest


@pytest.mark.slow
@pytest.mark.compiler
def test_the_wheel_installed_outside_the_checkout_optimizes_checks_runs_and_compiles(tmp_path):
    """The wheel in a fresh venv: it sees the machine's packages (no downloads of numpy or egglog),
    but not the checkout's editable install, and it finds its own rules, targets, grammars and headers."""
    src = _checkout_copy(tmp_path / "src")
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(dist), str(src)],
                   check=True, cwd=tmp_path, timeout=600)
    (wheel,) = dist.glob("*.whl")
    assert wheel.name.startswith(DISTRIBUTION.replace("-", "_") + "-")
    import zipfile

    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"saturate/py.typed", "saturate/rules/batchnorm.rules", "saturate/rules/targets/cpu.target",
            "saturate/summary.py", "saturate/frontend/text.lark"} <= names
    assert any(re.fullmatch(r"saturate_onnx-[^/]+\.dist-info/(licenses/)?LICENSE", n) for n in names), sorted(names)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
                    "--no-index", str(wheel)], check=True, cwd=tmp_path, timeout=300)

    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"

    def run(*args: str) -> str:
        done = subprocess.run([str(venv / "bin" / "saturate"), *args], cwd=work, env=env, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done.stdout

    where = subprocess.run([str(python), "-c", "import saturate, saturate.frontend; print(saturate.__file__); "
                            "print(saturate.frontend.__file__)"], cwd=work, env=env, capture_output=True,
                           text=True, check=True).stdout.split()
    assert all(Path(w).is_relative_to(venv) for w in where), where

    assert run("--version") == f"saturate {wheel.name.split('-')[1]}\n"
    assert {"cpu", "accel", "fused"} <= set(re.findall(r"^(\w+)", run("targets"), re.M))
    run("optimize", "example:mlp", "-o", "mlp.onnx", "--quiet")
    assert (work / "mlp.onnx").stat().st_size > 0
    (work / "small.rules").write_text(SMALL_RULES)
    run("check", "small.rules", "--seed", "0")
    run("run", "mlp.onnx", "-o", "numpy.npy")
    run("compile", "mlp.onnx", "-o", "mlp", "--quiet")
    run("run", "mlp", "-o", "c.npy")
    import numpy as np

    np.testing.assert_allclose(np.load(work / "c.npy"), np.load(work / "numpy.npy"), rtol=1e-4, atol=1e-5)
