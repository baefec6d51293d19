"""Rule DSL front end: parse .rules files (grammar in rules.lark) into checked Rule objects."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from saturate.lang import checks, rule_cache
from saturate.lang.builtins import INFIX
from saturate.core.errors import SaturateError, SourceError
from saturate.core.inputs import RefusedFile, read_regular
from saturate.core.values import value_class
from saturate.lang.ast import (AttrVar, Call, Guard, IntList, Loc, Num, OpTerm, Rule, RuleSet,
                               Spread, Str, Var)

if TYPE_CHECKING:
    # lark is imported where a text is parsed: a run whose rules come from the cache (rule_cache)
    # does not load it.
    from lark import Lark, Token, Tree
    from lark.exceptions import UnexpectedInput

# Package data: saturate/rules links to rules/ at the repository's top, and a wheel carries the files
# there. Resolved, so a checkout's messages name rules/... as before.
RULES_DIR = Path(str(resources.files("saturate") / "rules")).resolve()
MAX_LEVEL = 3
LEVELS = {0: "canonicalize", 1: "constant folding", 2: "batch-norm and add/mul folding",
          3: "scale-axis propagation"}

_PARSER: Lark | None = None


def _parser() -> Lark:
    global _PARSER
    if _PARSER is None:
        from lark import Lark

        # No cache=True: lark keeps it as a pickle in the shared temp directory, under a name anyone
        # can compute, and unpickles whatever is there. Building the grammar costs a miss of the
        # rule cache (rule_cache) a sixth more; a hit never builds it.
        _PARSER = Lark.open_from_package("saturate.lang", "rules.lark", ("",), parser="lalr",
                                         propagate_positions=True, maybe_placeholders=True)
    return _PARSER


# ---- statements as parsed, before grouping and checking ------------------------------------------

@value_class
class Include:
    """`include "path"`."""

    path: str
    loc: Loc


@value_class
class OpDecl:
    """`op Name/min..max`: an op the rules may name, with this many inputs."""

    op: str
    min_inputs: int
    max_inputs: int
    loc: Loc


@value_class
class Header:
    """`ruleset NAME level N`: the rules after it, up to the next, are that ruleset's."""

    name: str
    level: int
    loc: Loc


