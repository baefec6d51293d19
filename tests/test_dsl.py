"""Rule DSL: parsing every feature, every load-time error with its position, the standard library, the CLI."""

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from saturate.lang import parser as dsl
from saturate.cli import main
from saturate.core.errors import SaturateError, SourceError
from saturate.lang.ast import AttrVar, Call, Guard, IntList, Num, OpTerm, Str, Var

HEAD = "ruleset t level 2\n"


def one(src: str):
    """The single rule of a ruleset-headed source."""
    (rs,) = dsl.parse_rules(HEAD + src, "t.rules")
    (rule,) = rs.rules
    return rule


# ---- features ---------------------------------------------------------------------------------

def test_rule_with_const_capture_and_constant_expression():
    r = one("rule add-add  Add(Add(x, a:const), b:const) => Add(x, a + b)")
    assert r.name == "add-add" and r.ruleset == "t" and r.level == 2 and not r.bidirectional
    assert r.lhs == OpTerm("Add", (OpTerm("Add", (Var("x"), Var("a", True))), Var("b", True)))
    assert r.rhs == OpTerm("Add", (Var("x"), Call("add", (Var("a", True), Var("b", True)))))
    assert (r.loc.file, r.loc.line, r.loc.col) == ("t.rules", 2, 1)


def test_infix_precedence_and_negation():
    r = one("rule k Add(a:const, b:const) => -a * (b - 1.5e-3) / 2 + -1")
    a, b = Var("a", True), Var("b", True)
    inner = Call("div", (Call("mul", (Call("neg", (a,)), Call("sub", (b, Num(0.0015))))), Num(2)))
    assert r.rhs == Call("add", (inner, Num(-1)))


def test_attribute_patterns_capture_and_literals():
    r = one('rule c Conv(x, w){group=g, pads=[0, -1], auto_pad="NOTSET", strides=s} '
            '=> Conv(x, w){group=g, strides=s}')
    assert r.lhs.attrs == (("group", AttrVar("g")), ("pads", IntList((0, -1))),
                           ("auto_pad", Str("NOTSET")), ("strides", AttrVar("s")))
    assert r.rhs.attrs == (("group", AttrVar("g")), ("strides", AttrVar("s")))


def test_attribute_used_in_expressions_and_computed_attributes():
    r = one("rule bn BatchNormalization(x, g:const, b:const, m:const, v:const){epsilon=eps}\n"
            "  => Mul(x, per_axis(g / sqrt(v + eps), 1, rank(x)))")
    expr = r.rhs.args[1]
    assert expr.fn == "per_axis" and expr.args[2] == Call("rank", (Var("x"),))
    assert expr.args[0].args[1].args[0].args[1] == AttrVar("eps")
    t = one("rule tt Transpose(Transpose(x){perm=p}){perm=q} => Transpose(x){perm=compose_perm(p, q, rank(x))}")
    assert t.rhs.attrs[0] == ("perm", Call("compose_perm", (AttrVar("p"), AttrVar("q"), Call("rank", (Var("x"),)))))


def test_guards_named_and_comparisons():
    r = one("rule g Mul(Conv(x, w:const){group=gr}, s:const) => Conv(x, w * s)\n"
            "   if varies_only_along(s, 1, rank(w)), gr == 1, dim(x, 1) != 3, positive(s)")
    assert [g.fn for g in r.guards] == ["varies_only_along", "==", "!=", "positive"]
    assert r.guards[1] == Guard("==", (AttrVar("gr"), Num(1)))
    assert r.guards[2].args[0] == Call("dim", (Var("x"), Num(1)))
    assert r.guards[3].loc.line == 3


def test_bidirectional_rule():
    r = one("rule comm Add(a, b) <=> Add(b, a)")
    assert r.bidirectional and r.rhs == OpTerm("Add", (Var("b"), Var("a")))


def test_comments_continuations_and_several_rulesets():
    src = ("# leading comment\nruleset one level 0   # trailing\n"
           "rule a Identity(x)\n    => x   # the rule continues on indented lines\n\n"
           "ruleset two level 3\nrule b Neg(Neg(x))\n  =>\n  x\n")
    sets = dsl.parse_rules(src, "m.rules")
    assert [(s.name, s.level, [r.name for r in s.rules]) for s in sets] == [("one", 0, ["a"]), ("two", 3, ["b"])]
    assert sets[1].rules[0].loc.line == 7 and sets[1].rules[0].level == 3


def test_declared_op():
    r = one("op MyOp/1..2\nrule m MyOp(x, y) => x")
    assert r.lhs.op == "MyOp"


def test_terms_keep_positions():
    r = one("rule p Add(x,\n   c:const) => Add(x, sqrt(c))")
    assert (r.lhs.loc.line, r.lhs.loc.col) == (2, 8)
    assert (r.lhs.args[1].loc.line, r.lhs.args[1].loc.col) == (3, 4)
    assert (r.rhs.args[1].loc.line, r.rhs.args[1].loc.col) == (3, 23)


