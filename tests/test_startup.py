"""Start-up: what a command loads before it needs it, and the shortcuts that avoid loading it
(the target reader without lark, an op's schema without the whole table) giving the same answers."""

from __future__ import annotations

import os
import random
import subprocess
import sys

import onnx.defs
import pytest

from saturate.core.errors import SaturateError
from saturate.core.ir import ValueInfo
from saturate.lang.ast import OpTerm
from saturate.ops import schema
from saturate.targets import target as T

HEAVY = ("numpy", "onnx", "lark", "egglog", "saturate.backend", "saturate.check", "saturate.engine")


def _modules_after(code: str, cwd, env=None) -> set[str]:
    """The modules a fresh interpreter holds after running `code`."""
    done = subprocess.run([sys.executable, "-c", f"{code}\nimport sys\nprint(' '.join(sys.modules))"],
                          capture_output=True, text=True, timeout=300, cwd=cwd, env=env)
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split("\n")[-2].split())


def _loaded(modules: set[str], roots=HEAVY) -> list[str]:
    return sorted(m for m in modules if any(m == r or m.startswith(r + ".") for r in roots))


def test_the_cli_and_version_load_nothing_heavy(tmp_path):
    assert _loaded(_modules_after("import saturate.cli", tmp_path)) == []
    code = "import saturate.cli\ntry:\n    saturate.cli.main(['--version'])\nexcept SystemExit:\n    pass"
    assert _loaded(_modules_after(code, tmp_path)) == []


def test_optimize_help_loads_no_onnx_and_no_engine_library(tmp_path):
    code = "import saturate.cli\ntry:\n    saturate.cli.main(['optimize', '--help'])\nexcept SystemExit:\n    pass"
    assert _loaded(_modules_after(code, tmp_path), ("onnx", "google", "lark", "egglog", "saturate.backend")) == []


