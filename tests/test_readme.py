"""The README and the pages of docs/ say what the code does: their rule file loads, checks sound and
optimizes beside the standard rules; their Python examples run as written; every command they show
exists with the options they give it; the quick start's test command is what CI runs; their links
resolve; their tables of rules files, targets and node counts match the repository."""

import re
import shlex
from pathlib import Path

import numpy as np
import pytest

from saturate.frontend.examples import build, random_inputs
from saturate.check.checker import check_rules
from saturate.lang.parser import RULES_DIR, load_rules, parse_rules
from saturate.interp.interpreter import run_graph
from saturate.pipeline import optimize

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]


def text(page: Path) -> str:
    return page.read_text(encoding="utf-8")


def blocks(page: Path, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text(page), re.S)


def block_with(lang: str, marker: str) -> str:
    """The one ```lang block holding `marker` among the README and the docs pages."""
    found = [b for page in PAGES for b in blocks(page, lang) if marker in b]
    assert len(found) == 1, f"expected one ```{lang} block with {marker!r}, found {len(found)}"
    return found[0]


def readme_rules(tmp_path) -> Path:
    block = re.search(r"```\n(# my_folds\.rules.*?)```", text(README), re.S).group(1)
    path = tmp_path / "my_folds.rules"
    path.write_text(block, encoding="utf-8")
    return path


def test_readme_is_short_and_every_docs_page_is_linked_from_it():
    assert len(text(README).splitlines()) <= 250
    linked = set(re.findall(r"\]\((docs/[^)#\s]+)", text(README)))
    assert {f"docs/{p.name}" for p in DOCS} <= linked


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


def test_python_examples_run_as_written(tmp_path, monkeypatch):
    """The README's API example optimizes a model file; checking.md's property test passes."""
    from saturate.frontend import save_graph

    monkeypatch.chdir(tmp_path)
    save_graph(build("vgg"), "model.onnx")
    readme_rules(tmp_path)
    api = block_with("python", "saturate.optimize(graph")
    assert api in blocks(README, "python")
    exec(compile(api, "README-api", "exec"), {})
    assert (tmp_path / "model.opt.onnx").is_file()
    checking = block_with("python", "def test_my_rule_is_sound")
    scope: dict = {}
    exec(compile(checking.replace("max_examples=300", "max_examples=20"), "checking-md", "exec"), scope)
    scope["test_my_rule_is_sound"]()



def test_adding_an_op_example_runs_as_written(tmp_path, monkeypatch, capsys):
    """The README's "Adding an op" block registers a toy op for the length of a `with` and leaves none."""
    from saturate.ops import lookup

    adding = block_with("python", "registered(cube)")
    assert adding in blocks(README, "python")
    monkeypatch.chdir(tmp_path)
    exec(compile(adding, "README-adding-an-op", "exec"), {})
    assert capsys.readouterr().out.splitlines() == ["['Cube']", "[ 0.  1.  8. 27.]"]
    assert lookup("Cube", "ai.saturate.toy") is None

# ---- the quick start ---------------------------------------------------------------------------

def _quick_start() -> tuple[str, str]:
    """The quick start's two lines: install-and-optimize, install-and-test."""
    block = re.search(r"## Quick start\n.*?```bash\n(.*?)```", text(README), re.S).group(1)
    lines = [line for line in block.splitlines() if line and not line.startswith("#")]
    assert len(lines) == 2, lines
    return lines[0], lines[1]


def _plain(command: str) -> list[str]:
    """A command's words without the flags that only quiet it."""
    return [w for w in shlex.split(command) if w not in ("-q", "--quiet")]


def test_the_quick_start_test_command_is_what_ci_runs():
    _, test_line = _quick_start()
    install, run = (part.strip() for part in test_line.split("&&"))
    ci = [line.strip() for line in text(ROOT / ".ci" / "run").splitlines()]
    assert _plain(install) in [_plain(line) for line in ci if "pip install" in line and " -e " in line]
    assert _plain(run) == [_plain(line) for line in ci if "pytest" in line and not line.startswith("#")][-1]