class _ToAst:
    """Tree -> statements and terms; method names follow the grammar's rule names. The methods
    of a lark Transformer (_to_ast makes one), each called with the node's meta and children."""

    def __init__(self, file: str):
        super().__init__()
        self.file = file

    def _loc(self, meta: Any) -> Loc:
        return Loc(self.file, meta.line, meta.column)

    def _tok(self, tok: Token) -> Loc:
        return Loc(self.file, tok.line, tok.column)

    def start(self, meta, stmts):
        return list(stmts)

    def include(self, meta, items):
        return Include(items[0][1:-1], self._loc(meta))

    def opdecl(self, meta, items):
        op, lo, hi = items
        return OpDecl(str(op), int(lo), int(hi if hi is not None else lo), self._loc(meta))

    def ruleset(self, meta, items):
        name, level = items
        return Header(str(name), int(level), self._loc(meta))

    def rule(self, meta, items):
        name, lhs, arrow, rhs, *guards = items
        guards = tuple(g for g in guards if g is not None)
        if len(lhs) != len(rhs):
            raise SourceError(self.file, meta.line, meta.column,
                              f"{len(lhs)} pattern{'s' * (len(lhs) != 1)} joined by & on the left, "
                              f"{len(rhs)} on the right: each root needs its replacement")
        if len(lhs) > 1 and str(arrow) == "<=>":
            raise SourceError(self.file, meta.line, meta.column, "a rule of several roots is written with =>")
        return Rule(str(name), lhs[0], rhs[0], guards, "", -1, self._loc(meta), str(arrow) == "<=>",
                    tuple(lhs[1:]), tuple(rhs[1:]))

    def roots(self, meta, items):
        return list(items)

    def guard(self, meta, items):
        lhs, cmp, rhs = items
        if cmp is not None:
            return Guard(str(cmp), (lhs, rhs), self._loc(meta))
        if isinstance(lhs, Call):
            return Guard(lhs.fn, lhs.args, self._loc(meta))
        raise SourceError(self.file, meta.line, meta.column,
                          "a guard is a named guard such as positive(c) or a comparison such as rank(w) == 4")

    def _binary(self, fn: str, meta, items) -> Call:
        return Call(fn, tuple(items), self._loc(meta))

    def add(self, meta, items):
        return self._binary(INFIX["+"], meta, items)

    def sub(self, meta, items):
        return self._binary(INFIX["-"], meta, items)

    def mul(self, meta, items):
        return self._binary(INFIX["*"], meta, items)

    def div(self, meta, items):
        return self._binary(INFIX["/"], meta, items)

    def neg(self, meta, items):
        (arg,) = items
        if isinstance(arg, Num):  # a negative literal, not a constant expression
            return Num(-arg.value)
        return Call("neg", (arg,), self._loc(meta))

    def opterm(self, meta, items):
        op, *rest = items
        attrs = rest.pop()  # the [attrs] slot: None when absent
        args = tuple(a for a in rest if a is not None)
        return OpTerm(str(op), args, attrs or (), self._loc(meta))

    def spread(self, meta, items):
        return Spread(items[0], self._loc(meta))

    def call(self, meta, items):
        fn, *args = items
        return Call(str(fn), tuple(a for a in args if a is not None), self._loc(meta))

    def var(self, meta, items):
        name, const = items
        return Var(str(name), const is not None, self._loc(meta))

    def attrs(self, meta, items):
        return tuple(a for a in items if a is not None)

    def attr(self, meta, items):
        key, value = items
        if isinstance(value, Var) and not value.const:
            value = AttrVar(value.name, value.loc)
        return (str(key), value)

    def number(self, meta, items):
        text = str(items[0])
        is_int = text.lstrip("+-").isdigit()
        return Num(int(text) if is_int else float(text))

    def string(self, meta, items):
        text = str(items[0])[1:-1]
        if not text.isprintable():      # `saturate rules` and check's reports print it as it is
            raise SourceError(self.file, meta.line, meta.column, "a string may not hold control characters")
        return Str(text)

    def intlist(self, meta, items):
        return IntList(tuple(int(t) for t in items if t is not None))


_TO_AST: Any = None


def _to_ast(file: str) -> Any:
    """A lark Transformer with _ToAst's methods (the class is made on first use, with lark)."""
    global _TO_AST
    if _TO_AST is None:
        from lark import Transformer, v_args

        methods = {k: v for k, v in vars(_ToAst).items() if not k.startswith("__") or k == "__init__"}
        _TO_AST = v_args(meta=True)(type("ToAst", (_ToAst, Transformer), methods))
    return _TO_AST(file)


# ---- syntax errors ----------------------------------------------------------------------------------

_TERMINAL_WORDS = {"OPNAME": "an op name", "NAME": "a name", "RULENAME": "a rule name",
                   "NUMBER": "a number", "SIGNED_NUMBER": "a number", "INT": "an integer",
                   "SIGNED_INT": "an integer", "STRING": 'a "string"', "CMP": "a comparison",
                   "ARROW": "=> or <=>", "_IF": "if", "CONST": "const", "$END": "end of file"}


def _describe(terminal: str) -> str:
    if terminal in _TERMINAL_WORDS:
        return _TERMINAL_WORDS[terminal]
    try:
        pattern = _parser().get_terminal(terminal).pattern
    except KeyError:
        return terminal
    return f"'{pattern.value}'" if pattern.type == "str" else terminal


