"""The README's rule file loads, checks sound, and optimizes a model beside the standard rules."""

import re
from pathlib import Path

import numpy as np

from saturate.frontend.examples import build, random_inputs
from saturate.check.checker import check_rules
from saturate.lang.parser import RULES_DIR, load_rules, parse_rules
from saturate.interp.interpreter import run_graph
from saturate.pipeline import optimize

README = Path(__file__).resolve().parent.parent / "README.md"


def readme_rules(tmp_path) -> Path:
    text = README.read_text(encoding="utf-8")
    block = re.search(r"```\n(# my_folds\.rules.*?)```", text, re.S).group(1)
    path = tmp_path / "my_folds.rules"
    path.write_text(block, encoding="utf-8")
    return path


def test_readme_rule_file_is_sound(tmp_path):
    path = readme_rules(tmp_path)
    rules = [r for rs in parse_rules(path.read_text(), str(path)) for r in rs.rules]
    assert len(rules) == 6
    results = check_rules(rules, examples=20, seed=0)
    assert all(r.status == "PASS" for r in results), [(r.rule.name, r.status) for r in results]


def test_readme_rules_run_beside_the_standard_library(tmp_path):
    path = readme_rules(tmp_path)
    graph = build("vgg")
    out, report = optimize(graph, load_rules([RULES_DIR, str(path)]))
    assert "BatchNormalization" not in out.op_counts()
    feeds = random_inputs(graph, seed=0)
    want, got = run_graph(graph, feeds), run_graph(out, feeds)
    for name in graph.outputs:
        err = np.max(np.abs(want[name] - got[name])) / max(1.0, np.max(np.abs(want[name])))
        assert err <= 1e-4


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)


def test_readme_python_examples_run_as_written(tmp_path, monkeypatch):
    """The API example optimizes a model file; the checking example's property test passes."""
    from saturate.frontend import save_graph

    monkeypatch.chdir(tmp_path)
    save_graph(build("vgg"), "model.onnx")
    (tmp_path / "my_folds.rules").write_text(readme_rules(tmp_path).read_text())
    api, checking = _python_blocks()
    exec(compile(api, "README-api", "exec"), {})
    assert (tmp_path / "model.opt.onnx").is_file()
    scope: dict = {}
    exec(compile(checking.replace("max_examples=300", "max_examples=20"), "README-check", "exec"), scope)
    scope["test_my_rule_is_sound"]()