def test_the_quick_start_optimize_command_runs(tmp_path, monkeypatch, capsys):
    from saturate.cli import main

    optimize_line, _ = _quick_start()
    install, command = (part.strip() for part in optimize_line.split("&&"))
    assert _plain(install) == ["python", "-m", "pip", "install", "-e", "."]
    words = shlex.split(command)
    assert words[0] == "saturate"
    monkeypatch.chdir(tmp_path)
    assert main(words[1:]) == 0
    printed = capsys.readouterr()
    out = printed.out + printed.err
    assert "iteration   1" in out and "stopped: saturated" in out and "BatchNormalization" in out
    assert (tmp_path / words[words.index("-o") + 1]).is_file()


# ---- every command shown exists, with the options shown ----------------------------------------

def _subcommands() -> dict:
    from saturate.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return {name: p for name, p in sub.choices.items()}


def _shown_commands() -> list[tuple[str, str, bool]]:
    """(page, command text, whole) for every `saturate ...` command the pages show: each line of a
    bash block (whole: it must parse as written) and each inline code span (its options must exist)."""
    shown = []
    for page in PAGES:
        for block in blocks(page, "bash"):
            for line in block.splitlines():
                line = line.split(" #")[0].strip()
                for part in line.split("&&"):
                    if part.strip().startswith("saturate "):
                        shown.append((page.name, part.strip(), True))
        for block in blocks(page, ""):
            if block.startswith("saturate "):
                shown.append((page.name, " ".join(block.split()), False))
        for span in re.findall(r"`([^`]+)`", re.sub(r"```.*?```", "", text(page), flags=re.S)):
            span = " ".join(w for w in span.split() if not re.fullmatch(r"[A-Z_]+=\S*", w))
            if re.match(r"saturate [a-z]", span):
                shown.append((page.name, span, False))
    return shown


def test_every_command_shown_exists_with_its_options():
    commands = _subcommands()
    shown = _shown_commands()
    assert len(shown) > 40
    for page, command, whole in shown:
        words = command.split()
        if words[1].startswith("-"):
            continue  # `saturate --version`, checked by test_optimize
        parser = commands.get(words[1])
        assert parser is not None, f"{page}: `{command}`: no command {words[1]!r}"
        for option in re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", command):
            assert option in parser._option_string_actions, f"{page}: `{command}`: no option {option}"
        if whole:
            try:
                parser.parse_args(shlex.split(command)[2:])
            except SystemExit:
                pytest.fail(f"{page}: `{command}` does not parse")


def test_every_option_shown_alone_exists():
    """An option the prose names on its own (`--check 0`) is one of some command's, a bench
    script's or the test suite's."""
    known = {o for p in _subcommands().values() for o in p._option_string_actions}
    sources = "\n".join(text(p) for p in [*(ROOT / "bench").glob("*.py"), ROOT / "tests" / "conftest.py",
                                          ROOT / "saturate" / "report" / "picture.py"])
    spans = [(page.name, s) for page in PAGES
             for s in re.findall(r"`(--[a-z][\w-]*)[^`]*`", re.sub(r"```.*?```", "", text(page), flags=re.S))]
    assert len(spans) > 30
    for page, option in spans:
        assert option in known or f'"{option}"' in sources, f"{page}: {option} is no option"


def test_every_bench_command_shown_exists_with_its_options():
    sources = "\n".join(text(p) for p in (ROOT / "bench").glob("*.py"))
    shown = [(page.name, m.group(0)) for page in PAGES
             for m in re.finditer(r"python bench/[\w.]+\.py[^`\n#]*", text(page))]
    assert len(shown) >= 8
    for page, command in shown:
        words = command.split()
        assert (ROOT / words[1]).is_file(), f"{page}: {words[1]}"
        for option in re.findall(r"(?<![\w-])--[a-z][\w-]*", command):
            assert f'"{option}"' in sources, f"{page}: `{command}`: {option} is no option of the bench scripts"