def _syntax_error(err: UnexpectedInput, text: str, file: str) -> SourceError:
    from lark.exceptions import UnexpectedCharacters, UnexpectedToken

    lines = text.splitlines() or [""]
    line, col = err.line, err.column
    if isinstance(err, UnexpectedToken) and err.token.type == "$END" or line is None or line < 1:
        line, col = len(lines), len(lines[-1]) + 1
    # Words (keywords, "a name") before punctuation, so the likeliest fixes come first.
    expected = sorted({_describe(t) for t in getattr(err, "expected", None) or getattr(err, "allowed", None) or ()},
                      key=lambda w: (not w.strip("'").isalpha() and not w.startswith(("a ", "an ")), w))
    if isinstance(err, UnexpectedCharacters):
        what = f"unexpected character {text[err.pos_in_stream]!r}"
    elif isinstance(err, UnexpectedToken) and err.token.type != "$END":
        what = f"unexpected {err.token.value!r}"
    else:
        what = "unexpected end of file"
    if expected:
        shown = ", ".join(expected[:8]) + (", ..." if len(expected) > 8 else "")
        what += f"; expected {shown}"
    return SourceError(file, line, col, what, lines[line - 1] if line <= len(lines) else "")


def parse_statements(text: str, file: str = "<string>", show_text: bool = True) -> list[Any]:
    """Parse one rules text into its statements (Include, OpDecl, Header, unchecked Rule).
    With show_text False, an error names its place but quotes nothing of the text (shows_text)."""
    if not show_text:
        try:
            return parse_statements(text, file)
        except SourceError as err:
            raise SourceError(err.file, err.line, err.col, "not valid rules (the text of a file whose "
                                                           "name does not end in .rules is not shown)") from None
    from lark.exceptions import UnexpectedInput, VisitError

    try:
        tree = _parser().parse(text)
    except UnexpectedInput as err:
        raise _syntax_error(err, text, file) from None
    _check_depth(tree, text, file)
    _check_numbers(tree, text, file)
    try:
        return _to_ast(file).transform(tree)
    except VisitError as err:
        if isinstance(err.orig_exc, SourceError):
            err.orig_exc.source_line = None
            raise _with_line(err.orig_exc, text) from None
        raise


# Terms are walked recursively by every later stage; a rule nested deeper than this is refused
# where it is written instead of failing somewhere with a RecursionError.
MAX_DEPTH = 64


def _check_depth(tree: Tree, text: str, file: str) -> None:
    from lark import Tree

    stack = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > 3 * MAX_DEPTH:  # each term level is a few parse-tree levels
            meta = node.meta
            line, col = (meta.line, meta.column) if not meta.empty else (1, 1)
            raise _with_line(SourceError(file, line, col, f"expression nested more than {MAX_DEPTH} levels deep"), text)
        stack.extend((child, depth + 1) for child in node.children if isinstance(child, Tree))


INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
_NUMBER_TOKENS = {"NUMBER", "SIGNED_NUMBER", "INT", "SIGNED_INT"}


def _check_numbers(tree: Tree, text: str, file: str) -> None:
    """Refuse a literal no rule can mean: an integer outside int64 (attributes, shapes and the
    engine's literals hold 64 bits, and a larger one would be cut short somewhere) or a float
    beyond float64 (which Python reads as infinity)."""
    from lark import Token, Tree

    negated: set[int] = set()   # `-9223372036854775808` is written as - applied to 2**63
    stack = [tree]
    while stack:
        node = stack.pop()
        if node.data == "neg" and isinstance(node.children[0], Tree) and node.children[0].data == "number":
            negated.add(id(node.children[0]))
        for child in node.children:
            if isinstance(child, Tree):
                stack.append(child)
            elif isinstance(child, Token) and child.type in _NUMBER_TOKENS:
                bad = _bad_number(str(child), id(node) in negated)
                if bad:
                    raise _with_line(SourceError(file, child.line, child.column, bad), text)


def _bad_number(text: str, negated: bool) -> str | None:
    if text.lstrip("+-").isdigit():
        try:
            value = int(text)
        except ValueError:   # more digits than Python converts
            value = INT64_MAX + 2
        if not INT64_MIN <= (-value if negated else value) <= INT64_MAX:
            shown = ("-" if negated else "") + text[:30] + ("..." if len(text) > 30 else "")
            return f"integer {shown} is outside int64 ({INT64_MIN} to {INT64_MAX})"
    elif float(text) in (float("inf"), float("-inf")):
        return f"number {text[:30]} is beyond float64"
    return None


