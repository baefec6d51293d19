"""C backend, build stage: compile the emitted C against OpenBLAS, cached by content hash."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from saturate.core.errors import SaturateError

KERNELS_DIR = Path(__file__).resolve().parent
SANITIZE_FLAGS = ["-fsanitize=address", "-fno-omit-frame-pointer", "-g"]


def cpu_has_avx512() -> bool:
    """Whether this machine's CPU has AVX-512F (the packed conv micro-kernel needs it)."""
    try:
        return " avx512f " in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def openblas() -> tuple[str, str, str]:
    """(include dir, library dir, library name) of the scipy-openblas32 wheel."""
    try:
        import scipy_openblas32 as ob
    except ImportError:
        raise SaturateError("the C backend needs the scipy-openblas32 package (pip install scipy-openblas32)") from None
    return ob.get_include_dir(), ob.get_lib_dir(), ob.get_library()


def openblas_core() -> str:
    """The kernel family OpenBLAS chose (it honours $OPENBLAS_CORETYPE), with a note when the
    CPU could run wider kernels than the ones pinned."""
    import ctypes

    openblas()
    import scipy_openblas32 as ob

    fn = ob.dll.scipy_openblas_get_corename
    fn.restype = ctypes.c_char_p
    core = fn().decode()
    pinned = os.environ.get("OPENBLAS_CORETYPE")
    if pinned and cpu_has_avx512() and core.lower() in ("haswell", "zen", "sandybridge"):
        return f"{core} (pinned by OPENBLAS_CORETYPE={pinned}; this CPU has AVX-512)"
    return core


def compiler() -> str:
    """The system C compiler ($CC, else cc)."""
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        raise SaturateError(f"no C compiler found ('{cc}'); install gcc or set CC")
    return cc


# Past this many kernel steps a model compiles at -O2 without speculative inlining: -O3 on thousands
# of fused epilogues takes minutes of compiler time for no measurable run-time gain.
LARGE_STEPS = 400


def compile_command(source: Path, target: Path, sanitize: bool = False, profile: bool = False,
                    large: bool = False) -> list[str]:
    """The full compiler command line for one emitted model."""
    inc, libdir, lib = openblas()
    opt = ["-O2", "-fno-inline-functions", "-fno-inline-small-functions"] if large else ["-O3"]
    # No FP traps are observed, so gcc may if-convert float selects (clamps, relu) and vectorize
    # the pointwise loops; values are unchanged (IEEE non-stop arithmetic either way).
    flags = [*opt, "-march=native", "-fno-trapping-math", "-fPIC", "-shared", "-pthread", "-std=gnu11", "-w"]
    if sanitize:
        flags += SANITIZE_FLAGS
    if profile:
        flags.append("-DSAT_PROFILE")
    return [compiler(), *flags, f"-I{KERNELS_DIR}", f"-I{inc}", str(source), "-o", str(target),
            f"-L{libdir}", f"-l{lib}", f"-Wl,-rpath,{libdir}", "-lm"]


def cache_root() -> Path:
    """Where compiled models are kept ($SATURATE_CACHE, else ~/.cache/saturate/backend)."""
    return Path(os.environ.get("SATURATE_CACHE", Path.home() / ".cache" / "saturate" / "backend"))


def build(source: str, weights: bytes, out_dir: Path | None = None, sanitize: bool = False,
          profile: bool = False) -> Path:
    """Write model.c and weights.bin and compile model.so; returns the directory holding them.

    Without out_dir the directory is a cache entry named by the hash of source, weights, kernels
    and flags, so the same graph compiles once.
    """
    kernels = b"".join(p.read_bytes() for p in sorted(KERNELS_DIR.glob("*.h")))
    large = source.count("SAT_TOC(") > LARGE_STEPS
    # The compiler flags are part of the key: a flag change must not reuse libraries built without it.
    flags = " ".join(compile_command(Path("model.c"), Path("model.so"), sanitize, profile, large)).encode()
    key = hashlib.sha256(source.encode() + kernels + weights + flags).hexdigest()[:24]
    target = Path(out_dir) if out_dir is not None else cache_root() / key
    so = target / "model.so"
    stamp = target / "build.key"
    if so.exists() and stamp.exists() and stamp.read_text() == key:
        return target
    target.mkdir(parents=True, exist_ok=True)
    _write_atomic(target / "model.c", source.encode())
    _write_atomic(target / "weights.bin", weights)
    with tempfile.TemporaryDirectory(dir=target) as tmp:
        tmp_so = Path(tmp) / "model.so"
        cmd = compile_command(target / "model.c", tmp_so, sanitize, profile, large)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            first = (proc.stderr.strip().splitlines() or ["(no output)"])[0]
            raise SaturateError(f"C compiler failed on {target / 'model.c'}: {first}")
        os.replace(tmp_so, so)
    _write_atomic(stamp, key.encode())
    return target


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