# ---- links and tables --------------------------------------------------------------------------

def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings."""
    body = re.sub(r"```.*?```", "", text(page), flags=re.S)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.*)$", body, re.M)}


def test_relative_links_resolve():
    links = 0
    for page in PAGES:
        body = re.sub(r"```.*?```", "", text(page), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", body):
            if "://" in target:
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            assert file.exists(), f"{page.name}: link to {target}: no such file"
            if anchor:
                assert anchor in _anchors(file), f"{page.name}: link to {target}: no such heading"
            links += 1
    assert links > 20


def _table(page: Path, header: str) -> list[list[str]]:
    """The rows of the table whose header line starts with `header`, cells stripped of backticks."""
    lines = text(page).splitlines()
    start = next(k for k, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip().strip("`") for c in line.strip("|").split("|")])
    return rows


def test_the_standard_library_table_names_real_files_at_their_levels():
    rows = _table(ROOT / "docs" / "rules.md", "| file | level |")
    assert len(rows) >= 7
    for file, level, _ in rows:
        header = re.search(r"^ruleset \S+ level (\d+)", (RULES_DIR / file).read_text(), re.M)
        assert header and header.group(1) == level, file


def test_the_target_example_is_a_valid_target():
    from saturate.targets.target import parse_target

    block = next(b for b in blocks(ROOT / "docs" / "targets.md", "") if b.startswith("target "))
    target = parse_target(block, "targets.md")
    assert target.name == "accel" and "BatchNormalization" in target.preserve


def test_the_node_count_table_gives_onnxsims_recorded_counts():
    recorded = dict(re.findall(r'"([\w.-]+)": (\d+)', text(ROOT / "tests" / "test_corpus.py").split("ONNXSIM_NODES")[1]
                               .split("}")[0]))
    rows = _table(ROOT / "docs" / "benchmarks.md", "| model | saturate | onnxsim |")
    assert rows
    for model, ours, onnxsim in rows:
        entries = [name for name in recorded if name == model or name.startswith(model + "-")]
        assert entries and all(recorded[name] == onnxsim for name in entries), model
        assert int(ours) <= int(onnxsim)


def test_every_benchmark_table_is_dated_and_names_its_machine_and_command():
    """A figure without its date, CPU and command cannot be reproduced or told stale."""
    sections = re.split(r"^## ", text(ROOT / "docs" / "benchmarks.md"), flags=re.M)[1:]
    assert len(sections) >= 4
    for section in sections:
        assert re.search(r"^\|.*\|$", section, re.M), f"{section.splitlines()[0]}: figures go in a table"
        title = section.splitlines()[0]
        if title == "Node counts":  # counts, not timings: the same on any machine
            assert re.search(r"\d{4}-\d\d-\d\d", section), title
            continue
        assert re.search(r"\d{4}-\d\d-\d\d", section), f"{title}: no date"
        assert re.search(r"AMD|Intel|Apple|ARM|Graviton", section), f"{title}: no CPU"
        assert re.search(r"`(python bench/|saturate )", section), f"{title}: no command"


def test_timings_and_cpus_are_named_only_in_benchmarks():
    for page in PAGES:
        if page.name == "benchmarks.md":
            continue
        found = re.findall(r"\d\s?(?:ms|µs)\b|GFLOP/s|\bZen \d|\bEPYC\b|\bat load\b", text(page))
        assert found == [], f"{page.name}: {found}: figures belong in docs/benchmarks.md"


def test_no_page_installs_the_unrelated_saturate_distribution():
    wrong = [line for page in PAGES for line in text(page).splitlines()
             if re.search(r"pip install\W+saturate\b(?!-onnx)", line)]
    assert wrong == []