def _with_line(err: SourceError, text: str) -> SourceError:
    lines = text.splitlines()
    line = lines[err.line - 1] if 0 < err.line <= len(lines) else None
    return SourceError(err.file, err.line, err.col, err.message, line)


# ---- loading files ----------------------------------------------------------------------------------

# A rules file or include larger than this is refused before it is read (the standard library
# is a few dozen KiB in all).
MAX_RULES_BYTES = 4 << 20


def shows_text(path: str | os.PathLike) -> bool:
    """Whether errors in a rules file may quote its lines: only for a name ending in .rules. An
    include or --rules can name any file (/etc/passwd, /proc/self/environ), and an error quoting
    its first line would print what it holds."""
    return os.fspath(path).endswith(".rules")


def _display(path: Path) -> str:
    """How a file is named in locations: relative to the working directory when inside it."""
    rel = os.path.relpath(path)
    return path.as_posix() if rel.startswith("..") else Path(rel).as_posix()


class _Loader:
    """Reads files (following includes), then groups and checks every rule of the load."""

    def __init__(self) -> None:
        self.texts: dict[str, str] = {}
        self.seen: set[Path] = set()
        self.stmts: list[tuple[str, list[Any]]] = []

    def fail(self, loc: Loc, message: str) -> SourceError:
        lines = self.texts.get(loc.file, "").splitlines()
        line = lines[loc.line - 1] if 0 < loc.line <= len(lines) else None
        return SourceError(loc.file, loc.line, loc.col, message, line)

    def add_text(self, text: str, file: str, base: Path | None, stack: tuple[Path, ...],
                 show_text: bool = True) -> None:
        if show_text:
            self.texts[file] = text
        stmts = parse_statements(text, file, show_text=show_text)
        for st in stmts:
            if isinstance(st, Include):
                if base is None:
                    base = Path.cwd()
                self.add_file((base / st.path).resolve(), stack, st)
        self.stmts.append((file, stmts))

    def add_file(self, path: Path, stack: tuple[Path, ...] = (), origin: Include | None = None) -> None:
        path = path.resolve()
        if path in stack:
            cycle = " -> ".join(p.name for p in (*stack[stack.index(path):], path))
            raise self.fail(origin.loc, f"include cycle: {cycle}")
        if path in self.seen:
            return
        try:
            text = read_regular(path, MAX_RULES_BYTES, "rules file").decode("utf-8")
        except (RefusedFile, UnicodeDecodeError) as err:
            reason = "not UTF-8 text" if isinstance(err, UnicodeDecodeError) else err.reason
            if origin is not None:
                # One line: the including line is named by its place, not shown.
                loc = origin.loc
                raise SourceError(loc.file, loc.line, loc.col, f"cannot include '{origin.path}': {reason}") from None
            raise SaturateError(f"cannot read rules file '{path}': {reason}") from None
        self.seen.add(path)
        self.add_text(text, _display(path), path.parent, (*stack, path), show_text=shows_text(path))

    def rulesets(self) -> list[RuleSet]:
        """Group rules under their headers, then check every rule against the whole load."""
        ops = checks.declared_ops([s for _, ss in self.stmts for s in ss if isinstance(s, OpDecl)],
                                     self.fail)
        out: list[RuleSet] = []
        names: dict[str, Loc] = {}
        levels: dict[str, Header] = {}
        for file, stmts in self.stmts:
            header, rules = None, []
            for st in [*stmts, None]:
                if st is None or isinstance(st, Header):
                    if header is not None:
                        out.append(RuleSet(header.name, header.level, tuple(rules), header.loc))
                    if st is not None:
                        self._check_header(st, levels)
                    header, rules = st, []
                elif isinstance(st, Rule):
                    if header is None:
                        raise self.fail(st.loc, f"rule '{st.name}' comes before any 'ruleset NAME level N' line")
                    if st.name in names:
                        raise self.fail(st.loc, f"duplicate rule name '{st.name}' (first at {names[st.name]})")
                    names[st.name] = st.loc
                    checked = checks.check_rule(st, ops, self.fail)
                    rules.append(Rule(checked.name, checked.lhs, checked.rhs, checked.guards,
                                      header.name, header.level, checked.loc, checked.bidirectional,
                                      checked.more_lhs, checked.more_rhs))
        return out

    def _check_header(self, h: Header, levels: dict[str, Header]) -> None:
        if not 0 <= h.level <= MAX_LEVEL:
            raise self.fail(h.loc, f"level must be 0 to {MAX_LEVEL}, not {h.level}")
        first = levels.setdefault(h.name, h)
        if first.level != h.level:
            raise self.fail(h.loc, f"ruleset '{h.name}' is level {first.level} at {first.loc}, not {h.level}")


