"""C backend, the build cache: where compiled models are kept ($SATURATE_CACHE), its size limit,
and the eviction of the least recently used builds and of what killed processes left behind."""

from __future__ import annotations

import hashlib
import math
import os
import shutil
import stat
import time
from pathlib import Path

from saturate.core.errors import SaturateError
from saturate.core.inputs import RefusedFile, read_regular

# The cache's one copy of OpenBLAS is named SHARED_BLAS_PREFIX + its sha256: builds hard-link it rather than
# each hold tens of megabytes of their own.
SHARED_BLAS_PREFIX = "openblas-"


def cache_root() -> Path:
    """Where compiled models are kept ($SATURATE_CACHE, else ~/.cache/saturate/backend)."""
    return Path(os.environ.get("SATURATE_CACHE", Path.home() / ".cache" / "saturate" / "backend"))


# Each build holds its weights (VGG-11-BN's are 508 MB) and a build is keyed by them, so a cache that only
# grows fills the disk: builds past this many megabytes are evicted, least recently used first.
DEFAULT_CACHE_MB = 4096
# A build used this recently is never evicted: another process may be between building and loading it.
IN_USE_SECONDS = 120.0
# Sizing a cache of thousands of builds takes most of a second, so a build prunes at most this often;
# the cache may pass its limit by what is built in between.
PRUNE_EVERY_SECONDS = 30.0
# A staging or evicted directory (named with a leading dot) this old was left by a killed process.
STALE_SECONDS = 3600.0
# What every build shares (the binding object, the kernel library, the precompiled headers, the peak probe's
# figure) and the sources kept from failed compiles, by name prefix. Each is keyed by the kernels' sources,
# the flags, the compiler and the CPU, so upgrading any of them leaves the old ones behind for good (the
# precompiled headers are 28 MB a set); one unused for SUPPORT_STALE_SECONDS is removed by the next prune,
# with what shares its stem (its .sha256 and .lock).
SUPPORT_PREFIXES = ("binding-", "libsat-", "prelude-", "peak-", "failed-")
SUPPORT_STALE_SECONDS = 14 * 24 * 3600.0


def cache_limit_bytes() -> int:
    """The cache's size limit ($SATURATE_CACHE_MB megabytes, default DEFAULT_CACHE_MB)."""
    text = os.environ.get("SATURATE_CACHE_MB", "").strip()
    try:
        mb = float(text) if text else DEFAULT_CACHE_MB
    except ValueError:
        mb = math.nan
    if not math.isfinite(mb):      # float() reads 'inf' and 'nan' too, and int() of neither is a size
        raise SaturateError(f"SATURATE_CACHE_MB={text!r}: expected a number of megabytes")
    if mb < 0:
        raise SaturateError(f"SATURATE_CACHE_MB={text!r}: expected a number of megabytes, not a negative one")
    return int(mb * 1024 * 1024)


def _tree_bytes(directory: Path) -> int:
    """A build's share of the disk: a file hard-linked from several places (the OpenBLAS copy every build
    links to the cache's one) counts its size divided among its links."""
    total = 0
    for entry in os.scandir(directory):
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:  # removed by another process meanwhile
            continue
        total += st.st_size // max(st.st_nlink, 1)
    return total


def mark_used(directory: Path) -> None:
    """Record a build's use (its build.key's mtime), which orders eviction."""
    mark_support_used(directory / "build.key")


def mark_support_used(path: Path) -> None:
    """Record the use of a shared cache entry (its mtime), which keeps it from being pruned as stale."""
    try:
        os.utime(path)
    except OSError:
        pass


def prune_due(now: float | None = None) -> bool:
    """Whether PRUNE_EVERY_SECONDS have passed since the cache was last pruned (by any process); claims
    the turn when they have."""
    stamp = cache_root() / "last-prune"
    now = time.time() if now is None else now
    try:
        if now - stamp.stat().st_mtime < PRUNE_EVERY_SECONDS:
            return False
    except OSError:
        pass
    try:
        stamp.touch()
    except OSError:
        return False
    return True


