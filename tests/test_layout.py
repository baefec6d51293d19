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


def _module_imports() -> dict[str, set[str]]:
    """Every module of the package and the package's modules it imports, function-level imports
    included (an import on first use still ties the two modules together)."""
    mods: dict[str, Path] = {}
    for package, folder in _packages().items():
        for path in folder.glob("*.py"):
            mods[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {m: set() for m in mods}
    for module, path in mods.items():
        package = module if path.stem == "__init__" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                target = resolve(name)
                if target and target != module:
                    edges[module].add(target)
    return edges


def test_no_module_imports_itself_through_others():
    edges = _module_imports()
    assert "saturate.engine.compile_rules" in edges and edges["saturate.engine.compile_rules"]
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    assert circles == []
