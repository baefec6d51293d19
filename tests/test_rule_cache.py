"""The rule cache is data: an entry is JSON of the AST, used only when its digest, its shape and
the digests of the files it read all check out; anything else is parsed again, silently."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pickle
from pathlib import Path

import pytest

from saturate.lang import parser

RULES = ("ruleset mine level 1\nrule relu-relu Relu(Relu(x)) => Relu(x)\nrule neg-neg Neg(Neg(x)) => x\n"
         "rule twice Add(x, x) => Mul(x, 2.5)\n")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A private cache home and a fresh process's memory of loads."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(parser, "_LOADED", {})
    return tmp_path / "xdg" / "saturate" / "rules"


def _fresh(paths=None):
    """A load that reads no cache entry and keeps nothing in memory."""
    parser._LOADED.clear()
    return parser.load_rulesets(paths)


def _entries(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if not p.name.startswith("."))


def _key(folder: Path) -> str:
    """The key of the only entry in the folder, whatever its format names it."""
    (entry,) = _entries(folder)
    return entry.name.split("-")[0].split(".")[0]


def _same(a, b) -> bool:
    # repr shows every field, the locations (compare=False) included.
    return repr(a) == repr(b)


class _Payload:
    """Unpickling this creates a marker file: proof that reading the cache ran code."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def test_a_pickle_planted_in_the_cache_is_never_loaded(cache, tmp_path):
    rules = tmp_path / "mine.rules"
    rules.write_text(RULES)
    want = _fresh([rules])
    key = _key(cache)
    marker = tmp_path / "ran"
    # Every name the cache ever used for this load: the entry's own and the old pickle name.
    for entry in [*_entries(cache), cache / f"{key}.pickle"]:
        entry.write_bytes(pickle.dumps(_Payload(marker)))
    got = _fresh([rules])
    assert not marker.exists()
    assert _same(got, want)


def test_the_standard_library_round_trips_through_the_cache(cache, monkeypatch):
    want = _fresh()
    (entry,) = _entries(cache)
    assert entry.suffix == ".json"
    assert entry.name.endswith(f"-{hashlib.sha256(entry.read_bytes()).hexdigest()}.json")
    # The second load must come from the entry: parsing is not allowed.
    monkeypatch.setattr(parser._Loader, "add_file", lambda *a, **k: pytest.fail("parsed, not cached"))
    got = _fresh()
    assert _same(got, want) and got == want


def _malformed(data: bytes) -> list[bytes]:
    """Entries that no write makes: each must be refused even under a name with its own digest."""
    obj = json.loads(data)
    bad_op = json.loads(data)
    bad_op["rulesets"][0][3][0][2][1] = "Relu) (rewrite (Neg x) x"   # an op no parse would give
    wrong_type = json.loads(data)
    wrong_type["rulesets"][0][2] = "1"                                # a level as a string
    missing = json.loads(data)
    del missing["rulesets"][0][3][0][-1]                              # a field short
    unknown = json.loads(data)
    unknown["rulesets"][0][3][0][2][0] = "Popen"                      # a class the AST does not have
    relative = json.loads(data)
    relative["files"][0][0] = "mine.rules"                            # a file the key does not fix
    numbers = []
    for value in (1 << 70, float("nan"), float("inf"), True):          # no literal a parse gives
        bad = json.loads(data)
        bad["rulesets"][0][3][2][3][2][1][1] = value                  # twice's 2.5
        numbers.append(bad)
    return [json.dumps(o).encode() for o in (bad_op, wrong_type, missing, unknown, relative, *numbers, [], {},
                                             obj["files"])] + [
        b"", b"\xff\xfe not utf-8", b"[" * 100_000 + b"]" * 100_000,
        b'{"format": 1, "files": ' + b"9" * 5000 + b"}", pickle.dumps(obj)]


def test_an_entry_with_a_wrong_digest_or_shape_is_a_miss_and_rebuilt(cache, tmp_path):
    rules = tmp_path / "mine.rules"
    rules.write_text(RULES)
    want = _fresh([rules])
    (entry,) = _entries(cache)
    assert entry.suffix == ".json"
    key, good = _key(cache), entry.read_bytes()
    other = json.loads(good)
    other["rulesets"][0][3][0][1] = "evil"                            # the first rule's name
    planted = [(entry, json.dumps(other).encode())]                   # other content, the old name
    for bad in _malformed(good):
        planted += [(entry, bad), (cache / f"{key}-{hashlib.sha256(bad).hexdigest()}.json", bad)]
    for path, bad in planted:
        for e in _entries(cache):
            e.unlink()
        path.write_bytes(bad)
        got = _fresh([rules])
        assert _same(got, want), bad[:80]
        # The rebuilt entry replaced the planted one.
        assert [e.read_bytes() for e in _entries(cache)] == [good]


@pytest.mark.timeout(20)
@pytest.mark.parametrize("kind", ["fifo", "directory", "device"])
def test_an_entry_that_is_not_a_regular_file_is_a_miss(cache, tmp_path, kind):
    rules = tmp_path / "mine.rules"
    rules.write_text(RULES)
    want = _fresh([rules])
    (entry,) = _entries(cache)
    assert entry.suffix == ".json"
    entry.unlink()
    if kind == "fifo":
        os.mkfifo(entry)
    elif kind == "directory":
        entry.mkdir()
    else:
        entry.symlink_to("/dev/zero")
    assert _same(_fresh([rules]), want)


