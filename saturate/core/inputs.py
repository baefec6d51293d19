"""Input files: only regular files are opened, and only up to a size. A FIFO, a device or a
directory named as a model, a rules file, an include or a target would hang a read or never end
one, and a huge file would fill memory: each is refused in one line before anything is read."""

from __future__ import annotations

import os
import stat
from typing import BinaryIO

from saturate.core.errors import SaturateError
from saturate.core.limits import format_bytes

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


class RefusedFile(SaturateError):
    """An input file that is not read. `reason` says why without naming the file, so a caller can
    put its own place in front (an include names the line that includes it)."""

    def __init__(self, path: str | os.PathLike, what: str, reason: str):
        self.path, self.what, self.reason = os.fspath(path), what, reason
        super().__init__(f"{what} '{self.path}': {reason}")


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a file")


def _check(path: str | os.PathLike, st: os.stat_result, max_bytes: int, what: str) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise RefusedFile(path, what, f"not a regular file ({_kind(st.st_mode)})")
    if st.st_size > max_bytes:
        raise RefusedFile(path, what, f"{format_bytes(st.st_size)}, over the {format_bytes(max_bytes)} "
                                      f"a {what} may take")


def open_regular(path: str | os.PathLike, max_bytes: int, what: str) -> BinaryIO:
    """Open `path` for reading in binary mode if it is a regular file of at most `max_bytes`;
    otherwise raise RefusedFile (a SaturateError) naming `what` ("model", "rules file") and why.

    The file is checked before it is opened (opening some devices does something) and again on
    the open descriptor (the path may have changed in between). The open never blocks: a FIFO
    with no writer would hold a plain open forever. A file may still grow after the check, and
    some (under /proc) say they hold 0 bytes: read with a bound, as `read_regular` does."""
    try:
        _check(path, os.stat(path), max_bytes, what)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as err:
        raise RefusedFile(path, what, err.strerror or str(err)) from None
    try:
        _check(path, os.fstat(fd), max_bytes, what)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | os.PathLike, max_bytes: int, what: str) -> bytes:
    """The bytes of `path` if it is a regular file of at most `max_bytes` (see open_regular);
    a file that turns out longer while it is read is refused too."""
    with open_regular(path, max_bytes, what) as f:
        try:
            data = f.read(max_bytes + 1)
        except OSError as err:
            raise RefusedFile(path, what, err.strerror or str(err)) from None
    if len(data) > max_bytes:
        raise RefusedFile(path, what, f"over the {format_bytes(max_bytes)} a {what} may take")
    return data
