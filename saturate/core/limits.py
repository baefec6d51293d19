"""Resource limits: the memory any one tensor, weight or workspace may take, checked before it is
allocated, so a model that declares terabytes fails in one line instead of exhausting the machine."""

from __future__ import annotations

import functools
import math
import os
import re

import contextlib
from typing import Iterator

from saturate.core.errors import MemoryLimitError, SaturateError

# `--max-memory` sets this variable, so batch workers and other child processes inherit the limit.
ENV = "SATURATE_MAX_MEMORY"
# Without --max-memory, one allocation may take at most this share of the machine's memory.
DEFAULT_SHARE = 0.5

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
          "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tb": 1 << 40,
          "tib": 1 << 40}


def parse_size(text: str) -> int:
    """Bytes in a size such as `512M`, `4G`, `1.5GiB` or `1000000` (binary units)."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise SaturateError(f"--max-memory {text!r}: expected a size such as 512M, 4G or 1000000 (bytes)")
    size = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not math.isfinite(size) or size < 1:
        raise SaturateError(f"--max-memory {text!r}: expected a positive size")
    return int(size)


@functools.lru_cache(maxsize=None)
def machine_memory_bytes() -> int:
    """Physical memory of this machine (64 GiB when the system does not say); asked once: every
    allocation a Loop's iterations make checks the limit."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 64 << 30


# Lower limits in force for a stretch of work (`lowered`), innermost last.
_LOWERED: list[int] = []


def max_memory_bytes() -> int:
    """The limit in force: $SATURATE_MAX_MEMORY (what --max-memory sets), else a share of the
    machine; within `lowered`, the lower of that and its limit."""
    if _LOWERED:
        return min(_LOWERED[-1], _configured_bytes())
    return _configured_bytes()


@contextlib.contextmanager
def lowered(nbytes: int) -> Iterator[None]:
    """Hold allocations to at most `nbytes` (or the configured limit, if lower) inside the block."""
    _LOWERED.append(int(nbytes))
    try:
        yield
    finally:
        _LOWERED.pop()


def _configured_bytes() -> int:
    text = os.environ.get(ENV)
    if text:
        return parse_size(text)
    return int(machine_memory_bytes() * DEFAULT_SHARE)


def set_max_memory(text: str | None) -> None:
    """Apply a `--max-memory` value to this process and the processes it starts."""
    if text is not None:
        parse_size(text)
        os.environ[ENV] = str(text)


def format_bytes(n: int) -> str:
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} bytes"


def element_count(shape, what: str) -> int:
    """The number of elements of `shape`, refusing negative dims before anything multiplies them."""
    count = 1
    for d in shape:
        d = int(d)
        if d < 0:
            raise SaturateError(f"{what}: negative dimension {d} in shape {list(shape)}")
        count *= d
    return count


def check_allocation(shape, itemsize: int, what: str) -> int:
    """Bytes a tensor of `shape` with elements of `itemsize` bytes takes; one line naming `what`
    when that is over the limit. Call it before allocating."""
    nbytes = element_count(shape, what) * int(itemsize)
    check_bytes(nbytes, what)
    return nbytes


def check_bytes(nbytes: int, what: str) -> None:
    """One line naming `what` when `nbytes` is over the limit."""
    limit = max_memory_bytes()
    if nbytes > limit:
        raise MemoryLimitError(f"{what} would take {format_bytes(nbytes)}, over the memory limit of "
                            f"{format_bytes(limit)} (--max-memory)")