def test_an_unusable_cache_home_costs_only_the_parse(tmp_path, monkeypatch):
    rules = tmp_path / "mine.rules"
    rules.write_text(RULES)
    monkeypatch.chdir(tmp_path)
    for home in ["file", "relative", "unset"]:
        monkeypatch.setattr(parser, "_LOADED", {})
        monkeypatch.setenv("HOME", str(tmp_path / home))
        if home == "file":
            (tmp_path / "xdg").write_text("not a folder")
            monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
        elif home == "relative":
            # The XDG spec ignores a relative path: nothing is written under the working directory.
            monkeypatch.setenv("XDG_CACHE_HOME", "rel")
        else:
            monkeypatch.delenv("XDG_CACHE_HOME")
            monkeypatch.delenv("HOME")
            monkeypatch.setattr(Path, "home", classmethod(lambda cls: (_ for _ in ()).throw(RuntimeError("no home"))))
        first = _fresh([rules])
        assert [r.name for rs in first for r in rs.rules] == ["relu-relu", "neg-neg", "twice"], home
        assert _same(_fresh([rules]), first), home
    assert not (tmp_path / "rel").exists()
    assert len(list((tmp_path / "relative" / ".cache" / "saturate" / "rules").glob("*.json"))) == 1


def test_a_write_sweeps_what_killed_writers_and_the_pickle_format_left(cache, tmp_path):
    rules = tmp_path / "mine.rules"
    rules.write_text(RULES)
    cache.mkdir(parents=True)
    stale, fresh, pickled = cache / ".abc.1234.tmp", cache / ".abd.x1y2z3w4.tmp", cache / ("0" * 64 + ".pickle")
    for p in (stale, fresh, pickled):
        p.write_bytes(b"left over")
    os.utime(stale, (0, 0))
    _fresh([rules])
    assert not stale.exists() and not pickled.exists()
    assert fresh.exists()   # a writer may still be at it


def test_entries_not_read_for_two_weeks_are_swept_and_a_read_keeps_one(cache, tmp_path):
    """A key names the code and the working directory, so an upgrade or loads from many folders strand
    entries: one not read for UNUSED_SECONDS goes at the next write; a read refreshes the one it uses."""
    import time

    from saturate.lang import rule_cache

    rules, other = tmp_path / "mine.rules", tmp_path / "other.rules"
    rules.write_text(RULES)
    other.write_text(RULES.replace("mine", "other"))
    _fresh([rules])
    (kept,) = _entries(cache)
    long_ago = time.time() - 2 * rule_cache.UNUSED_SECONDS
    os.utime(kept, (long_ago, long_ago))
    stranded = cache / ("f" * 64 + "-" + "0" * 64 + ".json")
    stranded.write_text("{}")
    os.utime(stranded, (long_ago, long_ago))
    _fresh([rules])   # a hit: read, so used
    assert kept.stat().st_mtime > long_ago
    _fresh([other])   # a miss: the write sweeps
    assert kept.exists() and not stranded.exists() and len(_entries(cache)) == 2


def _wrong(v):
    """A JSON value of another kind than `v`, that no field typed as `v` is may hold."""
    if type(v) is str:
        return 7
    if type(v) is bool:
        return 1
    if type(v) is int:
        return True                    # a bool is not an int to the AST
    if type(v) is float:
        return "2.5"
    if v is None:
        return 5
    return {"0": v}


def test_every_field_of_every_class_is_checked(cache):
    """The first object of each class in the standard library's entry, each field in turn given a
    value of another kind (or a name spelled as no parse gives it), one field short or one more:
    the entry is refused, not decoded."""
    from saturate.lang import rule_cache

    _fresh()
    (entry,) = _entries(cache)
    obj = json.loads(entry.read_bytes())
    firsts: dict[str, list] = {}
    stack = [obj["rulesets"]]
    while stack:
        v = stack.pop()
        if type(v) is list:
            if v and type(v[0]) is str and v[0] in rule_cache._ast_classes():
                firsts.setdefault(v[0], v)
            stack.extend(v)
    assert set(firsts) == set(rule_cache._ast_classes())
    assert rule_cache._decode_entry(obj)
    tried = 0
    for name, node in firsts.items():
        fields = [f.name for f in dataclasses.fields(rule_cache._ast_classes()[name])]
        for k in range(1, len(node)):
            spelled = (name, fields[k - 1]) in rule_cache._SPELLING
            for bad in [_wrong(node[k])] + (['x"\n'] if spelled else []):
                good, node[k] = node[k], bad
                with pytest.raises(rule_cache._Malformed):
                    rule_cache._decode_entry(obj)
                node[k] = good
                tried += 1
    for name, node in firsts.items():   # a field short, a field more
        for bad in (node[:-1], node + [None]):
            good = node[:]
            node[:] = bad
            with pytest.raises(rule_cache._Malformed):
                rule_cache._decode_entry(obj)
            node[:] = good
    assert tried > 40
    assert repr(rule_cache._decode_entry(obj)[1]) == repr(parser.load_rulesets())
