"""Tests for the package layout: every stage folder installs, and imports flow one way."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Lower layers never import higher ones: commands -> pipeline/partition -> stages -> core.
LAYERS = {"core": 0, "lang": 1, "interp": 1, "frontend": 1, "ops": 1, "targets": 2, "engine": 3, "check": 3,
          "backend": 3, "report": 3, "pipeline": 4, "partition": 5, "batch": 5, "summary": 5, "commands": 6,
          "cli": 7}


def _packages() -> dict[str, Path]:
    found = {".".join(("saturate", *p.parent.relative_to(ROOT / "saturate").parts)): p.parent
             for p in (ROOT / "saturate").rglob("__init__.py")}
    found["saturate.frontend"] = ROOT / "frontend"
    return found


def test_every_package_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    assert set(_packages()) == listed


def _stage(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "saturate" else None


def test_imports_flow_one_way_between_stages():
    wrong = []
    for package, folder in _packages().items():
        for path in folder.glob("*.py"):
            here = _stage(package) or path.stem
            if here not in LAYERS:
                here = path.stem if package == "saturate" else here
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module:
                    there = _stage(node.module)
                elif isinstance(node, ast.Import):
                    there = next((_stage(a.name) for a in node.names if _stage(a.name)), None)
                else:
                    continue
                if there in LAYERS and here in LAYERS and LAYERS[there] > LAYERS[here]:
                    wrong.append(f"{path.relative_to(ROOT)} ({here}) imports saturate.{there}")
    assert not wrong, "\n".join(wrong)
