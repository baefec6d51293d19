"""The weights blob of a compiled model (weights.bin), kept on disk as the emitter makes it.

A model's weights are as large as the model (gigabytes for a decoder): held in memory, then
joined into one bytes object, they took two or three times the model's size to compile. The
blob is a run of float32 arrays; each is hashed as it arrives (the build's key needs the hash
first) and, once the blob passes SPILL_BYTES, written to an unlinked temp file, from which the
build copies it into weights.bin.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import BinaryIO

import numpy as np

from saturate.core.errors import SaturateError
from saturate.core.mapped import BLOCK_BYTES, SPILL_BYTES


class WeightsBlob:
    """The bytes of weights.bin, appended an array at a time."""

    def __init__(self) -> None:
        self._hash = hashlib.sha256()
        self._held: list[bytes | memoryview] = []   # the start of the blob, until it is spilled
        self._file: BinaryIO | None = None
        self.nbytes = 0

    def append(self, data: np.ndarray) -> None:
        """Add a contiguous array's bytes at the end of the blob (the caller keeps its offset)."""
        view = memoryview(np.ascontiguousarray(data)).cast("B")
        self._hash.update(view)
        self.nbytes += len(view)
        if self._file is None and self.nbytes < SPILL_BYTES:
            self._held.append(bytes(view))
            return
        try:
            if self._file is None:
                self._file = tempfile.TemporaryFile(prefix="saturate-weights-")
                for part in self._held:
                    self._file.write(part)
                self._held = []
            for k in range(0, len(view), BLOCK_BYTES):
                self._file.write(view[k:k + BLOCK_BYTES])
        except OSError as err:
            raise SaturateError(f"cannot hold a compiled model's weights in a temp file: {err.strerror or err}; "
                                "free some space or point TMPDIR at a larger folder") from None

    def digest(self) -> bytes:
        """The sha256 of the blob's bytes."""
        return self._hash.copy().digest()

    def write_to(self, path: Path) -> None:
        """Write the blob to a new file at `path` (OSError as the file system gives it)."""
        if self._file is None:
            path.write_bytes(b"".join(self._held))
            return
        self._file.flush()
        with open(path, "wb") as out:
            _copy(self._file, out, self.nbytes)


def _copy(src: BinaryIO, dst: BinaryIO, nbytes: int) -> None:
    """The first `nbytes` of `src` into `dst`: copied by the system (sendfile) where it can."""
    done = 0
    try:
        while done < nbytes:
            n = os.sendfile(dst.fileno(), src.fileno(), done, nbytes - done)
            if n == 0:
                break
            done += n
    except OSError:
        if done:
            raise
    if done < nbytes:           # no sendfile between these files: through a buffer
        src.seek(done)
        dst.seek(done)
        shutil.copyfileobj(src, dst, BLOCK_BYTES)