def parse_rules(text: str, file: str = "<string>") -> list[RuleSet]:
    """Parse and check one rules text; includes resolve relative to `file` (or the cwd)."""
    loader = _Loader()
    path = Path(file)
    base = path.resolve().parent if path.exists() else None
    loader.add_text(text, file, base, (path.resolve(),) if path.exists() else ())
    return loader.rulesets()


def rule_files(paths: Iterable[str | os.PathLike] | None = None) -> list[Path]:
    """The files a load reads: each path itself, or a directory's *.rules (sorted)."""
    out: list[Path] = []
    for p in [RULES_DIR] if paths is None else paths:
        p = Path(p)
        if p.is_dir():
            out.extend(sorted(p.glob("*.rules")))
        elif p.exists():
            out.append(p)
        else:
            raise SaturateError(f"no such rules file or directory: '{p}'")
    return out


def load_rulesets(paths: Iterable[str | os.PathLike] | None = None) -> list[RuleSet]:
    """Every ruleset of the files (None: the standard library in RULES_DIR), all levels, checked.

    A load is kept on disk, keyed by the files it read and the code that checked them: parsing
    and checking the standard library costs more than optimizing a small model."""
    files = rule_files(paths)
    key = rule_cache.entry_key(files)
    # A process that optimizes many models loads the same files each time: what it loaded
    # stays in memory while the files keep their size and modification time.
    held = _LOADED.get(key)
    if held is not None and held[0] == _stamps(p for p, _, _ in held[0]):
        return held[1]
    cached = rule_cache.read(key, MAX_RULES_BYTES)
    if cached is not None:
        read, rulesets = cached
    else:
        loader = _Loader()
        for f in files:
            loader.add_file(f)
        rulesets = loader.rulesets()
        read = sorted(loader.seen)
        rule_cache.write(key, read, rulesets, MAX_RULES_BYTES)
    _LOADED[key] = (_stamps(read), rulesets)
    return rulesets


_LOADED: dict[str, tuple[list, list[RuleSet]]] = {}


def _stamps(paths: Iterable[str | os.PathLike]) -> list[tuple[str, int, int]]:
    """Path, size and modification time of each file (-1 for a file that is gone)."""
    out = []
    for p in paths:
        try:
            st = os.stat(p)
            out.append((str(p), st.st_size, st.st_mtime_ns))
        except OSError:
            out.append((str(p), -1, -1))
    return out


def load_rules(paths: Iterable[str | os.PathLike] | None = None, level: int = MAX_LEVEL,
               names: Iterable[str] | None = None) -> list[Rule]:
    """The rules at or below `level` (only `names` when given; a named rule above it is an error)."""
    if not 0 <= level <= MAX_LEVEL:
        raise SaturateError(f"--level must be 0 to {MAX_LEVEL}, not {level}")
    rules = [r for rs in load_rulesets(paths) for r in rs.rules]
    if names is None:
        return [r for r in rules if r.level <= level]
    by_name = {r.name: r for r in rules}
    picked = []
    for name in names:
        if name not in by_name:
            raise SaturateError(f"no rule named '{name}'")
        r = by_name[name]
        if r.level > level:
            raise SaturateError(f"rule '{name}' is level {r.level} but --level is {level} ({r.loc})")
        picked.append(r)
    return picked


format_term = checks.format_term
format_rule = checks.format_rule
