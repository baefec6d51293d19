"""C backend, the toolchain: the compiler, OpenBLAS (the scipy-openblas32 wheel's library every build
links), the CPU's features and the instruction set builds target ($SATURATE_ISA)."""

from __future__ import annotations

import functools
import os
import platform
import shutil
import subprocess
from pathlib import Path

from saturate.backend.cache import file_digest, regular_file
from saturate.core.errors import SaturateError


def cpu_has_avx512() -> bool:
    """Whether this machine's CPU has AVX-512F (the packed conv micro-kernel needs it)."""
    try:
        return " avx512f " in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def openblas() -> tuple[str, str, str]:
    """(include dir, library dir, library name) of the scipy-openblas32 wheel."""
    from saturate.core.extras import need

    ob = need("scipy_openblas32", "c", "the C backend", "scipy-openblas32")
    return ob.get_include_dir(), ob.get_lib_dir(), ob.get_library()


# The OpenBLAS library a build links, under its soname (the name model.so and the module record as
# needed). Every build holds a copy of it and finds it through an $ORIGIN RUNPATH, so a compiled
# directory runs wherever it is copied, without the venv it was built in (the wheel ships no static
# library to link instead).
BLAS_FILE = "libscipy_openblas.so"


def openblas_library() -> Path:
    """The scipy-openblas32 wheel's shared library, which builds copy beside model.so."""
    _, libdir, lib = openblas()
    path = Path(libdir) / f"lib{lib}.so"
    if path.name != BLAS_FILE or not regular_file(path):
        raise SaturateError(f"{path}: not the library {BLAS_FILE} the C backend links; reinstall scipy-openblas32")
    return path


@functools.lru_cache(maxsize=None)
def _stat_digest(path: str, stamp: tuple) -> str:
    return file_digest(Path(path))


def openblas_digest() -> str:
    """The sha256 of openblas_library(), hashed again whenever the file changes (its inode, size or times)."""
    path = openblas_library()
    st = os.stat(path)
    return _stat_digest(str(path), (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))


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


@functools.lru_cache(maxsize=None)
def compiler_version(cc: str) -> str:
    """The first line of `cc --version`: a compiler upgrade must not reuse libraries the old one built."""
    proc = subprocess.run([cc, "--version"], capture_output=True, text=True)
    return (proc.stdout.strip().splitlines() or [cc])[0]


@functools.lru_cache(maxsize=None)
def cpu_features() -> str:
    """The CPU's model and feature flags: -march=native code built on one machine may not run on another."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.machine()
    keep = [line for line in text.splitlines() if line.split(":")[0].strip() in ("model name", "flags", "Features")]
    return "\n".join(dict.fromkeys(keep)) or platform.machine()


# Instruction sets a build may target ($SATURATE_ISA): this CPU's own, AVX2 with FMA (x86-64-v3, the paths
# an AVX2 machine runs), the compiler's default target (no vector extensions beyond the base ABI), or
# AVX-512 (x86-64-v4: builds the AVX-512 kernels on any machine; they run only on a CPU that has them).
ISAS = {"native": ["-march=native"], "avx2": ["-march=x86-64-v3"], "portable": [], "avx512": ["-march=x86-64-v4"]}


def isa() -> str:
    """The instruction set builds target: $SATURATE_ISA (native, avx2, portable or avx512), native by default."""
    value = os.environ.get("SATURATE_ISA", "native") or "native"
    if value not in ISAS:
        raise SaturateError(f"SATURATE_ISA={value!r}: expected one of {', '.join(ISAS)}")
    return value