def test_include_is_relative_and_loads_once(tmp_path: Path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "base.rules").write_text("ruleset base level 0\nrule ident Identity(x) => x\n")
    (tmp_path / "sub" / "mid.rules").write_text('include "base.rules"\nruleset mid level 1\n'
                                                "rule n Neg(a:const) => -a\n")
    top = tmp_path / "top.rules"
    top.write_text('include "sub/mid.rules"\ninclude "sub/base.rules"\nruleset top level 2\n'
                   "rule s Sub(x, c:const) => Add(x, -c)\n")
    sets = dsl.load_rulesets([top])
    assert [s.name for s in sets] == ["base", "mid", "top"]
    assert dsl.parse_rules(top.read_text(), str(top))[0].name == "base"


def test_include_cycle_is_an_error(tmp_path: Path):
    (tmp_path / "a.rules").write_text('include "b.rules"\n')
    (tmp_path / "b.rules").write_text('# b\ninclude "a.rules"\n')
    with pytest.raises(SourceError) as err:
        dsl.load_rulesets([tmp_path / "a.rules"])
    assert err.value.line == 2 and err.value.col == 1
    assert "include cycle: a.rules -> b.rules -> a.rules" in err.value.message


def test_missing_include_names_the_include(tmp_path: Path):
    (tmp_path / "a.rules").write_text('\n  include "nope.rules"\n')
    with pytest.raises(SourceError) as err:
        dsl.load_rulesets([tmp_path])
    assert (err.value.line, err.value.col) == (2, 3) and "cannot include 'nope.rules'" in err.value.message


def _special_file(tmp_path: Path, kind: str) -> Path:
    import os

    if kind == "fifo":
        os.mkfifo(tmp_path / "pipe.rules")
        return tmp_path / "pipe.rules"
    if kind == "directory":
        (tmp_path / "folder.rules").mkdir()
        return tmp_path / "folder.rules"
    return Path("/dev/zero")


@pytest.mark.timeout(20)
@pytest.mark.parametrize("kind, what", [("fifo", "a FIFO"), ("device", "a character device"),
                                        ("directory", "a directory")])
def test_an_include_that_is_not_a_regular_file_is_refused_in_one_line(tmp_path: Path, kind, what):
    special = _special_file(tmp_path, kind)
    (tmp_path / "a.rules").write_text(f'ruleset a level 1\n  include "{special}"\n')
    with pytest.raises(SourceError) as err:
        dsl.load_rulesets([tmp_path / "a.rules"])
    assert str(err.value) == f"{tmp_path / 'a.rules'}:2:3: cannot include '{special}': not a regular file ({what})"


