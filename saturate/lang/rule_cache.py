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
    return [(p, d) for p, d in files], _decoder(list[RuleSet])(obj["rulesets"])


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


@functools.lru_cache(maxsize=None)
def _decoder(hint: Any) -> Callable[[Any], Any]:
    """A function that turns JSON of type `hint` (a type of saturate.lang.ast's annotations) into
    the value, raising _Malformed for anything else. Built once per type."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is type(None):
        return _exact(lambda v: v is None)
    if hint is bool:
        return _exact(lambda v: type(v) is bool)
    if hint is int:   # as a parse gives them: int64 (parser._check_numbers), finite floats
        return _exact(lambda v: type(v) is int and -(1 << 63) <= v < (1 << 63))
    if hint is float:
        return _exact(lambda v: type(v) is float and math.isfinite(v))
    if hint is str:
        return _exact(lambda v: type(v) is str)
    if origin in (Union, types.UnionType):
        return _union(args)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        item = _decoder(args[0])
        return lambda v: tuple(item(x) for x in _list(v))
    if origin is tuple:
        items = [_decoder(a) for a in args]
        return lambda v: tuple(d(x) for d, x in zip(items, _list(v, len(items))))
    if origin is list and len(args) == 1:
        item = _decoder(args[0])
        return lambda v: [item(x) for x in _list(v)]
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _dataclass(hint)
    raise TypeError(f"the rule cache cannot store {hint!r}")


def _exact(ok: Callable[[Any], bool]) -> Callable[[Any], Any]:
    def decode(v: Any) -> Any:
        if not ok(v):
            raise _Malformed(f"unexpected {type(v).__name__}")
        return v

    return decode


def _list(v: Any, n: int | None = None) -> list:
    if type(v) is not list or (n is not None and len(v) != n):
        raise _Malformed("expected a list")
    return v


def _union(members: tuple[Any, ...]) -> Callable[[Any], Any]:
    # A dataclass is written as [class name, fields...]: its name picks the member, so decoding
    # never tries one member after another.
    tagged = {m.__name__: m for m in members if isinstance(m, type) and dataclasses.is_dataclass(m)}
    plain = [m for m in members if m not in tagged.values()]
    # Filled on first use: a member's decoder may need this union's (Term holds Terms).
    by_tag: dict[str, Callable[[Any], Any]] = {}

    def decode(v: Any) -> Any:
        if type(v) is list and v and type(v[0]) is str and v[0] in tagged:
            d = by_tag.get(v[0])
            if d is None:
                d = by_tag[v[0]] = _decoder(tagged[v[0]])
            return d(v)
        for m in plain:
            try:
                return _decoder(m)(v)
            except _Malformed:
                continue
        raise _Malformed("no member of the union")

    return decode


def _dataclass(cls: type) -> Callable[[Any], Any]:
    fields = [f for f in dataclasses.fields(cls) if f.init]
    hints = typing.get_type_hints(cls, vars(ast))
    decoders = [_decoder(hints[f.name]) for f in fields]
    # A field of a plain type is checked in line: most fields are, and a call each is most of the time.
    exact = [hints[f.name] if hints[f.name] in (str, bool) else None for f in fields]
    spelled = [(k, p) for k, p in enumerate(_SPELLING.get((cls.__name__, f.name)) for f in fields) if p]
    name, n, names = cls.__name__, len(fields) + 1, [f.name for f in fields]
    # Every field is decoded and checked here, so a plain dataclass is filled without its
    # __init__ (a third of the time); one with more to its construction goes through it.
    direct = (len(fields) == len(dataclasses.fields(cls)) and not hasattr(cls, "__post_init__")
              and not hasattr(cls, "__slots__"))

    def decode(v: Any) -> Any:
        if type(v) is not list or len(v) != n or v[0] != name:
            raise _Malformed(f"expected {name}")
        values = [x if type(x) is t else d(x) for t, d, x in zip(exact, decoders, v[1:])]
        for k, pattern in spelled:
            if type(values[k]) is not str or not pattern.fullmatch(values[k]):
                raise _Malformed(f"{name}: bad spelling")
        if direct:
            obj = object.__new__(cls)
            obj.__dict__.update(zip(names, values))
            return obj
        return cls(*values)

    return decode


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


def _sweep(folder: Path) -> None:
    """Remove what killed writers left in the folder: temp files (`.KEY.XXXXXXXX.tmp`), and the
    entries of the pickle format, which nothing reads any more."""
    now = time.time()
    for e in os.scandir(folder):
        try:
            if e.name.endswith(".pickle") or (e.name.startswith(".") and e.name.endswith(".tmp")
                                              and now - e.stat(follow_symlinks=False).st_mtime > STALE_SECONDS):
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
