"""Output files: written whole or not at all (a temp file beside the target, then a rename)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable

from saturate.core.errors import SaturateError


def write_atomic(path: str | os.PathLike, write: Callable[[BinaryIO], None]) -> None:
    """Call `write` on a temp file in the target's folder, then rename it over the target.

    A failure (or an interrupt) anywhere leaves no half-written output and no temp file.
    """
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.is_dir():
        raise SaturateError(f"{path}: directory '{directory}' does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