@pytest.mark.timeout(20)
@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_rules_file_that_is_not_a_regular_file_is_refused_in_one_line(tmp_path: Path, capsys, kind):
    special = _special_file(tmp_path, kind)
    assert main(["rules", "--no-std", "--rules", str(special)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a regular file" in err and str(special) in err


def test_a_huge_include_is_refused_by_its_size(tmp_path: Path):
    import os

    huge = tmp_path / "huge.rules"
    with open(huge, "wb") as f:      # sparse: takes no disk
        f.truncate((4 << 20) + 1)    # the limit, MAX_RULES_BYTES, and a byte
    (tmp_path / "a.rules").write_text('include "huge.rules"\n')
    with pytest.raises(SourceError) as err:
        dsl.load_rulesets([tmp_path / "a.rules"])
    assert (err.value.line, err.value.col) == (1, 1)
    assert "cannot include 'huge.rules': 4.0 MiB, over the 4.0 MiB a rules file may take" in err.value.message
    assert os.path.getsize(huge) == (4 << 20) + 1


SECRET = "API_TOKEN=hunter2-secret rule\nruleset x level 1\n"


@pytest.mark.parametrize("name", ["secret.txt", "environ", "passwd"])
def test_an_include_that_is_not_rules_shows_none_of_its_text(tmp_path: Path, capsys, name):
    (tmp_path / name).write_text(SECRET)
    (tmp_path / "a.rules").write_text(f'ruleset a level 1\ninclude "{name}"\n')
    with pytest.raises(SourceError) as err:
        dsl.load_rulesets([tmp_path / "a.rules"])
    assert (err.value.file, err.value.line, err.value.col) == (str(tmp_path / name), 1, 1)
    assert "hunter2" not in str(err.value) and "API_TOKEN" not in str(err.value)
    # Named on the command line, the same file shows nothing either.
    assert main(["rules", "--no-std", "--rules", str(tmp_path / name)]) == 2
    out = capsys.readouterr().err
    assert "hunter2" not in out and "API_TOKEN" not in out and out.count("\n") == 1
    # A file named .rules is the user's own rules: its errors still quote the line.
    (tmp_path / "b.rules").write_text(SECRET)
    (tmp_path / "a.rules").write_text('include "b.rules"\n')
    with pytest.raises(SourceError) as err:
        dsl.load_rulesets([tmp_path / "a.rules"])
    assert "API_TOKEN=hunter2" in str(err.value) and "^" in str(err.value)


@pytest.mark.parametrize("text, col", [
    ("Mul(x, 99999999999999999999)", 26), ("Mul(x, 9223372036854775808)", 26),
    ("Mul(x, -9223372036854775809)", 27), ("Reshape(x, [1, 18446744073709551616])", 34),
    ("Mul(x, 1e999)", 26), ("Mul(x, " + "9" * 5000 + ")", 26)])
def test_a_number_beyond_64_bits_is_refused_where_written(text, col):
    with pytest.raises(SourceError) as err:
        dsl.parse_rules(HEAD + f"rule x Relu(x) => {text}", "t.rules")
    assert (err.value.line, err.value.col) == (2, col)
    assert "outside int64" in err.value.message or "beyond float64" in err.value.message
    # The ends of int64 are kept exactly, -2**63 written as a negated literal too.
    r = one("rule x Softmax(x){axis=-9223372036854775808} => Mul(x, 9223372036854775807 - -9223372036854775808)")
    assert r.lhs.attrs == (("axis", Num(-(1 << 63))),)
    assert r.rhs.args[1] == Call("sub", (Num((1 << 63) - 1), Num(-(1 << 63))))


# ---- load-time errors: message and position ---------------------------------------------------------

ERRORS = [
    # (source after the header, message fragment, line, col)
    ("rule x Add(x, y) => z", "variable 'z' is not bound", 2, 21),
    ("rule x Ad(x, y) => x", "unknown op 'Ad'; did you mean 'Add'?", 2, 8),
    ("rule x Add(x) => x", "Add takes 2 inputs, not 1", 2, 8),
    ("rule x Add(x, c:const) => Conv(x)", "Conv takes 2 to 3 inputs, not 1", 2, 27),
    ("rule x Add(x, c:const) => x if positive(x)", "guard positive reads constant values", 2, 41),
    ("rule x Add(x, c:const) => x if posit(c)", "unknown guard 'posit'; did you mean 'positive'?", 2, 32),
    ("rule x Add(x, c:const) => x if rank(x)", "'rank' is a function", 2, 32),
    ("rule x Add(x, c:const) => x if positive(c, c)", "guard positive takes 1 argument, not 2", 2, 32),
    ("rule x Add(x, c:const) => Add(x, x + c)", "'x' is not a constant", 2, 34),
    ("rule x Add(x, c:const) => Add(x, Relu(c) + c)", "an op cannot appear in argument 1 of add", 2, 34),
    ("rule x Add(x, c:const) => foo(c)", "unknown function 'foo'", 2, 27),
    ("rule x Add(x, c:const) => positive(c)", "(it is a guard: put it after 'if')", 2, 27),
    ("rule x Add(x, c:const) => sqrt(c, c)", "sqrt takes 1 argument, not 2", 2, 27),
    ("rule x Add(x, c:const) => rank(x)", "rank(...) gives an int, but the right-hand side needs a value", 2, 27),
    ("rule x Add(x, c:const) => per_axis(c, x, 4)", "'x' is a value, but argument 2 of per_axis needs an int", 2, 39),
    ("rule x Add(x, c:const) => per_axis(c, 1.5, 4)", "a literal number cannot be argument 2 of per_axis", 2, 27),
    ("rule x Conv(x, c:const){grop=g} => x", "Conv has no attribute 'grop'; did you mean 'group'?", 2, 8),
    ("rule x Conv(x, c){group=g, group=h} => x", "attribute 'group' given twice", 2, 8),
    ("rule x Conv(x, c) => Conv(x, c){group=g}", "attribute 'g' is not captured", 2, 39),
    ("rule x Add(x, c:const) => c:const", "':const' belongs on the left-hand side", 2, 27),
    ("rule x Add(x, sqrt(c)) => x", "a constant expression cannot be matched", 2, 15),
    ("rule x Add(x, 1) => x", "a literal cannot be matched", 2, 8),
    ("rule x y => y", "the left-hand side must be an op pattern", 2, 8),
    ("rule x Conv(x, w){group=x} => x", "'x' is already a value variable", 2, 25),
    ("rule x Add(x, c:const) => x if x == 1", "'x' is a value, but a side of == needs an int", 2, 32),
    ("rule x Add(x, c:const) => x if broadcastable([1, 2], x)", "argument 1 of broadcastable must be a variable", 2, 32),
    ("rule x Add(x, c:const) <=> Add(c, Add(x, y))", "'y' appears on one side of <=> only", 2, 1),
    ("rule x Add(x, c:const) <=> c", "both sides of <=> must be op patterns", 2, 28),
    ("rule x Add(x, c:const) => x\nrule x Mul(x, c:const) => x", "duplicate rule name 'x' (first at t.rules:2:1)", 3, 1),
    ("rule x Add(x, c:const) => x if rank(x) = 4", "unexpected '='; expected", 2, 40),
    ("rule x Add(x, c:const) => ", "unexpected end of file; expected", 2, 27),
    ("rule x Add(x, c:const) => Add(x, c) $", "unexpected character '$'", 2, 37),
    ("rule x Add(x, c:const) => x if x", "a guard is a named guard", 2, 32),
    ("ruleset u level 9", "level must be 0 to 3, not 9", 2, 1),
    ("ruleset t level 1", "ruleset 't' is level 2 at t.rules:1:1, not 1", 2, 1),
    ("op Conv/2", "op 'Conv' is already known", 2, 1),
    ("op Foo/3..1", "empty range", 2, 1),
    ("op Foo/1\nop Foo/2", "declared with another arity", 3, 1),
    ("rule x Foo(x) => x", "unknown op 'Foo'", 2, 8),
    # `saturate rules` printed the string as it is: a terminal escape acted on the terminal.
    ('rule x Pad(x, p:const){mode="\x1b]0;t\x07"} => x', "a string may not hold control characters", 2, 29),
]


@pytest.mark.parametrize("src,message,line,col", ERRORS, ids=[e[1][:40] for e in ERRORS])
def test_load_errors_name_the_position(src, message, line, col):
    with pytest.raises(SourceError) as err:
        dsl.parse_rules(HEAD + src, "t.rules")
    e = err.value
    assert message in e.message
    assert (e.file, e.line, e.col) == ("t.rules", line, col)
    text = str(e).splitlines()
    assert text[0] == f"t.rules:{line}:{col}: {e.message}"
    assert text[1].strip() == (HEAD + src).splitlines()[line - 1].strip()
    assert text[2].index("^") - 4 == col - 1



def test_an_error_on_a_long_line_shows_the_part_around_the_column(tmp_path, capsys):
    # A rules file may hold a line of megabytes: the command prints a window of it, the caret
    # still under the offending character.
    path = tmp_path / "long.rules"
    path.write_text(HEAD + "rule deep " + "Relu(" * 2000 + "x" + ")" * 2000 + " => x\n")
    assert main(["check", str(path)]) == 2
    first, shown, caret = capsys.readouterr().err.splitlines()
    col = int(first.split(":")[4])
    assert first.endswith("expression nested more than 64 levels deep")
    assert shown.startswith("    ...Relu(") and shown.endswith("...") and len(shown) < 140
    source = path.read_text().splitlines()[-1]
    at = caret.index("^")
    assert shown[at] == source[col - 1]
    assert shown[at - 20:at + 20] == source[col - 21:col + 19]

def test_a_rules_path_with_a_terminal_escape_prints_escaped(tmp_path, capsys):
    # An include names the file: its path, in the WHERE column of `saturate rules`, check's report and
    # optimize --trace's matches, was printed as it is (a title-setting escape acted on the terminal).
    (tmp_path / "a\x1b]0;t\x07.rules").write_text("ruleset h level 1\nrule r Relu(x) => Relu(x)\n")
    (tmp_path / "main.rules").write_text('include "a\x1b]0;t\x07.rules"\n')
    main_rules = str(tmp_path / "main.rules")
    assert main(["rules", "--no-std", "--rules", main_rules]) == 0
    assert main(["check", main_rules, "--examples", "2"]) == 0
    assert main(["optimize", "example:mlp", "--no-std", "--rules", main_rules, "-o", str(tmp_path / "o.onnx"),
                 "--trace", "--check", "0"]) == 0
    printed = capsys.readouterr()
    assert "\x1b" not in printed.out + printed.err
    assert printed.out.count("a\\x1b]0;t\\x07.rules:2") == 2 and "a\\x1b]0;t\\x07.rules:2" in printed.err


def test_rule_before_any_ruleset_is_an_error():
    with pytest.raises(SourceError, match="comes before any 'ruleset NAME level N' line") as err:
        dsl.parse_rules("\n rule x Identity(x) => x", "u.rules")
    assert (err.value.line, err.value.col) == (2, 2)


def test_duplicate_names_across_files(tmp_path: Path):
    (tmp_path / "a.rules").write_text("ruleset a level 0\nrule same Identity(x) => x\n")
    (tmp_path / "b.rules").write_text("ruleset b level 0\n\nrule same Identity(x) => x\n")
    with pytest.raises(SourceError, match="duplicate rule name 'same'") as err:
        dsl.load_rulesets([tmp_path])
    assert err.value.line == 3 and err.value.file.endswith("b.rules")


def test_unreadable_files(tmp_path: Path):
    with pytest.raises(SaturateError, match="no such rules file"):
        dsl.load_rules([tmp_path / "missing.rules"])
    (tmp_path / "bin.rules").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(SaturateError, match="not UTF-8"):
        dsl.load_rules([tmp_path / "bin.rules"])


# ---- levels and names -------------------------------------------------------------------------------

def test_levels_include_every_rule_at_or_below():
    every = dsl.load_rules(level=3)
    for level in range(4):
        got = dsl.load_rules(level=level)
        assert {r.name for r in got} == {r.name for r in every if r.level <= level}
    assert {r.level for r in every} == {0, 1, 2, 3}


def test_named_rules_and_level_errors():
    (r,) = dsl.load_rules(level=3, names=["batchnorm"])
    assert r.name == "batchnorm"
    with pytest.raises(SaturateError, match=r"rule 'conv-scale-out' is level 3 but --level is 2"):
        dsl.load_rules(level=2, names=["conv-scale-out"])
    with pytest.raises(SaturateError, match="no rule named 'nope'"):
        dsl.load_rules(names=["nope"])
    with pytest.raises(SaturateError, match="--level must be 0 to 3"):
        dsl.load_rules(level=4)


# ---- the standard library ---------------------------------------------------------------------------

def test_standard_library_is_every_rules_file_and_levels_match_the_files():
    files = sorted(p.name for p in dsl.RULES_DIR.glob("*.rules"))
    assert [p.name for p in dsl.rule_files()] == files
    sets = {s.name: s.level for s in dsl.load_rulesets()}
    assert sets == {"canonicalize": 0, "constant-fold": 1, "arith": 2, "batchnorm": 2, "bias": 2,
                    "scale-axis": 3, "branches": 3, "transformer": 3, "quant": 2}
    for r in dsl.load_rules():
        assert Path(r.loc.file).name in files
        line = Path(dsl.RULES_DIR / Path(r.loc.file).name).read_text().splitlines()[r.loc.line - 1]
        assert line.lstrip().startswith(f"rule {r.name}")


def test_printed_rules_parse_back_to_the_same_rule():
    for r in dsl.load_rules():
        again = one(f"rule {r.name} {dsl.format_rule(r)}")
        assert (again.lhs, again.rhs, again.guards, again.bidirectional) == (r.lhs, r.rhs, r.guards, r.bidirectional)


def _mutations():
    """Edits of a standard rules file: delete/insert/replace characters and whole tokens."""
    texts = [p.read_text() for p in sorted(dsl.RULES_DIR.glob("*.rules"))]
    pieces = ["(", ")", ",", "{", "}", "=", "=>", "<=>", ":const", "if", "rule", "ruleset", "level",
              "include", "op", "x", "Conv", "Add", "1", "-", "*", "\n", " ", "#", '"', "[", "]", "..", "/",
              "positive(", "rank(", "Foo", "9", "1e-5", "€", "\t"]
    edit = st.tuples(st.sampled_from(["delete", "insert", "replace", "drop-token"]),
                     st.floats(0, 1), st.integers(1, 8), st.sampled_from(pieces))
    return st.tuples(st.sampled_from(texts), st.lists(edit, min_size=1, max_size=4))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_mutations())
def test_mutated_rule_files_fail_cleanly(case):
    text, edits = case
    for kind, where, n, piece in edits:
        i = int(where * len(text))
        if kind == "delete":
            text = text[:i] + text[i + n:]
        elif kind == "insert":
            text = text[:i] + piece + text[i:]
        elif kind == "replace":
            text = text[:i] + piece + text[i + len(piece):]
        else:
            words = text.split(" ")
            k = min(int(where * len(words)), len(words) - 1)
            text = " ".join(words[:k] + words[k + 1:])
    try:
        dsl.parse_rules(text, "mutant.rules")
    except SourceError as err:
        lines = text.splitlines() or [""]
        assert err.file == "mutant.rules"
        assert 1 <= err.line <= max(len(lines), 1) + 1 and err.col >= 1
        assert str(err).startswith(f"mutant.rules:{err.line}:{err.col}: ")


# ---- saturate rules ------------------------------------------------------------------------------------

def test_cli_lists_every_standard_rule(capsys):
    assert main(["rules"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["NAME", "LEVEL", "RULESET", "WHERE", "PATTERN"]
    rules = dsl.load_rules()
    for r in rules:
        assert any(line.split()[:4] == [r.name, str(r.level), r.ruleset, str(r.loc)] for line in out.splitlines())
    assert f"{len(rules)} rules at level <= 3" in out


def test_cli_level_filters(capsys):
    assert main(["rules", "--level", "1", "--no-pattern"]) == 0
    lines = capsys.readouterr().out.splitlines()[1:-1]
    assert lines and {line.split()[1] for line in lines} == {"0", "1"}
    assert len(lines[0].split()) == 4


def test_cli_lists_user_rules_and_reports_bad_files(tmp_path: Path, capsys):
    good = tmp_path / "mine.rules"
    good.write_text("ruleset mine level 2\nrule double-neg Neg(Neg(x)) => x\n")
    assert main(["rules", "--rules", str(good)]) == 0
    out = capsys.readouterr().out
    assert "double-neg" in out and "batchnorm" in out and "mine.rules:2" in out
    assert main(["rules", "--no-std", "--rules", str(tmp_path)]) == 0
    assert "batchnorm" not in capsys.readouterr().out
    bad = tmp_path / "bad.rules"
    bad.write_text("ruleset bad level 2\nrule b Neg(x) => Foo(x)\n")
    assert main(["rules", "--rules", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"saturate: error: {bad.as_posix()}:2:18: unknown op 'Foo'") or ":2:18: unknown op 'Foo'" in err
    assert "^" in err


def test_cli_named_rule_above_level_is_an_error(capsys):
    assert main(["rules", "--level", "2", "--only", "relu-scale"]) == 2
    assert "rule 'relu-scale' is level 3 but --level is 2" in capsys.readouterr().err
    assert main(["rules", "--only", "relu-scale"]) == 0


def test_a_load_is_cached_on_disk_and_a_changed_file_is_read_again(tmp_path, monkeypatch):
    from saturate.lang import parser

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    rules = tmp_path / "r.rules"
    rules.write_text("ruleset r level 0\nrule a Identity(x) => x\n")
    assert [r.name for r in parser.load_rules([rules])] == ["a"]
    assert len(list((tmp_path / "cache" / "saturate" / "rules").glob("*.json"))) == 1
    assert [r.name for r in parser.load_rules([rules])] == ["a"]
    rules.write_text("ruleset r level 0\nrule b Identity(x) => x\n")
    assert [r.name for r in parser.load_rules([rules])] == ["b"]
    rules.write_text("ruleset r level 0\nrule c Identity(x) =>\n")
    with pytest.raises(SourceError):
        parser.load_rules([rules])


# ---- lists of inputs, value tests, computed attributes, typed literals ---------------------------

def _optimize(rules_text: str, graph, tmp_path: Path):
    from saturate.pipeline import optimize

    path = tmp_path / "mine.rules"
    path.write_text(HEAD + rules_text)
    return optimize(graph, dsl.load_rules([path]))


def test_variadic_pattern_parses_and_prints_back():
    from saturate.lang.ast import Spread

    r = one("rule m Mul(Concat(xs...){axis=ax}, s:const)\n"
            "  => Concat(Mul(xs, slice_along(s, ax, rank(xs), sum_before(dim(xs, ax)), -1))...)\n"
            "  if fits_along(s, ax, rank(xs), sum(dim(xs, ax))), count(xs) <= 8")
    assert r.lhs.args[0].args == (Spread(Var("xs")),)
    spread = r.rhs.args[0]
    assert isinstance(spread, Spread) and spread.term.op == "Mul" and spread.term.args[0] == Var("xs")
    assert r.guards[0].args[3] == Call("sum", (Call("dim", (Var("xs"), AttrVar("ax"))),))
    assert r.guards[1].args[0] == Call("count", (Var("xs"),))
    again = one(f"rule m {dsl.format_rule(r)}")
    assert (again.lhs, again.rhs, again.guards) == (r.lhs, r.rhs, r.guards)


def test_variadic_rule_is_one_plain_rule_per_number_of_inputs():
    from saturate.lang.variadic import instances

    r = one("rule m Add(Concat(xs:const...), c:const) => Concat(Add(xs, c * sum_before(rank(xs)))...)\n"
            "  if count(xs) >= 2, sum(rank(xs)) > 0, positive(xs)")
    got = {len(i.lhs.args[0].args): i for i in instances(r, {"Concat": [1, 3, 5], "Add": [2]})}
    # count(xs) >= 2 is decided per instance: the one of 1 input cannot fire, so is not made.
    assert sorted(got) == [3, 5]
    three = got[3]
    assert three.lhs.args[0].args == (Var("xs.0", True), Var("xs.1", True), Var("xs.2", True))
    assert [a.args[0] for a in three.rhs.args] == [Var("xs.0", True), Var("xs.1", True), Var("xs.2", True)]
    assert three.rhs.args[0].args[1] == Call("mul", (Var("c", True), Num(0)))
    assert three.rhs.args[2].args[1].args[1] == Call("add", (Call("rank", (Var("xs.0", True),)),
                                                              Call("rank", (Var("xs.1", True),))))
    # count becomes the number (3 >= 2 holds, so no guard is left of it); a guard naming the
    # list holds for each element.
    assert three.guards[0] == Guard(">", (Call("add", (Call("add", (Call("rank", (Var("xs.0", True),)),
                                                                    Call("rank", (Var("xs.1", True),)))),
                                                       Call("rank", (Var("xs.2", True),)))), Num(0)))
    assert [g.fn for g in three.guards] == [">", "positive", "positive", "positive"]


def test_value_tests_on_constants_and_value_guards_on_expressions_parse():
    r = one("rule v Mul(Gather(a, i:const){axis=ax}, c:const) => a\n"
            "  if c == 0.5, all_equal(c, 0.5), i < 3, positive(dim(a, 0) - i), c != i")
    assert r.guards[0] == Guard("==", (Var("c", True), Num(0.5)))
    assert r.guards[1] == Guard("all_equal", (Var("c", True), Num(0.5)))
    assert r.guards[3] == Guard("positive", (Call("sub", (Call("dim", (Var("a"), Num(0))), Var("i", True))),))


def test_attributes_computed_from_captures_and_constants_parse():
    r = one("rule a Mul(HardSigmoid(x){alpha=a1, beta=b1}, c:const)\n"
            "  => HardSigmoid(x){alpha=a1 * c, beta=b1 * 2, gamma_not_here=1}" .replace(", gamma_not_here=1", ""))
    assert r.rhs.attrs == (("alpha", Call("mul", (AttrVar("a1"), Var("c", True)))),
                           ("beta", Call("mul", (AttrVar("b1"), Num(2)))))
    t = one("rule t Softmax(Transpose(x){perm=p}){axis=ax} => Softmax(x){axis=gather(p, ax, 0)}")
    assert t.rhs.attrs == (("axis", Call("gather", (AttrVar("p"), AttrVar("ax"), Num(0)))),)
    h = one("rule h Mul(x, c:const) => HardSigmoid(x){alpha=c, beta=0.5}")
    assert h.rhs.attrs == (("alpha", Var("c", True)), ("beta", Num(0.5)))


NEW_ERRORS = [
    ("rule x Concat(xs...) => xs", "'xs' is a list of inputs: read it in an input 'term...'", 2, 25),
    ("rule x Relu(x, ys...) => x", "Relu takes 1 input, not 2 or more", 2, 8),
    ("rule x Concat(xs..., ys...) => x", "Concat has more than one list of inputs", 2, 22),
    ("rule x Concat(Relu(x)...) => x", "on the left, '...' follows a variable", 2, 15),
    ("rule x Concat(xs..., xs) => x", "'xs' is already a list of inputs", 2, 22),
    ("rule x Add(x, c:const) => Concat(x...)", "'...' needs a term naming a list variable", 2, 34),
    ("rule x Concat(xs...) => Concat(xs...) if sum_before(rank(xs)) == 0",
     "sum_before(...) sums the elements before the current one", 2, 42),
    ("rule x Concat(xs...) => Concat(xs...) if count(rank(xs)) == 2", "count(...) takes a list variable", 2, 48),
    ("rule x Concat(xs...) => Concat(xs...) if sum(3) == 2", "sum(...) needs a term naming a list variable", 2, 42),
    ("rule x Add(x, c:const) => HardSigmoid(x){alpha=x}", "'x' is not a constant, so it cannot be attribute 'alpha'", 2, 48),
    ("rule x Conv(x, w:const) => Conv(x, w){auto_pad=w}",
     "attribute 'auto_pad' of Conv is STRING, and w gives a constant", 2, 48),
    ("rule x Transpose(x){perm=p} => Transpose(x){perm=p}{axis=q}", "unexpected '{'", 2, 52),
    ("rule x Conv(x, w){group=1 + g} => x", "a computed attribute belongs on the right-hand side", 2, 25),
    ("rule x Conv(x, w){group=c:const} => x", "an attribute pattern is a name that captures it or a literal", 2, 25),
    ("rule x Add(x, c:const) => x if positive(x + c)", "'x' is not a constant", 2, 41),
    ("rule x Add(x, c:const) => x if x == 0.5", "'x' is a value, but a side of == needs an int", 2, 32),
    ("rule x Add(x, c:const) => HardSigmoid(x){alpha=Relu(c)}", "an op cannot appear in attribute 'alpha'", 2, 48),
    ("rule x Add(x, c:const) => HardSigmoid(x){alpha=c:const}", "':const' belongs on the left-hand side", 2, 48),
]


@pytest.mark.parametrize("src,message,line,col", NEW_ERRORS, ids=[e[1][:40] for e in NEW_ERRORS])
def test_new_features_load_errors_name_the_position(src, message, line, col):
    test_load_errors_name_the_position(src, message, line, col)


def test_a_variadic_rule_rewrites_concats_of_any_number_of_inputs(tmp_path: Path):
    from engine_util import Builder, assert_same

    # A negated Concat of negated inputs is the Concat of the inputs (from 2 inputs on).
    rules = ("rule neg-concat Neg(Concat(xs...){axis=ax}) => Concat(Neg(xs)...){axis=ax} if count(xs) >= 2\n"
             "rule neg-neg Neg(Neg(x)) => x\n")
    for n in (1, 2, 5):
        b = Builder(shape=(2, 3))
        parts = [b.op("Neg", b.op("Mul", "x", b.rand(3))) for _ in range(n)]
        before = b.build(b.op("Neg", b.op("Concat", *parts, axis=1)))
        after, report = _optimize(rules, before, tmp_path)
        fired = n >= 2
        assert report.run.matches["neg-concat"] == (1 if fired else 0)
        want = {"Mul": n, "Concat": 1} if fired else {"Mul": 1, "Neg": 2, "Concat": 1}
        assert after.op_counts() == want
        assert_same(before, after, b.sample())



def test_a_right_hand_op_keeps_the_attributes_of_the_left_node_over_the_same_inputs(tmp_path: Path):
    # Two convs of other kernels on the left: each right-hand Conv takes the attributes of the
    # left one over the same inputs, wherever it stands (it took the first Conv's, so the 3x3's
    # weights ran with the 1x1's kernel and pads).
    from engine_util import Builder, assert_same

    from saturate.check import check_rules, format_result

    rules = ("rule swap-convs Relu(Relu(Add(Conv(x, w:const), Conv(x, v:const))))\n"
             "    => Relu(Add(Conv(x, v), Conv(x, w)))\n")
    b = Builder(shape=(1, 2, 6, 6))
    before = b.build(b.op("Relu", b.op("Relu", b.op("Add", b.conv("x", 3, 2, k=1), b.conv("x", 3, 2, k=3)))))
    after, report = _optimize(rules, before, tmp_path)
    assert report.run.matches["swap-convs"] == 1 and after.op_counts()["Relu"] == 1
    assert [n.attrs["kernel_shape"][0] for n in after.nodes if n.op == "Conv"] in ([3, 1], [1, 3])
    assert_same(before, after, b.sample())
    (result,) = check_rules(dsl.load_rules([tmp_path / "mine.rules"]), examples=20, seed=0)
    assert result.status == "PASS", format_result(result)

def test_value_tests_recognise_constants(tmp_path: Path):
    import numpy as np
    from engine_util import Builder, assert_same, ops

    rules = ("rule half Mul(x, c:const) => Div(x, 2) if c == 0.5, broadcasts_into(c, x)\n"
             "rule gelu-c Mul(x, c:const) => Neg(x) if all_equal(c, -1), broadcasts_into(c, x)\n")
    for value, want in ((0.5, ["Div"]), (-1.0, ["Neg"]), (0.25, ["Mul"])):
        b = Builder(shape=(2, 3))
        before = b.build(b.op("Mul", "x", b.const(np.full(3, value, np.float32))))
        after, _ = _optimize(rules, before, tmp_path)
        assert ops(after) == want
        assert_same(before, after, b.sample())


def test_a_value_guard_reads_an_expression(tmp_path: Path):
    import numpy as np
    from engine_util import Builder, ops

    rules = "rule add-zero-tall Add(x, c:const) => x if positive(dim(x, 0) - 5), zeros(c), broadcasts_into(c, x)\n"
    for rows, want in ((2, ["Add", "Relu"]), (6, ["Relu"])):
        b = Builder(shape=(rows, 3))
        before = b.build(b.op("Relu", b.op("Add", "x", b.const(np.zeros(3, np.float32)))))
        assert ops(_optimize(rules, before, tmp_path)[0]) == want


def test_attributes_computed_from_constants_and_captures(tmp_path: Path):
    import numpy as np
    from engine_util import Builder, assert_same, ops

    # HardSwish's x * clip(x + 3, 0, 6) / 6 as exporters spell it: its constants become HardSigmoid's.
    rules = ("rule hard-sigmoid Div(Clip(Add(x, c3:const), lo:const, hi:const), c6:const)\n"
             "   => HardSigmoid(x){alpha=reciprocal(c6), beta=c3 / c6}\n"
             "   if c3 == 3, lo == 0, hi == 6, c6 == 6, is_scalar(c3), is_scalar(c6), is_scalar(lo), is_scalar(hi)\n"
             "rule softmax-transpose Transpose(Softmax(Transpose(x){perm=p}){axis=ax}){perm=q}\n"
             "   => Softmax(x){axis=gather(p, ax, 0)} if identity_perm(compose_perm(p, q, rank(x)), rank(x))\n")
    f = lambda v: np.array(v, np.float32)   # noqa: E731
    b = Builder(shape=(2, 3, 4))
    hs = b.op("Div", b.op("Clip", b.op("Add", "x", b.const(f(3))), b.const(f(0)), b.const(f(6))), b.const(f(6)))
    sm = b.op("Transpose", b.op("Softmax", b.op("Transpose", "x", perm=[2, 0, 1]), axis=-1), perm=[1, 2, 0])
    before = b.build(hs, sm)
    after, _ = _optimize(rules, before, tmp_path)
    assert ops(after) == ["HardSigmoid", "Softmax"]
    assert after.nodes[0].attrs["alpha"] == pytest.approx(1 / 6) and after.nodes[0].attrs["beta"] == 0.5
    assert after.nodes[1].attrs["axis"] == 1
    assert_same(before, after, b.sample())


def test_literals_take_the_type_of_the_other_input(tmp_path: Path):
    import numpy as np
    from engine_util import Builder, assert_same, ops

    rules = ("rule one-minus Add(Neg(x), c:const) => Sub(1, x) if ones(c), broadcasts_into(c, x)\n"
             "rule halve Mul(x, c:const) => Div(x, 2.0) if c == 0.5, broadcasts_into(c, x)\n")
    for dtype in (np.float32, np.float16):
        b = Builder(shape=(2, 3))
        x = b.op("Cast", "x", to=int(onnx_type(dtype)))
        before = b.build(b.op("Mul", b.op("Add", b.op("Neg", x), b.const(np.ones(3, dtype))),
                              b.const(np.full(3, 0.5, dtype))))
        after, _ = _optimize(rules, before, tmp_path)
        assert ops(after) == ["Cast", "Sub", "Div"]
        assert [after.constants[n.inputs[k]].dtype for n, k in ((after.nodes[1], 0), (after.nodes[2], 1))] == [dtype] * 2
        assert_same(before, after, b.sample())


def onnx_type(dtype) -> int:
    from onnx.helper import np_dtype_to_tensor_dtype
    import numpy as np

    return np_dtype_to_tensor_dtype(np.dtype(dtype))


def test_variadic_rules_stay_bounded_on_hostile_graphs(tmp_path: Path):
    from engine_util import Builder
    from saturate.lang.variadic import MAX_INPUTS, MAX_INSTANCES
    from saturate.pipeline import optimize

    # A Concat of more inputs than MAX_INPUTS is left to the plain rules (each instance spells
    # every input and sum_before every input before one); the run ends as usual.
    b = Builder(shape=(1, 2, 2, 2))
    parts = [b.op("Mul", "x", b.rand(1)) for _ in range(600)]
    before = b.build(b.op("Mul", b.op("Concat", *parts, axis=1), b.rand(1, 1200, 1, 1)))
    after, report = optimize(before, [r for r in dsl.load_rules() if r.name == "mul-concat"])
    assert report.run.matches["mul-concat"] == 0 and after.op_counts()["Concat"] == 1
    # Lists over several ops multiply: past MAX_INSTANCES plain rules the run is refused in one line.
    b = Builder(shape=(2, 3))
    outs = [b.op("Concat", *[b.op("Neg", "x") for _ in range(n)], axis=0) for n in range(1, 18)]
    before = b.build(b.op("Add", outs[0], outs[0]), *outs)
    assert 17 ** 2 > MAX_INSTANCES and 17 < MAX_INPUTS
    with pytest.raises(SaturateError, match=r"rule 'pairs': its lists of inputs would make 289 plain rules"):
        _optimize("rule pairs Add(Concat(xs...), Concat(ys...)) => Concat(xs..., ys...)\n", before, tmp_path)