def test_optimize_with_cached_rules_loads_no_parser_and_no_backend(tmp_path):
    """The second run reads its rules from the cache and the cpu target without lark."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    code = ("from saturate.cli import main\n"
            "assert main(['optimize', 'example:mlp', '-o', 'o.onnx', '--check', '0', '--quiet']) == 0")
    _modules_after(code, tmp_path, env)
    assert _loaded(_modules_after(code, tmp_path, env), ("lark", "saturate.backend", "saturate.check")) == []


def _collections_in_command(args: list[str], cwd, env=None) -> tuple[int, bool]:
    """Cyclic collections in a `saturate ARGS` process once its entry point runs, and whether the
    collector was on at the exit."""
    code = ("import atexit, gc, sys\n"
            "runs = []\n"
            "gc.callbacks.append(lambda phase, info: runs.append(1) if phase == 'start' else None)\n"
            f"sys.argv = ['saturate', *{args!r}]\n"
            "from saturate.cli import entry\n"
            "before = len(runs)\n"
            "atexit.register(lambda: print('collections', len(runs) - before, gc.isenabled()))\n"
            "entry()\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=cwd, env=env)
    line = [ln for ln in done.stdout.splitlines() if ln.startswith("collections ")][-1].split()
    return int(line[1]), line[2] == "True"


def test_the_collector_rests_while_a_command_starts_and_works_after(tmp_path):
    """Importing optimize's stages makes no collection; optimizing a model, with the collector on
    again, makes some (the engine's garbage is still collected)."""
    assert _collections_in_command(["optimize", "--help"], tmp_path) == (0, False)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    runs, on = _collections_in_command(["optimize", "example:mlp", "-o", "o.onnx", "--check", "0", "--quiet"],
                                       tmp_path, env)
    assert runs > 0 and on


def test_the_command_list_is_what_pkgutil_finds():
    import pkgutil

    import saturate.commands
    from saturate.cli import command_names

    assert command_names() == sorted(m.name for m in pkgutil.iter_modules(saturate.commands.__path__))


def test_parsing_with_lark_leaves_nothing_in_the_temp_directory(tmp_path):
    """lark's cache=True is a pickle in the temp directory that a later process would unpickle."""
    code = ("from saturate.lang.parser import parse_rules\n"
            "from saturate.targets.target import parse_target\n"
            "parse_rules('ruleset t level 0\\nrule r Neg(Neg(x)) => x\\n', 'r.rules')\n"
            "parse_target('op A = 1\\r\\n', 'a.target')\n"
            "from saturate.frontend.text import parse_graph\n"
            "parse_graph('graph g opset 17\\n  input %x: float32[2]\\n  %y = Relu(%x)\\n  output %y\\n')\n")
    work = tmp_path / "work"
    work.mkdir()
    # The folder must exist first: tempfile passes over a TMPDIR that does not (to /tmp).
    (tmp_path / "tmp").mkdir()
    _modules_after(code, work, {**os.environ, "TMPDIR": str(tmp_path / "tmp")})
    assert list((tmp_path / "tmp").iterdir()) == []


# ---- the target reader without lark -------------------------------------------------------------

INFOS = [([ValueInfo("float32", (1, 3, 8, 8)), ValueInfo("float32", (4, 3, 3, 3))], ValueInfo("float32", (1, 4, 8, 8))),
         ([ValueInfo("float16", (2, 5))], ValueInfo("float16", (2, 5)))]


def _outcome(fn, facts):
    try:
        return "ok", fn(facts)
    except Exception as err:      # a formula's own error must be the same too
        return type(err).__name__, str(err)


def _walk(term) -> list:
    if isinstance(term, OpTerm):
        return [(term.op, term.attrs, term.loc), *(x for a in term.args for x in _walk(a))]
    return [(term.name, term.const, term.loc)]


def _assert_same(a: T.Target, b: T.Target) -> None:
    assert (a.name, a.description, a.domain, a.preserve, a.fold_preserved) == \
           (b.name, b.description, b.domain, b.preserve, b.fold_preserved)
    assert [(c.name, c.loc, _walk(c.pattern)) for c in a.composites] == \
           [(c.name, c.loc, _walk(c.pattern)) for c in b.composites]
    assert list(a.costs) == list(b.costs)
    for fa, fb in [(a.default, b.default), *((a.costs[k], b.costs[k]) for k in a.costs)]:
        assert (fa is None) == (fb is None)
        for ins, out in INFOS if fa is not None else ():
            for op in ("Conv", "Relu"):
                assert _outcome(fa, T._Facts(op, {}, ins, out)) == _outcome(fb, T._Facts(op, {}, ins, out))


def _read_both(text: str) -> str:
    """Read `text` with lark and with the plain reader: the plain one declines, or agrees."""
    lines = text.splitlines()
    quick = T._quick(text, "x.target")
    try:
        by_lark = T._assemble(T._lark_statements(text, "x.target", lines), "x.target", None, lines)
    except SaturateError as err:
        if quick is not None:     # parsed alike, and the statements' own error is the same
            with pytest.raises(SaturateError) as again:
                T._assemble(quick, "x.target", None, lines)
            assert str(again.value) == str(err)
        return "error"
    if quick is None:
        return "declined"
    _assert_same(T._assemble(quick, "x.target", None, lines), by_lark)
    return "same"


SHIPPED = {p.stem: p.read_text() for p in sorted(T.TARGETS_DIR.glob("*.target"))}


@pytest.mark.parametrize("text", [pytest.param(text, id=name) for name, text in SHIPPED.items()] + [
    'composite c = Conv(x, w:const){group=1, pads=[1,-1,+1,1], mode="a # b", alpha=-1.5e3, beta=+.5}',
    "op A = -(1 - -2) * 3 / numel(in0) + dim(out, -1) + max(flops, bytes, 2.) - .5e-3\t# note",
    "default unsupported\nfold-preserved yes\nfold-preserved  no\ndomain a . b\ntarget t \"d\"",
    "composite c = Relu(x) {}\ncomposite d = Relu()",
])
def test_the_shipped_targets_and_plain_files_read_alike(text):
    assert _read_both(text) == "same"


@pytest.mark.parametrize("text", ["op A = 1\r\nop B = 2", "opConv = 1", "op X = unsupported + 1",
                                  "op const = 1", "op A = flops +", "op Conv = 1 $", "preserve"])
def test_what_the_plain_reader_leaves_to_lark(text):
    assert T._quick(text, "x.target") is None


def test_edited_targets_read_alike_or_are_left_to_lark():
    """Shipped files with characters inserted, deleted and replaced and lines repeated."""
    rng = random.Random(7)
    pieces = list(" \t\n#\"-+*/=,()[]{}:.019eExé") + [
        "op ", "const", "unsupported", "yes", "-1", "1.5", "fold-preserved ", "numel(out)", "dim(in0, 1)",
        "{k=[1,-2]}", "{k=-1.5e3}", '{s="a"}']
    seen = set()
    for _ in range(600):
        lines = rng.choice(list(SHIPPED.values())).split("\n")
        for _ in range(rng.randint(1, 3)):
            k = rng.randrange(len(lines))
            line, at, r = lines[k], rng.randint(0, len(lines[k])), rng.random()
            if r < 0.4:
                lines[k] = line[:at] + rng.choice(pieces) + line[at:]
            elif r < 0.7:
                lines[k] = line[:at] + line[at + rng.randint(1, 4):]
            elif r < 0.85:
                lines[k] = line[:at] + rng.choice(pieces) + line[at + 1:]
            else:
                lines.insert(k, rng.choice(lines))
        seen.add(_read_both("\n".join(lines)))
    assert seen == {"same", "declined", "error"}


# ---- an op's schema without the table of every op -----------------------------------------------

def test_one_ops_spec_is_its_entry_in_the_whole_table():
    table = schema.op_table()
    names = {s.name for s in onnx.defs.get_all_schemas_with_history()} | set(table) | {"NoSuchOp"}
    assert {n: schema.widest_spec(n) for n in names} == {n: table.get(n) for n in names}
    assert all(schema.is_onnx_op(n) == (n in schema._onnx_table()) for n in names)


def test_attribute_type_is_the_oldest_schema_that_has_the_attribute():
    history = onnx.defs.get_all_schemas_with_history()     # each op's versions oldest first
    pairs = {(s.name, k) for s in history if s.domain == "" for k in s.attributes} | {("Conv", "nope")}
    for op, key in sorted(pairs):
        first = next((s.attributes[key].type.name for s in history
                      if s.name == op and s.domain == "" and key in s.attributes), None)
        assert schema.attribute_type(op, key) == first, (op, key)


# ---- the AST's classes without dataclass's compiled methods ---------------------------------------

def _as_dataclass(cls, frozen: bool):
    """`cls` as @dataclass writes it: the same fields, with the methods it compiles."""
    import dataclasses

    specs = []
    for f in dataclasses.fields(cls):
        extra = {} if f.default is dataclasses.MISSING else {"default": f.default}
        if f.default_factory is not dataclasses.MISSING:
            extra = {"default_factory": f.default_factory}
        specs.append((f.name, f.type, dataclasses.field(repr=f.repr, compare=f.compare, hash=f.hash, **extra)))
    ref = dataclasses.make_dataclass(cls.__name__, specs, frozen=frozen)
    ref.__qualname__ = cls.__qualname__
    return ref


def _outcome_of(fn):
    try:
        return "ok", repr(fn())
    except Exception as err:
        return type(err).__name__


def _instances() -> dict[type, list]:
    """Up to 40 objects of each value class: the standard library's rules, their files' statements,
    the built-in functions, model summaries, graphs and fold matches."""
    import dataclasses

    from saturate.core.ir import Graph, Node, OpaqueAttr, ValueInfo
    from saturate.frontend.examples import build
    from saturate.lang import builtins, guard_builtins, parser, query_builtins
    from saturate.lang.fold import Matched
    from saturate.summary import ModelSummary, summarize

    seen: dict[type, list] = {}
    stack = [*parser.load_rulesets(), *builtins.CONST_FUNCS.values(), *guard_builtins.GUARDS.values(),
             *query_builtins.QUERIES.values()]
    for path in sorted(parser.RULES_DIR.glob("*.rules")):
        stack += parser.parse_statements(path.read_text(), path.name)
    stack += parser.parse_statements('include "x.rules"\nop Foo/1..3\nop Bar/2\n')
    graphs = [build(name) for name in ("mlp", "chain-2", "chain-1")]
    stack += [ModelSummary(), ModelSummary({"Conv": 2, "Relu": 1}, 10, 120, None), *map(summarize, graphs)]
    stack += [*graphs, Graph(), Node("Relu", ["x"], ["y"]), ValueInfo(), ValueInfo("int64", ("N", 3)),
              OpaqueAttr("graph", b"\x08\x01"), OpaqueAttr("graph", b""), OpaqueAttr("x", b""),
              Matched("Relu", {}), Matched("Cast", {"to": 1}, 0, 1, 17, "", True, 4096, [None]),
              Matched("Split", {"axis": 0}, 1, 2, opset=13, inputs=[3])]
    while stack:
        x = stack.pop()
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            kept = seen.setdefault(type(x), [])
            if len(kept) < 40:
                kept.append(x)
            stack.extend(getattr(x, f.name) for f in dataclasses.fields(x))
        elif isinstance(x, (tuple, list)):
            stack.extend(x)
        elif isinstance(x, dict):
            stack.extend(x.values())
    return seen


def _written_out_classes() -> list[type]:
    import dataclasses

    from saturate import summary
    from saturate.core import ir
    from saturate.lang import ast, builtin_kinds, fold, parser

    return [c for m in (ast, builtin_kinds, parser, summary, ir, fold) for c in vars(m).values()
            if isinstance(c, type) and dataclasses.is_dataclass(c) and c.__module__ == m.__name__]


def test_no_value_class_method_is_compiled_from_text():
    """dataclass compiles the methods it writes from text ("<string>"), even those a class then
    keeps its own of: these classes ask it for none, and theirs are shared functions or written in
    their module."""
    for cls in _written_out_classes():
        params = cls.__dataclass_params__
        assert not (params.init or params.repr or params.eq or params.order or params.frozen), cls
        for name in ("__init__", "__repr__", "__eq__", "__hash__", "__setattr__", "__delattr__"):
            method = vars(cls).get(name)
            code = getattr(method, "__code__", None)
            assert code is None or code.co_filename != "<string>", (cls, name)


def test_value_classes_behave_as_dataclasses():
    """The classes whose methods are not dataclass's compiled ones (value_class, the IR's written
    out) against @dataclass of the same fields: printing, comparing, hashing, copying, assigning
    and constructing, on objects of every class."""
    import copy
    import dataclasses

    seen = _instances()
    classes = _written_out_classes()
    assert len(classes) == 24 and set(classes) <= set(seen)
    for cls in classes:
        ref, xs = _as_dataclass(cls, frozen="__setattr__" in vars(cls)), seen[cls]
        names = [f.name for f in dataclasses.fields(cls)]
        assert xs and [f.name for f in dataclasses.fields(ref)] == names
        refs = [ref(*(getattr(x, n) for n in names)) for x in xs]
        for x, r in zip(xs, refs):
            assert repr(x) == repr(r) and _outcome_of(lambda: hash(x)) == _outcome_of(lambda: hash(r))
            assert _outcome_of(lambda: dataclasses.astuple(x)) == _outcome_of(lambda: dataclasses.astuple(r))
            assert dataclasses.replace(x) == x and repr(dataclasses.replace(x, **{names[0]: None})).startswith(
                f"{cls.__name__}({names[0]}=None")
            for act in (lambda o: setattr(o, names[0], None), lambda o: setattr(o, "other", 1),
                        lambda o: delattr(o, names[0])):
                x2, r2 = copy.copy(x), copy.copy(r)
                assert _outcome_of(lambda: act(x2)) == _outcome_of(lambda: act(r2))
                assert _outcome_of(lambda: repr(x2)) == _outcome_of(lambda: repr(r2)) and vars(x2) == vars(r2)
            values = [getattr(x, n) for n in names]
            required = [f for f in dataclasses.fields(cls)
                        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
            for args, kwargs in [(values, {}), (values[:len(required)], {}), (values[:len(required) + 1], {}),
                                 (values[:1], {}), ([], {}), (values + [1], {}),
                                 ([], dict(zip(names, values))), (values[:1], {names[0]: 1}),
                                 (values[:1], {"nope": 1}), ([], {names[-1]: values[-1]})]:
                assert _outcome_of(lambda: cls(*args, **kwargs)) == _outcome_of(lambda: ref(*args, **kwargs)), \
                    (cls, args, kwargs)
        for x, r in zip(xs, refs):
            for y, s in zip(xs, refs):
                assert _outcome_of(lambda: x == y) == _outcome_of(lambda: r == s)
                assert _outcome_of(lambda: x != y) == _outcome_of(lambda: r != s)
            assert x != r and (x == 1) is False
