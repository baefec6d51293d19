"""Output files: written whole or not at all (a temp file beside the target, then a rename)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable

from saturate.core.errors import SaturateError


def check_writable(path: str | os.PathLike, *, inputs: tuple[str, ...] = ()) -> Path:
    """Refuse an output path before any work is done: a missing folder, a directory, or one of the
    command's own inputs (inputs are never changed). Returns the path."""
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    if target.is_dir():
        raise SaturateError(f"{path}: is a directory; give a file name")
    if not directory.is_dir():
        raise SaturateError(f"{path}: directory '{directory}' does not exist")
    for source in inputs:
        if Path(source).exists() and target.exists() and os.path.samefile(source, target):
            raise SaturateError(f"{path}: is the input '{source}'; inputs are never overwritten, choose another output")
    return target


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomic(path: str | os.PathLike, write: Callable[[BinaryIO], None]) -> None:
    """Call `write` on a temp file in the target's folder, then rename it over the target.

    A failure (or an interrupt) anywhere leaves no half-written output and no temp file. The
    file gets the permissions the umask gives a new file (a temp file starts private).
    """
    target = check_writable(path)
    directory = target.parent if str(target.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    except OSError as err:
        raise SaturateError(f"{path}: cannot write: {err.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, target)
    except OSError as err:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise SaturateError(f"{path}: cannot write: {err.strerror or err}") from None
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
