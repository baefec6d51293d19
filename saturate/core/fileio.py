"""Output files: written whole or not at all (a temp file beside the target, then a rename), never
over one of the command's inputs, and the outputs of one command renamed into place together."""

from __future__ import annotations

import contextvars
import mmap
import os
import re
import signal
import stat
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Callable, Iterable, Iterator

from saturate.core.errors import SaturateError


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether two paths name one file: the same path once `.`, `..` and symbolic links are
    resolved, or (both existing) the same inode, which also catches hard links."""
    return not set(_keys(a)).isdisjoint(_keys(b))


def check_writable(path: str | os.PathLike, *, inputs: Iterable[str | os.PathLike] = ()) -> Path:
    """Refuse an output path before any work is done: a folder that is missing or takes no new
    file (tried: a temp file is made there and removed), a directory or anything else that is not
    a regular file (a rename would replace a device or a FIFO), or one of the command's own
    inputs (inputs are never changed). Returns the path."""
    target = _check_target(path)
    _probe(path)
    for source in inputs:
        if os.path.exists(source) and same_file(source, target):
            raise SaturateError(f"{path}: is the input '{source}'; inputs are never overwritten, choose another output")
    return target


def _check_target(path: str | os.PathLike) -> Path:
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    if target.is_dir():
        raise SaturateError(f"{path}: is a directory; give a file name")
    if not directory.is_dir():
        raise SaturateError(f"{path}: directory '{directory}' does not exist")
    if os.path.lexists(target) and not target.is_symlink() and not stat.S_ISREG(os.lstat(target).st_mode):
        raise SaturateError(f"{path}: not a regular file; outputs replace only regular files")
    return target


def _probe(path: str | os.PathLike) -> None:
    """Make and remove a temp file beside `path`: the folder takes new files (not read-only, not
    full of inodes, not a /proc), which no permission bit tells for sure."""
    target = Path(path)
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{target.name}.{os.getpid()}.", suffix=".tmp",
                                     dir=target.parent if str(target.parent) else ".")
    except OSError as err:
        raise SaturateError(f"{path}: cannot write: {err.strerror or err}") from None
    os.close(fd)
    _remove(probe)


def _keys(path: str | os.PathLike) -> list[tuple[str, object]]:
    """What identifies a file for same_file: its resolved path and, if it exists, its inode."""
    keys: list[tuple[str, object]] = [("path", os.path.realpath(path))]
    try:
        info = os.stat(path)
        keys.append(("inode", (info.st_dev, info.st_ino)))
    except OSError:
        pass
    return keys


def check_outputs(outputs: Iterable[tuple[str, str | os.PathLike | None]],
                  inputs: Iterable[str | os.PathLike]) -> None:
    """Refuse, before any work, a set of outputs (pairs of how each is named on the command line
    and its path; None for one not asked for) where one is unwritable, is one of `inputs`, or is
    the same file as another (as same_file decides)."""
    read = {key: source for source in inputs if os.path.exists(source) for key in _keys(source)}
    written: dict[tuple[str, object], tuple[str, str | os.PathLike]] = {}
    probed: set[str] = set()
    for flag, path in outputs:
        if path is None:
            continue
        _check_target(path)
        folder = os.path.realpath(os.path.dirname(path) or ".")
        if folder not in probed:  # a batch's outputs share one folder
            _probe(path)
            probed.add(folder)
        keys = _keys(path)
        for key in keys:
            if key in read:
                raise SaturateError(f"{path}: is the input '{read[key]}'; inputs are never overwritten, "
                                    "choose another output")
            if key in written:
                other_flag, other = written[key]
                raise SaturateError(f"{path}: {flag} is the same file as {other_flag} '{other}'; "
                                    "give each output its own file")
        written.update((key, (flag, path)) for key in keys)


def model_files(spec: str) -> list[str]:
    """The files loading the model `spec` reads: the file itself and, for ONNX, the external data
    files its tensors name (resolved in the model's folder, as the loader does); none for a
    built-in name (example:, corpus:) or a path that is no regular file."""
    if not os.path.isfile(spec):
        return []
    files = [spec]
    if Path(spec).suffix.lower() in (".sat", ".txt"):
        return files
    folder = Path(spec).resolve().parent
    try:
        # Non-blocking: a path swapped for a FIFO since the check above must not hang the open.
        fd = os.open(spec, os.O_RDONLY | os.O_NONBLOCK)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return files
            with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as data:
                locations = _external_locations(data)
        finally:
            os.close(fd)
    except (OSError, ValueError, IndexError, RecursionError):  # empty, unreadable or no protobuf: the load says so
        return files
    files += [str(folder / loc) for loc in locations if loc and "\0" not in loc]
    return list(dict.fromkeys(files))


# Where ONNX keeps tensors, as protobuf field numbers: ModelProto.graph; GraphProto's node,
# initializer and sparse_initializer; NodeProto.attribute; AttributeProto's t, g, tensors, graphs,
# sparse_tensor, sparse_tensors; SparseTensorProto's values and indices; TensorProto's
# external_data (entries of key and value) and data_location (1: external).
_MODEL_GRAPH, _GRAPH_NODE, _GRAPH_INIT, _GRAPH_SPARSE = 7, 1, 5, 15
_NODE_ATTR = 5
_ATTR_TENSOR, _ATTR_GRAPH, _ATTR_TENSORS, _ATTR_GRAPHS, _ATTR_SPARSE, _ATTR_SPARSES = 5, 6, 10, 11, 22, 23
_SPARSE_VALUES, _SPARSE_INDICES = 1, 2
_TENSOR_EXTERNAL_DATA, _TENSOR_DATA_LOCATION = 13, 14


def _external_locations(data) -> list[str]:
    """The `location` of every external tensor in a serialized ONNX model, found by walking the
    protobuf's field headers only: the weights' bytes are skipped, never read or copied, so this
    costs a few milliseconds however large the file."""
    found: list[str] = []

    def fields(start: int, end: int):
        pos = start
        while pos < end:
            key, pos = _varint(data, pos)
            wire = key & 7
            if wire == 0:
                value, pos = _varint(data, pos)
                yield key >> 3, value, None
            elif wire == 2:
                size, pos = _varint(data, pos)
                if pos + size > end:
                    raise ValueError("field runs past its message")
                yield key >> 3, pos, pos + size
                pos += size
            elif wire in (1, 5):
                pos += 8 if wire == 1 else 4
            else:
                raise ValueError("not a protobuf message")

    def tensor(start: int, end: int) -> None:
        external, location = False, None
        for number, a, b in fields(start, end):
            if number == _TENSOR_DATA_LOCATION and b is None:
                external = a == 1
            elif number == _TENSOR_EXTERNAL_DATA and b is not None:
                entry = {k: bytes(data[x:y]) for k, x, y in fields(a, b) if y is not None}
                if entry.get(1) == b"location":
                    location = entry.get(2, b"").decode("utf-8", "replace")
        if external and location is not None:
            found.append(location)

    def sparse(start: int, end: int) -> None:
        for number, a, b in fields(start, end):
            if number in (_SPARSE_VALUES, _SPARSE_INDICES) and b is not None:
                tensor(a, b)

    def graph(start: int, end: int, depth: int) -> None:
        if depth > 64:
            raise RecursionError("subgraphs nested too deeply")
        for number, a, b in fields(start, end):
            if b is None:
                continue
            if number == _GRAPH_INIT:
                tensor(a, b)
            elif number == _GRAPH_SPARSE:
                sparse(a, b)
            elif number == _GRAPH_NODE:
                for n, x, y in fields(a, b):
                    if n == _NODE_ATTR and y is not None:
                        attribute(x, y, depth)

    def attribute(start: int, end: int, depth: int) -> None:
        for number, a, b in fields(start, end):
            if b is None:
                continue
            if number in (_ATTR_TENSOR, _ATTR_TENSORS):
                tensor(a, b)
            elif number in (_ATTR_SPARSE, _ATTR_SPARSES):
                sparse(a, b)
            elif number in (_ATTR_GRAPH, _ATTR_GRAPHS):
                graph(a, b, depth + 1)

    for number, a, b in fields(0, len(data)):
        if number == _MODEL_GRAPH and b is not None:
            graph(a, b, 0)
    return found


def _varint(data, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# Outputs written inside a `written_together` block: (temp file, target, path as given).
_STAGED: contextvars.ContextVar[list[tuple[str, Path, str]] | None] = contextvars.ContextVar("staged", default=None)


@contextmanager
def written_together(inputs: Iterable[str | os.PathLike] = ()) -> Iterator[list[str | os.PathLike]]:
    """Within the block, write_atomic leaves each output in its temp file; when the block ends
    they are renamed into place one after the other, signals held back meanwhile. An error or an
    interrupt anywhere in the block removes the temp files and leaves every target as it was.

    Yields the list of inputs, which the block may extend (files found only once read, such as
    included rules): no output may replace any of them, checked again before the renames."""
    staged: list[tuple[str, Path, str]] = []
    known = list(inputs)
    token = _STAGED.set(staged)
    try:
        yield known
        _rename_all(staged, known)
    finally:
        _STAGED.reset(token)
        for tmp, _, _ in staged:
            _remove(tmp)


def _rename_all(staged: list[tuple[str, Path, str]], inputs: list[str | os.PathLike]) -> None:
    for k, (_, target, shown) in enumerate(staged):
        for source in inputs:
            if os.path.exists(source) and same_file(source, target):
                raise SaturateError(f"{shown}: is the input '{source}'; inputs are never overwritten, "
                                    "choose another output")
        for _, other, other_shown in staged[:k]:
            if same_file(other, target):
                raise SaturateError(f"{shown}: written twice in one run (also as '{other_shown}'); "
                                    "give each output its own file")
    held = {signal.SIGINT, signal.SIGTERM}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        while staged:
            tmp, target, shown = staged[0]
            try:
                os.replace(tmp, target)
            except OSError as err:
                raise SaturateError(f"{shown}: cannot write: {err.strerror or err}") from None
            staged.pop(0)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def write_atomic(path: str | os.PathLike, write: Callable[[BinaryIO], None], adopt: str | None = None) -> None:
    """Call `write` on a temp file in the target's folder, then rename it over the target (at the
    end of the enclosing `written_together` block, if any). With `adopt`, the temp file is that
    one, already begun (by core.mapped.Arena, named as ours are, in the target's folder), and
    `write` appends to it.

    A failure (or an interrupt) anywhere leaves no half-written output and no temp file. The
    file gets the permissions the umask gives a new file (a temp file starts private). Stale temp
    files an earlier run left in the folder (killed before it could remove them) are swept first.
    """
    target = _check_target(path)
    directory = target.parent if str(target.parent) else Path(".")
    sweep_stale_temps(directory)
    try:
        if adopt is not None:
            tmp = adopt
            fd = os.open(tmp, os.O_RDWR | os.O_CLOEXEC)
            os.lseek(fd, 0, os.SEEK_END)
        else:
            fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.{os.getpid()}.", suffix=".tmp", dir=directory)
    except OSError as err:
        if adopt is not None:
            _remove(adopt)
        raise SaturateError(f"{path}: cannot write: {err.strerror}") from None
    try:
        with os.fdopen(fd, "r+b" if adopt is not None else "wb") as f:
            f.seek(0, os.SEEK_END)
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        staged = _STAGED.get()
        if staged is not None:
            staged.append((tmp, target, str(path)))
            return
        os.replace(tmp, target)
    except OSError as err:
        _remove(tmp)
        raise SaturateError(f"{path}: cannot write: {err.strerror or err}") from None
    except BaseException:
        _remove(tmp)
        raise


# write_atomic's temp files: `.NAME.PID.XXXXXXXX.tmp` (mkstemp's eight random characters).
_TEMP = re.compile(r"\..+\.(\d+)\.[a-z0-9_]{8}\.tmp")
# A temp file nobody has written to for this long is stale even if its pid runs (a reused pid, or
# a writer on another machine sharing the folder); a live writer keeps its file's mtime recent.
STALE_SECONDS = 3600.0


def sweep_stale_temps(directory: str | os.PathLike) -> list[str]:
    """Remove our temp files in `directory` that no one will finish: left by a process that is
    gone (a SIGKILL, a power cut), or untouched for STALE_SECONDS. Only regular files of this
    user that match write_atomic's pattern; never this process's own. Returns the names removed."""
    removed = []
    now = time.time()
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return []
    for entry in entries:
        match = _TEMP.fullmatch(entry.name)
        if not match:
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
            continue
        pid = int(match.group(1))
        if pid == os.getpid() or (_running(pid) and now - info.st_mtime < STALE_SECONDS):
            continue
        try:
            os.unlink(entry.path)
            removed.append(entry.name)
        except OSError:
            pass
    return removed


def _running(pid: int) -> bool:
    if pid <= 0:  # os.kill(0, ...) would ask about our own process group
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:  # another user's process
        return True
    return True
