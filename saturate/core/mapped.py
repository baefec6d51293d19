"""Weights that stay in files: read-only mappings of ONNX external data, arrays that are views of
them, large folded weights computed block by block into unlinked temp files, and writing such an
array out by copying its bytes file to file.

A page of a mapping counts in the process's memory only while the process has it mapped in:
folding and writing give pages back (madvise) once they are past them, so memory stays at a few
blocks however large the weights are. The mapped files must not change while they are mapped
(as for any program that maps its inputs); they are the command's inputs, which it never writes.
"""

from __future__ import annotations

import contextvars
import errno
import math
import mmap
import os
import sys
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable, Iterator

import numpy as np

from saturate.core.errors import SaturateError
from saturate.core.inputs import open_regular

# A folded weight at least this large is computed into a temp file, not kept in memory.
SPILL_BYTES = 32 << 20
# Bytes computed, copied or written per step.
BLOCK_BYTES = 4 << 20
# Bytes of a folded weight computed into a buffer and written from it at a time: the buffer
# stays in a core's cache between the two.
CACHE_BYTES = 256 << 10
# A folded weight written straight to the disk (O_DIRECT) is written this many bytes at a time,
# each write starting and ending at a multiple of DIRECT_ALIGN (a disk's logical block: 512 bytes
# or 4 KiB), from a buffer that starts at one.
DIRECT_BYTES = 2 << 20
DIRECT_ALIGN = 4096


class _Mapping(mmap.mmap):
    """A read-only mapping of a file from `offset` on, the open file beside it (copies read
    from it)."""

    file: BinaryIO
    address: int
    offset: int
    path: Path | None      # an input's data file (a temp file of folded weights: None)


def _map(f: BinaryIO, offset: int = 0, length: int = 0, path: Path | None = None) -> _Mapping:
    m = _Mapping(f.fileno(), length, access=mmap.ACCESS_READ, offset=offset)
    m.file, m.offset, m.path = f, offset, path
    m.address = np.frombuffer(m, np.uint8, count=1).ctypes.data
    return m