def prune_cache(keep: Path | None = None, now: float | None = None) -> list[Path]:
    """Evict finished builds, least recently used first, until the cache is within cache_limit_bytes().
    `keep` (the build just made) and builds used in the last IN_USE_SECONDS stay; returns what was removed.
    Only directories holding a build.key are builds; the entries every build shares are removed only when
    unused for SUPPORT_STALE_SECONDS (_prune_support), staging directories a killed process left behind
    after STALE_SECONDS, and anything else in the directory is left alone."""
    root, limit = cache_root(), cache_limit_bytes()
    start = time.time()
    now = start if now is None else now
    builds = []
    entries = list(os.scandir(root)) if root.is_dir() else []
    _prune_support(entries, now)
    for entry in entries:
        if entry.name.startswith(SUPPORT_PREFIXES):
            continue
        stamp = Path(entry.path) / "build.key"
        if not entry.is_dir(follow_symlinks=False):
            _prune_shared_blas(entry, now)
            continue
        if entry.name.startswith("."):
            try:
                if now - entry.stat(follow_symlinks=False).st_mtime > STALE_SECONDS:
                    shutil.rmtree(entry.path, ignore_errors=True)
            except OSError:
                pass
            continue
        try:
            used = stamp.stat().st_mtime
        except OSError:
            continue
        builds.append((used, Path(entry.path)))
    sizes = {path: _tree_bytes(path) for _, path in builds}
    total = sum(sizes.values())
    removed = []
    for used, path in sorted(builds):
        if total <= limit:
            break
        if (keep is not None and path == Path(keep)) or now - used < IN_USE_SECONDS:
            continue
        # Sizing took time (most of a second for thousands of builds), in which another process may have found
        # this build and be loading it: its use as it stands now decides.
        try:
            if now + (time.time() - start) - (path / "build.key").stat().st_mtime < IN_USE_SECONDS:
                continue
        except OSError:
            continue
        try:
            evict(path)
        except OSError:  # evicted or replaced by another process meanwhile
            continue
        total -= sizes[path]
        removed.append(path)
    return removed


def evict(path: Path) -> None:
    """Remove a cache entry, folder or file: renamed out of the way first (a dot name beside it, which a
    prune sweeps if this process is killed before it is gone), so no reader ever sees it half removed.
    Raises the rename's OSError: the entry was removed or replaced by another process meanwhile."""
    doomed = path.parent / f".evicted.{path.name}.{os.getpid()}"
    os.rename(path, doomed)
    if os.path.isdir(doomed) and not os.path.islink(doomed):
        shutil.rmtree(doomed, ignore_errors=True)
    else:
        try:
            os.unlink(doomed)
        except OSError:
            pass


def _prune_support(entries: list[os.DirEntry], now: float) -> None:
    """Remove the shared entries (SUPPORT_PREFIXES) whose stem (the name up to its first dot) has gone
    unused for SUPPORT_STALE_SECONDS: the newest mtime among the stem's files, which mark_support_used
    refreshes on every use of the entry itself, decides."""
    stems: dict[str, list[os.DirEntry]] = {}
    for entry in entries:
        if entry.name.startswith(SUPPORT_PREFIXES):
            stems.setdefault(entry.name.split(".", 1)[0], []).append(entry)
    for stem, group in stems.items():
        try:
            newest = max(e.stat(follow_symlinks=False).st_mtime for e in group)
        except OSError:  # removed by another process meanwhile
            continue
        if now - newest <= SUPPORT_STALE_SECONDS:
            continue
        for entry in group:
            try:
                evict(Path(entry.path))
            except OSError:  # removed by another process meanwhile
                continue


def _prune_shared_blas(entry: os.DirEntry, now: float) -> None:
    """Remove a shared OpenBLAS copy no build links any more (an older OpenBLAS's, or one all of whose builds
    were evicted) once STALE_SECONDS old; a build that finds it gone meanwhile copies it again."""
    if not (entry.name.startswith(SHARED_BLAS_PREFIX) and entry.name.endswith(".so")):
        return
    try:
        st = entry.stat(follow_symlinks=False)
        if stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and now - st.st_mtime > STALE_SECONDS:
            os.unlink(entry.path)
    except OSError:
        pass


def regular_file(path: Path) -> bool:
    """Whether `path` is a regular file (after symlinks): a FIFO or device in its place would block or
    never end a read."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


# The most a digest, key, peak figure or manifest file is read for: larger is not one saturate wrote.
SMALL_FILE_MAX_BYTES = 1 << 20


def read_small(path: Path, limit: int = SMALL_FILE_MAX_BYTES) -> str:
    """The text of a small file of the cache or of a compiled directory (a digest, a key, a manifest): whoever
    could write the folder wrote it, so a FIFO in its place or one of more than `limit` bytes is refused
    before anything is allocated for it, as an OSError whose message says why (the callers treat it as a
    missing file). Undecodable bytes become U+FFFD, so they match nothing."""
    try:
        return read_regular(path, limit, "cache file").decode("utf-8", errors="replace")
    except RefusedFile as err:
        raise OSError(err.reason) from None


def file_digest(path: Path) -> str:
    """The sha256 of a regular file's bytes, in hex."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
