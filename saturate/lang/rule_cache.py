"""The rule cache: a load of rules files kept on disk as JSON of its AST, so the next process
skips parsing and checking them.

Whoever can write the cache folder chooses what a later load reads, so an entry is data that
cannot run code when read, and is used only after every check passes: its name carries the
sha256 of its bytes, its JSON must have the exact shape of the AST (every field of the type
saturate.lang.ast declares, names spelled as the grammar allows), and every file it was built
from must still have the digest recorded. Anything else is a miss: the files are parsed again
and the entry rewritten. A cache folder that is missing, read-only or not a folder only costs
the parse."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
import re
import tempfile
import time
import types
import typing
from pathlib import Path
from typing import Any, Callable, Iterable, Union

from saturate.core.errors import SaturateError
from saturate.core.inputs import read_regular
from saturate.lang import ast
from saturate.lang.ast import RuleSet

FORMAT = 1
# The standard library's entry takes a few hundred KiB; a larger file is not one of ours.
MAX_ENTRY_BYTES = 64 << 20
# Entries of one key tried at most: a write removes the key's other entries, so more than one is
# a writer racing another or something planted.
_MAX_CANDIDATES = 4


def cache_dir() -> Path | None:
    """$XDG_CACHE_HOME/saturate/rules (~/.cache without it); None when there is no home."""
    base = os.environ.get("XDG_CACHE_HOME")
    if not base or not os.path.isabs(base):   # the XDG spec ignores a relative path
        try:
            base = str(Path.home() / ".cache")
        except (RuntimeError, KeyError):
            return None
    return Path(base) / "saturate" / "rules"


@functools.lru_cache(maxsize=None)
def code_digest() -> str:
    """What a load's result depends on besides the files: this package's code and the ONNX
    schemas its checks read."""
    import onnx

    h = hashlib.sha256(onnx.__version__.encode())
    for p in sorted(Path(__file__).parent.glob("*")):
        if p.suffix in (".py", ".lark"):
            h.update(p.read_bytes())
    return h.hexdigest()


def entry_key(files: Iterable[Path]) -> str:
    """The key of a load of `files` (in order)."""
    # Messages name files relative to the working directory, so it is part of the key.
    text = "\n".join([code_digest(), os.getcwd(), *(str(Path(f).resolve()) for f in files)])
    return hashlib.sha256(text.encode()).hexdigest()


def _file_digest(path: str | os.PathLike, max_bytes: int) -> str:
    return hashlib.sha256(read_regular(path, max_bytes, "rules file")).hexdigest()


# ---- reading -------------------------------------------------------------------------------------

class _Malformed(Exception):
    """An entry whose JSON is not the shape of the AST."""


def read(key: str, max_file_bytes: int) -> tuple[list[str], list[RuleSet]] | None:
    """The files an entry of `key` read and its rulesets, or None (a miss) unless the entry's
    bytes have the digest its name records, its JSON decodes to rulesets, and every file it read
    still has the digest it had."""
    folder = cache_dir()
    if folder is None:
        return None
    for path in _candidates(folder, key):
        got = _read_entry(path, max_file_bytes)
        if got is not None:
            return got
    return None


def _candidates(folder: Path, key: str, limit: int | None = _MAX_CANDIDATES) -> list[Path]:
    try:
        names = [e.name for e in os.scandir(folder) if e.name.startswith(key + "-") and e.name.endswith(".json")]
    except OSError:
        return []
    return [folder / n for n in sorted(names)[:limit]]


def _read_entry(path: Path, max_file_bytes: int) -> tuple[list[str], list[RuleSet]] | None:
    digest = path.name[len(path.name) - len(".json") - 64:-len(".json")]
    try:
        data = read_regular(path, MAX_ENTRY_BYTES, "rule cache entry")
        if hashlib.sha256(data).hexdigest() != digest:
            return None
        files, rulesets = _decode_entry(json.loads(data.decode("utf-8")))
        for p, d in files:
            if _file_digest(p, max_file_bytes) != d:
                return None
    except (SaturateError, OSError, ValueError, RecursionError, _Malformed):
        return None
    try:
        os.utime(path)  # a use: what _sweep goes by
    except OSError:
        pass
    return [p for p, _ in files], rulesets


_HEX64 = re.compile(r"[0-9a-f]{64}")


def _decode_entry(obj: Any) -> tuple[list[tuple[str, str]], list[RuleSet]]:
    if not isinstance(obj, dict) or set(obj) != {"format", "files", "rulesets"} or obj["format"] != FORMAT:
        raise _Malformed("not an entry")
    files = obj["files"]
    if not isinstance(files, list) or not all(
            isinstance(f, list) and len(f) == 2 and type(f[0]) is str and os.path.isabs(f[0])
            and "\0" not in f[0] and type(f[1]) is str and _HEX64.fullmatch(f[1]) for f in files):
        raise _Malformed("files")
    rulesets = _ast_decoders()["RuleSet"]
    return [(p, d) for p, d in files], [rulesets(r) for r in _list(obj["rulesets"])]


# Strings the engine writes into egglog programs and messages: an entry must spell them as the
# grammar does, as a parse would have (rules.lark's OPNAME, NAME, RULENAME and STRING).
_OPNAME = re.compile(r"[A-Z][A-Za-z0-9_]*")
_NAME = re.compile(r"[a-z_][A-Za-z0-9_]*")
_RULENAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
_SPELLING: dict[tuple[str, str], re.Pattern[str]] = {
    ("OpTerm", "op"): _OPNAME, ("Var", "name"): _NAME, ("AttrVar", "name"): _NAME,
    ("Call", "fn"): _NAME, ("Rule", "name"): _RULENAME, ("Rule", "ruleset"): _RULENAME,
    ("RuleSet", "name"): _RULENAME, ("Str", "value"): re.compile(r'[^"\n]*'),
}
# The comparisons a Guard names besides the functions of builtins.
_GUARD_FN = re.compile(r"[a-z_][A-Za-z0-9_]*|==|!=|<=|>=|<|>")
_SPELLING[("Guard", "fn")] = _GUARD_FN


def _ast_classes() -> dict[str, type]:
    return {name: obj for name, obj in vars(ast).items()
            if isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__module__ == ast.__name__}


def _list(v: Any) -> list:
    if type(v) is not list:
        raise _Malformed("expected a list")
    return v


# What a plain value's JSON must not be, as an expression of the value `{x}`.
_PLAIN_CHECKS = {
    str: "type({x}) is not str",
    bool: "type({x}) is not bool",
    # As a parse gives them: int64 (parser._check_numbers), finite floats.
    int: "type({x}) is not int or not -9223372036854775808 <= {x} <= 9223372036854775807",
    float: "type({x}) is not float or not _finite({x})",
}


@functools.lru_cache(maxsize=None)
def _ast_decoders() -> dict[str, Callable[[Any], Any]]:
    """A function per AST class that turns its JSON into the object, raising _Malformed for
    anything else, written out as Python: the standard library's entry is about 5,600 objects,
    and a generic decoder's calls per field (a closure for each check, a loop over the fields)
    were most of what reading it cost. The functions' text comes from the classes' fields and
    annotations alone (names that must be identifiers): an entry's values are only ever data
    they check."""
    classes = _ast_classes()
    writer = _Writer(classes)
    text = "".join([writer.decoder(cls) for cls in classes.values()])
    text += "".join(writer.helpers)
    env = writer.env
    exec(compile(text, "<rule cache decoders>", "exec"), env)
    for tags, names in writer.tags:
        tags.update((n, env[f"decode_{n}"]) for n in names)
    return {name: env[f"decode_{name}"] for name in classes}


class _Writer:
    """The text of _ast_decoders' functions; `env` holds what they name besides each other."""

    def __init__(self, classes: dict[str, type]):
        self.classes = classes
        self.env: dict[str, Any] = {"_Malformed": _Malformed, "_new": object.__new__, "_finite": math.isfinite,
                                    "_tuple": tuple}
        self.helpers: list[str] = []            # the functions of unions and tuples
        self.names: dict[Any, str] = {}          # their names, by type
        self.tags: list[tuple[dict[str, Any], tuple[str, ...]]] = []

    def _is_class(self, hint: Any) -> bool:
        return isinstance(hint, type) and self.classes.get(hint.__name__) is hint

    def decoder(self, cls: type) -> str:
        fields = [f for f in dataclasses.fields(cls) if f.init]
        hints = typing.get_type_hints(cls, vars(ast))
        name = cls.__name__
        if not name.isidentifier() or not all(f.name.isidentifier() for f in fields):
            raise TypeError(f"the rule cache cannot store {name}")
        self.env[f"_class_{name}"] = cls
        values = [f"a{k}" for k in range(len(fields))]
        body = [f"if type(v) is not list or len(v) != {len(fields) + 1} or v[0] != {name!r}:",
                f"    raise _Malformed('expected {name}')",
                f"_, {''.join(x + ', ' for x in values)}= v"]
        for f, x in zip(fields, values):
            body += self.check(hints[f.name], x, f"{name}.{f.name}", _SPELLING.get((name, f.name)))
        # Every field is decoded and checked above, so a plain dataclass is filled without its
        # __init__ (a third of the time); one with more to its construction goes through it.
        if (len(fields) == len(dataclasses.fields(cls)) and not hasattr(cls, "__post_init__")
                and not hasattr(cls, "__slots__")):
            filled = ", ".join(f"{f.name!r}: {x}" for f, x in zip(fields, values))
            body += [f"o = _new(_class_{name})", f"o.__dict__.update({{{filled}}})", "return o"]
        else:
            body += [f"return _class_{name}({', '.join(values)})"]
        return f"def decode_{name}(v):\n" + "".join(f"    {line}\n" for line in body)

    def check(self, hint: Any, x: str, where: str, spelling: re.Pattern[str] | None = None) -> list[str]:
        """Lines that check the JSON value in variable `x` against `hint` and leave the value
        it stands for there."""
        fail = f"    raise _Malformed({where!r})"
        origin, args = typing.get_origin(hint), typing.get_args(hint)
        if hint in _PLAIN_CHECKS:
            lines = [f"if {_PLAIN_CHECKS[hint].format(x=x)}:", fail]
            if spelling is not None:
                key = f"_spelled_{where.replace('.', '_')}"
                self.env[key] = spelling.fullmatch
                lines += [f"if not {key}({x}):", fail]
            return lines
        if spelling is not None:
            raise TypeError(f"the rule cache spells only strings, not {where}")
        if origin in (Union, types.UnionType) and all(a in _PLAIN_CHECKS for a in args):
            # Members in turn (int | float): the value is none of them.
            return [f"if {' and '.join(f'({_PLAIN_CHECKS[a].format(x=x)})' for a in args)}:", fail]
        if origin in (Union, types.UnionType) and type(None) in args:
            rest = tuple(a for a in args if a is not type(None))
            return [f"if {x} is not None:", *(f"    {line}" for line in self.check(
                rest[0] if len(rest) == 1 else Union[rest], x, where))]
        if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
            return [f"if type({x}) is not list:", fail, f"{x} = _tuple([{self.function(args[0])}(y) for y in {x}])"]
        if self._is_class(hint) or origin in (Union, types.UnionType, tuple):
            return [f"{x} = {self.function(hint)}({x})"]
        raise TypeError(f"the rule cache cannot store {hint!r}")

    def function(self, hint: Any) -> str:
        """The name of a function that decodes `hint`: a class's own, or one written for it (for
        a union of classes, a dispatch on the class name an entry writes first)."""
        if self._is_class(hint):
            return f"decode_{hint.__name__}"
        if hint in self.names:
            return self.names[hint]
        name = self.names[hint] = f"decode_{len(self.names)}"
        origin, args = typing.get_origin(hint), typing.get_args(hint)
        if origin in (Union, types.UnionType) and all(self._is_class(a) for a in args):
            tags: dict[str, Any] = {}
            self.env[f"_tags_{name}"] = tags
            self.tags.append((tags, tuple(a.__name__ for a in args)))
            members = ", ".join(a.__name__ for a in args)
            self.helpers.append(f"def {name}(v):\n    try:\n        d = _tags_{name}[v[0]]\n"
                                f"    except (TypeError, KeyError, IndexError):\n"
                                f"        raise _Malformed('expected one of {members}') from None\n"
                                f"    return d(v)\n")
        elif origin is tuple and args and args[-1] is not Ellipsis:
            values = [f"a{k}" for k in range(len(args))]
            body = [f"if type(v) is not list or len(v) != {len(args)}:", "    raise _Malformed('expected a tuple')",
                    f"{''.join(x + ', ' for x in values)}= v"]
            for a, x in zip(args, values):
                body += self.check(a, x, f"tuple item of {name}")
            body.append(f"return ({''.join(x + ', ' for x in values)})")
            self.helpers.append(f"def {name}(v):\n" + "".join(f"    {line}\n" for line in body))
        else:
            body = self.check(hint, "v", f"item of {name}") + ["return v"]
            self.helpers.append(f"def {name}(v):\n" + "".join(f"    {line}\n" for line in body))
        return name