class Arena:
    """A temp file in an output's folder that large folded weights are written into, each at a
    page boundary and mapped from there: saving the result can take the file over as its data
    file (`adopt`), so those weights are written once, where they end up. With `direct`, nothing
    reads them back before they are saved, and they are written straight to the disk (_fill)."""

    def __init__(self, folder: Path, name: str, direct: bool = False):
        self.folder, self.name, self.direct = folder, name, direct
        self.file: BinaryIO | None = None
        self.path = ""
        self.regions: list[tuple[int, int]] = []      # (offset, length) of each weight written
        self.adopted = False

    def begin(self) -> tuple[BinaryIO, int]:
        """The file and the offset the next weight starts at (the file's end, page-aligned)."""
        if self.file is None:
            try:
                fd, self.path = tempfile.mkstemp(prefix=f".{self.name}.{os.getpid()}.", suffix=".tmp",
                                                 dir=self.folder)
            except OSError as err:
                raise SaturateError(f"cannot make a temp file for folded weights in {self.folder}: "
                                    f"{err.strerror or err}") from None
            self.file = os.fdopen(fd, "r+b")
        end = self.file.seek(0, os.SEEK_END)
        start = -(-end // mmap.ALLOCATIONGRANULARITY) * mmap.ALLOCATIONGRANULARITY
        if start > end:
            self.file.write(bytes(start - end))
        return self.file, start

    def size(self) -> int:
        return 0 if self.file is None else os.fstat(self.file.fileno()).st_size

    def adopt(self) -> str:
        """Hand the file over (to be renamed into place): it is not removed when the block ends."""
        self.adopted = True
        return self.path

    def close(self) -> None:
        if self.file is not None and not self.adopted:
            try:
                os.unlink(self.path)
            except OSError:
                pass


_ARENA: contextvars.ContextVar[Arena | None] = contextvars.ContextVar("arena", default=None)


@contextmanager
def folds_beside(output: str | os.PathLike | None, direct: bool = False) -> Iterator[Arena | None]:
    """Within the block, large folded weights go to an Arena beside `output` (see save_graph),
    not to temp files elsewhere; the arena's file is removed at the end unless it was adopted.
    `direct`: nothing reads the folded weights before they are saved (no check runs on them), so
    they may bypass the page cache (_fill). A check reads them back through their mapping, page
    by page: from the disk, that took 12 to 16 s on a 3 GiB MLP, from the page cache 2 to 3 s."""
    if output is None:
        yield None
        return
    target = Path(output)
    arena = Arena(target.parent if str(target.parent) else Path("."), f"{target.name}.data", direct)
    token = _ARENA.set(arena)
    try:
        yield arena
    finally:
        _ARENA.reset(token)
        arena.close()


def current_arena() -> Arena | None:
    """The Arena of the enclosing `folds_beside` block, if any."""
    return _ARENA.get()


class DataFiles:
    """The external data files of one model, each mapped once when a tensor first reads it."""

    def __init__(self) -> None:
        self._maps: dict[str, _Mapping | None] = {}

    def array(self, path: Path, offset: int, length: int, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        """A read-only array of `length` bytes at `offset` of `path`, a view of its mapping: the
        file's size is checked first (offset and length within it), nothing is read."""
        key = str(path)
        if key not in self._maps:
            f = open_regular(path, sys.maxsize, "external data file")
            try:
                size = os.fstat(f.fileno()).st_size
                self._maps[key] = _map(f, path=Path(path)) if size else None
            except (OSError, ValueError) as err:
                f.close()
                raise SaturateError(f"{path}: cannot map: {getattr(err, 'strerror', None) or err}") from None
            if not size:
                f.close()
        m = self._maps[key]
        size = len(m) if m is not None else 0
        if offset > size or length > size - offset:
            raise SaturateError(f"{path}: {length} bytes at offset {offset} asked for, but the file "
                                f"holds {size} bytes")
        if length == 0:
            return np.zeros(shape, dtype)
        arr = np.frombuffer(m, dtype=dtype, count=length // dtype.itemsize, offset=offset)
        return arr.reshape(shape)


def _mapping_of(arr: np.ndarray) -> _Mapping | None:
    base: Any = arr
    while isinstance(base, (np.ndarray, memoryview)):
        base = base.base if isinstance(base, np.ndarray) else base.obj
    return base if isinstance(base, _Mapping) else None


def file_slice(arr: np.ndarray) -> tuple[BinaryIO, int, int] | None:
    """(open file, offset, length) of the bytes of `arr` when it is a C-ordered view of a mapped
    file (an imported or spilled weight); None for an array in memory."""
    m = _mapping_of(arr)
    if m is None or not arr.flags.c_contiguous or m.closed:
        return None
    return m.file, arr.ctypes.data - m.address + m.offset, arr.nbytes


def input_slice(arr: np.ndarray) -> tuple[Path, int] | None:
    """(data file, offset) of a C-ordered view of an input's external data file; else None."""
    m = _mapping_of(arr)
    where = file_slice(arr)
    return None if m is None or m.path is None or where is None else (m.path, where[1])


def is_mapped(arr: np.ndarray) -> bool:
    """Whether `arr` is a view of a mapped file (its bytes are not in the process's memory)."""
    return _mapping_of(np.asarray(arr)) is not None


def release(arr: np.ndarray) -> None:
    """Give back the pages of a mapped array the process has read (they stay in the file and
    the page cache, and are read again if touched); nothing for an array in memory."""
    m = _mapping_of(arr)
    if m is None or m.closed or not arr.flags.c_contiguous or not arr.nbytes or not hasattr(m, "madvise"):
        return
    start = arr.ctypes.data - m.address
    first = start - start % mmap.PAGESIZE
    end = min(len(m), start + arr.nbytes)
    try:
        m.madvise(mmap.MADV_DONTNEED, first, end - first)
    except (OSError, ValueError, AttributeError):
        pass


def _sink() -> tuple[BinaryIO, int]:
    """Where the next large weight is written: the enclosing Arena, else an unlinked temp file."""
    arena = _ARENA.get()
    if arena is not None:
        return arena.begin()
    try:
        return tempfile.TemporaryFile(prefix="saturate-weight-"), 0
    except OSError as err:
        raise SaturateError(f"cannot make a temp file for a folded weight: {err.strerror or err}") from None


def _finish(f: BinaryIO, start: int, dtype: np.dtype, shape: tuple[int, ...], length: int | None = None) -> np.ndarray:
    f.flush()
    length = f.tell() - start if length is None else length
    arena = _ARENA.get()
    if arena is not None and f is arena.file:
        arena.regions.append((start, length))
        _start_writeback(f.fileno(), start, length)
    return np.frombuffer(_map(f, start, length), dtype=dtype).reshape(shape)


_SYNC_FILE_RANGE_WRITE = 2      # <linux/fs.h>
_sync_file_range: Any = None


def _start_writeback(fd: int, start: int, length: int) -> None:
    """Have the system start writing a finished stretch of an arena to disk, without waiting
    for the disk: the arena becomes the output's data file, which is synced before it is renamed
    into place (core.fileio.write_atomic), and a disk kept busy while the rest folds leaves that
    sync little to wait for. Nothing where the C library has no sync_file_range."""
    call = _writeback_call()
    if call:
        call(fd, start, length, _SYNC_FILE_RANGE_WRITE)      # a failure: the sync does the work


def _writeback_call() -> Any:
    """The C library's sync_file_range (Linux), else False; looked up once."""
    global _sync_file_range
    if _sync_file_range is None:
        _sync_file_range = False
        if sys.platform.startswith("linux"):
            import ctypes

            try:
                call = ctypes.CDLL(None, use_errno=True).sync_file_range
                call.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
                call.restype = ctypes.c_int
                _sync_file_range = call
            except (AttributeError, OSError):
                pass
    return _sync_file_range


def _abandon(f: BinaryIO, start: int) -> None:
    """Drop what was written of a weight that is not finished."""
    arena = _ARENA.get()
    if arena is not None and f is arena.file:
        f.truncate(start)
        f.seek(start)
    else:
        f.close()


def spill(arr: np.ndarray) -> np.ndarray:
    """`arr` moved to an unlinked temp file: a read-only view of its mapping, equal to it."""
    arr = np.ascontiguousarray(arr)
    if arr.dtype.hasobject or not arr.nbytes:
        return arr
    f, start = _sink()
    try:
        flat = arr.reshape(-1).view(np.uint8)
        for k in range(0, flat.size, BLOCK_BYTES):
            f.write(memoryview(flat[k:k + BLOCK_BYTES]))
        return _finish(f, start, arr.dtype, arr.shape)
    except OSError as err:
        _abandon(f, start)
        raise SaturateError(f"cannot write a folded weight to a temp file: {err.strerror or err}") from None


def large(args: Iterable[Any]) -> bool:
    """Whether any argument is an array of at least SPILL_BYTES."""
    return any(isinstance(a, np.ndarray) and a.nbytes >= SPILL_BYTES for a in args)


class _Refused(Exception):
    """A block came out of another shape or dtype than the first: the fold is not elementwise."""


def elementwise_blocks(impl: Callable[..., Any], args: list[Any]) -> np.ndarray | None:
    """`impl(*args)` for an elementwise function over broadcast arguments, computed in blocks of
    rows written into a temp file, the blocks shared among the cores: the arguments as large as
    the result are read a block at a time and their pages given back after each, and the result
    goes to the file a block at a time, so it never sits in the process's memory whole. None
    when the result is small or its first axis does not split (the caller computes it as usual)."""
    arrays = [a for a in args if isinstance(a, np.ndarray)]
    try:
        shape = np.broadcast_shapes(*(np.shape(a) for a in args))
    except ValueError:
        return None
    if not arrays or not shape or shape[0] < 2:
        return None
    row = max(1, int(np.prod(shape[1:], dtype=np.int64))) * max(a.dtype.itemsize for a in arrays)
    if row * shape[0] < SPILL_BYTES:
        return None
    split = [isinstance(a, np.ndarray) and a.ndim == len(shape) and a.shape[0] == shape[0] for a in args]
    step = max(1, BLOCK_BYTES // row)
    # Blocks that start at multiples of DIRECT_ALIGN bytes where whole rows allow it (_fill).
    unit = _aligned_rows(row)
    if unit <= step:
        step -= step % unit

    def parts(i: int) -> list[Any]:
        return [a[i:i + step] if s else a for a, s in zip(args, split)]

    first = np.asarray(impl(*parts(0)))
    if first.shape != (min(step, shape[0]), *shape[1:]) or first.dtype.hasobject:
        return None
    dtype = first.dtype
    length = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    f, start = _sink()
    try:
        f.flush()
        os.ftruncate(f.fileno(), start + length)
        _reserve(f, start, length)
        _fill(f, start, length, dtype, shape, step, first, impl, parts, split)
        f.seek(start + length)
        return _finish(f, start, dtype, shape, length)
    except _Refused:
        _abandon(f, start)
        return None
    except OSError as err:
        _abandon(f, start)
        raise SaturateError(f"cannot write a folded weight to a temp file: {err.strerror or err}") from None
    except BaseException:
        _abandon(f, start)
        raise


def _fill(f: BinaryIO, start: int, length: int, dtype: np.dtype, shape: tuple[int, ...], step: int,
          first: np.ndarray, impl: Callable[..., Any], parts: Callable[[int], list[Any]], split: list[bool]) -> None:
    """Compute the blocks of elementwise_blocks into `length` bytes of `f` at `start`, `first`
    being the first block as `impl` made it, the blocks shared among the cores. A core computes
    its block a few rows at a time into a buffer of its own, small enough to stay in its cache,
    and writes from there with pwrite: computing into a writable mapping of the file instead had
    the system zero each page before the fold wrote it, a third pass over the weight's memory.
    An argument that is a view of a mapped file is read the same way, with pread into a buffer
    of the core's: through the mapping, every page was mapped in and given back again, and with
    two threads the system interrupted the other core to forget each page given back.

    A weight folded into an output's data file (the enclosing Arena) that nothing reads back
    before it is saved (Arena.direct) is written straight to the disk (O_DIRECT) where the file
    system allows it and its rows fall on DIRECT_ALIGN bytes: the system then neither allocates
    a page for each 4 KiB of the weight and copies it there (what `cp` spends its time on) nor
    holds the weight as dirty pages, throttling the writers once they are many, and the sync
    before the output is renamed into place finds the data written.
    The rest (a last piece short of DIRECT_ALIGN, everything where direct writes are refused)
    goes through the page cache, each block handed to the disk as it ends."""
    fd = f.fileno()
    row = first.nbytes // first.shape[0]
    rows = max(1, min(step, CACHE_BYTES // row))      # rows computed at a time
    arena = _ARENA.get()
    # Each block of the output's data file goes to disk as soon as it is written (the worker
    # threads do not see the arena: it lives in this thread's context).
    durable = arena is not None and f is arena.file
    unit = _aligned_rows(row)
    direct = (_open_direct(fd) if arena is not None and durable and arena.direct and start % DIRECT_ALIGN == 0
              and step % unit == 0 and unit * row <= DIRECT_BYTES else None)
    # Rows written at a time: a direct write is not copied by the system, so it may be larger
    # than the cache; a buffered one is copied from the cache.
    wrows = rows if direct is None else min(step, max(unit, DIRECT_BYTES // row // unit * unit))
    refused: list[bool] = []        # the file system refused a direct write: the page cache from then on
    buffers = threading.local()

    def write_all(to: int, data: memoryview, offset: int) -> None:
        done = os.pwrite(to, data, offset)
        while done < len(data):      # a short write: the rest, or the error that cut it short
            n = os.pwrite(to, data[done:], offset + done)
            if n <= 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            done += n

    def put(piece: np.ndarray, i: int) -> None:
        offset = start + i * row
        data = memoryview(piece).cast("B")
        if direct is not None and not refused and offset % DIRECT_ALIGN == 0 and piece.ctypes.data % DIRECT_ALIGN == 0:
            cut = len(data) - len(data) % DIRECT_ALIGN
            if cut:
                try:
                    write_all(direct, data[:cut], offset)
                    data, offset = data[cut:], offset + cut
                except OSError as err:
                    if err.errno != errno.EINVAL:
                        raise
                    refused.append(True)
        if len(data):
            write_all(fd, data, offset)

    ufunc = getattr(np, getattr(impl, "__name__", ""), None)
    compute = (_through_ufunc(ufunc, parts(0), np.empty_like(first), first)
               if isinstance(ufunc, np.ufunc) else None)

    def read(src: list[Any]) -> list[tuple[int, int, int, np.ndarray] | None]:
        """For each argument split by rows that is a view of a file: its file, its offset there,
        its bytes per row and this thread's buffer for a piece of it; None for the others."""
        got: list[tuple[int, int, int, np.ndarray] | None] = []
        for k, (p, s) in enumerate(zip(src, split)):
            where = file_slice(p) if s and isinstance(p, np.ndarray) and p.size else None
            if where is None:
                got.append(None)
                continue
            held = buffers.inputs.get(k)
            if held is None or held.dtype != p.dtype or held.shape[1:] != p.shape[1:]:
                held = buffers.inputs[k] = np.empty((rows, *p.shape[1:]), p.dtype)
            got.append((where[0].fileno(), where[1], p.nbytes // p.shape[0], held))
        return got

    def piece(src: list[Any], files: list[tuple[int, int, int, np.ndarray] | None], j: int, n: int) -> list[Any]:
        """Rows j to j + n of the block's arguments: read into this thread's buffers from files."""
        out = []
        for p, s, where in zip(src, split, files):
            if where is None:
                out.append(p[j:j + n] if s else p)
                continue
            fd_in, offset, row_in, held = where
            buf = held[:n]
            offset += j * row_in
            done = os.preadv(fd_in, [buf], offset)
            while done < buf.nbytes:      # a short read: the rest (the file was checked to hold it)
                n_read = os.preadv(fd_in, [memoryview(buf).cast("B")[done:]], offset + done)
                if n_read <= 0:
                    raise OSError(errno.EIO, "a mapped weight's file was cut short")
                done += n_read
            out.append(buf)
        return out

    def block(i: int) -> None:
        src = parts(i)
        n = min(step, shape[0] - i)
        files: list[Any] = [None] * len(src)
        # A worker thread has numpy's default error state; the folds ignore over- and underflow.
        with np.errstate(all="ignore"):
            if compute is not None:
                own = getattr(buffers, "array", None)
                if own is None:
                    own = buffers.array = _aligned((wrows, *shape[1:]), dtype)
                    buffers.inputs = {}
                files = read(src)
                for j in range(0, n, wrows):
                    dst = own[:min(wrows, n - j)]
                    for k in range(0, len(dst), rows):
                        compute(piece(src, files, j + k, min(rows, len(dst) - k)), dst[k:k + rows])
                    put(dst, i + j)
            else:
                got = np.ascontiguousarray(impl(*src))
                if got.shape != (n, *shape[1:]) or got.dtype != dtype:
                    raise _Refused()
                put(got, i)
        for part, s, where in zip(src, split, files):
            if s and where is None:
                release(part)
        if durable and (direct is None or refused):
            _start_writeback(fd, start + i * row, n * row)

    try:
        head = np.ascontiguousarray(first)
        if direct is not None and head.ctypes.data % DIRECT_ALIGN:
            # Where the allocator put the first block decides nothing: it goes to the disk as the others do.
            aligned = _aligned(head.shape, head.dtype)
            aligned[...] = head
            head = aligned
        put(head, 0)
        for part, s in zip(parts(0), split):
            if s:
                release(part)
        steps = range(step, shape[0], step)
        # A thread waiting for the disk to take a direct write holds no core: with twice as many
        # threads as cores, the cores compute while the disk writes (on the 3 GiB MLP, the folds
        # took a tenth less time than with one thread a core, and the same memory at 2 MiB writes).
        workers = min(_cores() * (1 if direct is None else 2), len(steps))
        if workers > 1:
            # Here, not at the top: most runs fold nothing this large.
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(workers, thread_name_prefix="saturate-fold") as pool:
                for done in [pool.submit(block, i) for i in steps]:
                    done.result()
        else:
            for i in steps:
                block(i)
    finally:
        if direct is not None:
            os.close(direct)


def _aligned_rows(row: int) -> int:
    """The fewest rows of `row` bytes that end on a multiple of DIRECT_ALIGN bytes."""
    return DIRECT_ALIGN // math.gcd(row, DIRECT_ALIGN)


def _open_direct(fd: int) -> int | None:
    """A second descriptor of the open file `fd` whose writes skip the page cache (O_DIRECT),
    or None where the system or the file system has none (the writes then go through `fd`)."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag or not sys.platform.startswith("linux"):     # /proc/self/fd names an unlinked file too
        return None
    try:
        return os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_CLOEXEC | flag)
    except OSError:
        return None


def _aligned(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An empty array whose first byte is at a multiple of DIRECT_ALIGN (as direct writes ask)."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + DIRECT_ALIGN, np.uint8)
    skip = -raw.ctypes.data % DIRECT_ALIGN
    return raw[skip:skip + nbytes].view(dtype).reshape(shape)


def _reserve(f: BinaryIO, start: int, length: int) -> None:
    """Allocate the file's blocks for a weight before it is written through a mapping: a full
    disk is then an error here, not a SIGBUS at some page, and the pages need no allocation one
    by one as they are first written (which took longer than computing them)."""
    try:
        os.posix_fallocate(f.fileno(), start, length)
    except OSError as err:
        if err.errno not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            raise


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _typed(parts: list[Any], dtype: np.dtype) -> list[Any]:
    # As builtins._elementwise passes them: numbers in the arrays' dtype.
    return [p if isinstance(p, np.ndarray) else np.asarray(p, dtype) for p in parts]


def _through_ufunc(ufunc: np.ufunc, parts: list[Any], dst: np.ndarray, block: np.ndarray
                   ) -> Callable[[list[Any], np.ndarray], None] | None:
    """How to compute a block straight into its place with `ufunc`, when doing so for the first
    block gives exactly the bytes the function gave (the function is that ufunc with its result
    cast to the arrays' dtype); None when it does not, or cannot say. Half floats are computed
    in float32 and rounded once (for one operation the same result as numpy's float16 loops):
    through ONNX Runtime where it is there, whose casts are vectorized, else numpy's."""
    if ufunc.nout != 1 or ufunc.nin != len(parts):
        return None

    def compute(src: list[Any], out: np.ndarray) -> None:
        ufunc(*_typed(src, block.dtype), out=out, **via)

    via = {"dtype": np.float32, "casting": "unsafe"} if block.dtype == np.float16 else {}
    half = _half_kernel(ufunc) if block.dtype == np.float16 else None
    want = np.ascontiguousarray(block).tobytes()
    for candidate in ([half] if half is not None else []) + [compute]:
        try:
            with np.errstate(all="ignore"):
                candidate(parts, dst)
        except (TypeError, ValueError, RuntimeError):
            continue
        if dst.tobytes() == want:
            return candidate
    dst[...] = block
    return None


# The ufuncs a half-float fold can run through ONNX Runtime, and their ONNX ops.
_HALF_OPS = {"add": "Add", "subtract": "Sub", "multiply": "Mul", "divide": "Div"}
_HALF_SESSIONS: dict[str, Any] = {}


def _half_kernel(ufunc: np.ufunc) -> Callable[[list[Any], np.ndarray], None] | None:
    """`ufunc` on float16 arrays computed in float32 and rounded once, by ONNX Runtime (Cast,
    the op, Cast): numpy converts half floats one element at a time, which took five times as
    long as the rest of such a fold. None without ONNX Runtime or for another ufunc."""
    op = _HALF_OPS.get(ufunc.__name__)
    if op is None:
        return None
    session = _HALF_SESSIONS.get(op)
    if session is None:
        try:
            import onnxruntime as ort
            from onnx import TensorProto, helper
        except ImportError:
            return None
        f16, f32 = TensorProto.FLOAT16, TensorProto.FLOAT
        graph = helper.make_graph(
            [helper.make_node("Cast", ["a"], ["a32"], to=f32), helper.make_node("Cast", ["b"], ["b32"], to=f32),
             helper.make_node(op, ["a32", "b32"], ["y32"]), helper.make_node("Cast", ["y32"], ["y"], to=f16)],
            "half", [helper.make_tensor_value_info("a", f16, None), helper.make_tensor_value_info("b", f16, None)],
            [helper.make_tensor_value_info("y", f16, None)])
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = opts.inter_op_num_threads = 1      # the folds' own threads share the cores
        opts.log_severity_level = 3
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        session = _HALF_SESSIONS[op] = ort.InferenceSession(model.SerializeToString(), opts,
                                                             providers=["CPUExecutionProvider"])

    def run(src: list[Any], out: np.ndarray) -> None:
        a, b = (np.ascontiguousarray(x, np.float16) for x in src)
        out[...] = session.run(None, {"a": a, "b": b})[0]

    return run


def copy_to(out: BinaryIO, arr: np.ndarray) -> bool:
    """Write the bytes of a mapped `arr` to `out` by copying them file to file (no pass through
    this process's memory where the system allows); False, writing nothing, for an array in memory."""
    where = file_slice(arr)
    if where is None:
        return False
    src, offset, length = where
    out.flush()
    dst = out.fileno()
    done = 0
    try:
        while done < length:
            n = os.copy_file_range(src.fileno(), dst, length - done, offset + done)
            if n <= 0:
                break
            done += n
    except OSError:
        pass   # a file system or kernel without it: the rest goes through memory
    out.seek(0, os.SEEK_END)
    flat = arr.reshape(-1).view(np.uint8)
    for k in range(done, length, BLOCK_BYTES):
        piece = flat[k:k + BLOCK_BYTES]
        out.write(memoryview(piece))
        release(piece)
    return True


def write_pieces(out: BinaryIO, pieces: Iterable[Any]) -> None:
    """Write bytes, memoryviews and arrays one after another; a mapped array file to file."""
    for piece in pieces:
        if isinstance(piece, np.ndarray):
            if not copy_to(out, piece):
                out.write(memoryview(np.ascontiguousarray(piece).reshape(-1).view(np.uint8)))
        else:
            out.write(piece)