# ---- writing -------------------------------------------------------------------------------------

def _encode(v: Any) -> Any:
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return [type(v).__name__, *(_encode(getattr(v, f.name)) for f in dataclasses.fields(v) if f.init)]
    if isinstance(v, (tuple, list)):
        return [_encode(x) for x in v]
    if v is None or type(v) in (bool, int, float, str):
        return v
    raise TypeError(f"the rule cache cannot store {type(v).__name__}")


# A writer's temp file untouched this long was left by a killed process: no write takes minutes.
STALE_SECONDS = 600.0
# An entry not read for this long goes: a key names the package's code and the working directory, so an
# upgrade, or loads from many folders, leave entries nothing will read again.
UNUSED_SECONDS = 14 * 24 * 3600.0


def _sweep(folder: Path) -> None:
    """Remove what killed writers left in the folder (temp files, `.KEY.XXXXXXXX.tmp`), entries not
    read for UNUSED_SECONDS (a read refreshes an entry's mtime), and the entries of the pickle format,
    which nothing reads any more."""
    now = time.time()
    for e in os.scandir(folder):
        try:
            age = now - e.stat(follow_symlinks=False).st_mtime
            if e.name.endswith(".pickle") or (e.name.startswith(".") and e.name.endswith(".tmp") and age > STALE_SECONDS) \
                    or (not e.name.startswith(".") and e.name.endswith(".json") and age > UNUSED_SECONDS):
                os.unlink(e.path)
        except OSError:
            continue


def write(key: str, read: list[Path], rulesets: list[RuleSet], max_file_bytes: int) -> None:
    """Keep a load on disk: written to a fresh temp file, then renamed to `key-DIGEST.json`.
    Every failure is silent: the cache only saves time."""
    folder = cache_dir()
    if folder is None:
        return
    tmp = None
    try:
        obj = {"format": FORMAT, "files": [[str(p), _file_digest(p, max_file_bytes)] for p in read],
               "rulesets": _encode(rulesets)}
        data = json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(prefix=f".{key}.", suffix=".tmp", dir=folder)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        final = folder / f"{key}-{hashlib.sha256(data).hexdigest()}.json"
        os.replace(tmp, final)
        tmp = None
        for old in _candidates(folder, key, limit=None):
            if old != final:
                old.unlink(missing_ok=True)
        _sweep(folder)
    except (OSError, SaturateError, TypeError, ValueError):
        pass
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
