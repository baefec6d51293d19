"""What the benchmarks print about the machine that gave their figures."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

# Set by avx2_only.c's constructor once CPUID faults are answered with AVX-512 hidden.
MASKED = "SATURATE_AVX2_ONLY"


def _cpuinfo() -> dict[str, str]:
    """/proc/cpuinfo's fields as its first CPU gives them (empty where there is none)."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def cpu_name() -> str:
    """The CPU's model name as the kernel reports it, with its family and model numbers, which tell the
    generation when a virtual machine shows only a brand ("AMD EPYC"): every figure names the CPU that gave it."""
    fields = _cpuinfo()
    if "model name" in fields:
        ids = [f"{k} {fields[k]}" for k in ("cpu family", "model") if k in fields]
        return fields["model name"] + (f" ({', '.join(ids)})" if ids else "")
    return platform.processor() or platform.machine() or "unknown CPU"


def build_label() -> str:
    """Which kernels the C backend builds and on what CPU: an AVX2 build measured on an AVX-512 CPU is
    not an AVX2 machine's figure, and the header says so, and whether the other runtimes saw the AVX-512."""
    from saturate.backend.build import cpu_has_avx512, isa

    target = isa()
    cpu = "an AVX-512 CPU" if cpu_has_avx512() else "a CPU without AVX-512"
    if avx2_only():
        cpu += " shown to ONNX Runtime, numpy and OpenBLAS as AVX2 only (CPUID masked, --avx2-only)"
    if target == "native":
        return f"native build ({'AVX-512' if cpu_has_avx512() else 'no AVX-512'} kernels)"
    return f"{target} build on {cpu}"


def avx2_only() -> bool:
    """Whether this process runs under avx2_only.c with AVX-512 hidden from CPUID."""
    return os.environ.get(MASKED) == "masked"


def cpu_flags() -> set[str]:
    """The CPU's feature flags (/proc/cpuinfo's "flags")."""
    return set(_cpuinfo().get("flags", "").split())


def avx2_only_library(directory: Path) -> Path:
    """avx2_only.c compiled into directory: the library LD_PRELOAD loads to hide AVX-512 from CPUID."""
    from saturate.backend.toolchain import compiler

    library = directory / "avx2_only.so"
    source = Path(__file__).with_name("avx2_only.c")
    proc = subprocess.run([compiler(), "-O2", "-shared", "-fPIC", "-o", str(library), str(source)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"--avx2-only: {source} did not compile: {proc.stderr.strip()}")
    return library


def exec_avx2_only(argv: list[str]) -> None:
    """Start this script again (sys.argv[0] with argv) as on an AVX2 machine: the AVX2 build
    (SATURATE_ISA=avx2) against ONNX Runtime's, numpy's and OpenBLAS's AVX2 kernels, AVX-512 hidden from
    CPUID by avx2_only.c. Returns only when there is nothing to hide (a CPU without AVX-512: the
    AVX2 build alone is then set); raises SystemExit when the CPU or kernel cannot fault CPUID."""
    flags = cpu_flags()
    if "avx512f" not in flags:
        os.environ["SATURATE_ISA"] = "avx2"
        return
    if platform.machine() != "x86_64" or "cpuid_fault" not in flags:
        raise SystemExit("--avx2-only: this CPU or kernel cannot fault CPUID (no cpuid_fault in /proc/cpuinfo), "
                         "so ONNX Runtime cannot be kept off its AVX-512 kernels here")
    directory = Path(tempfile.mkdtemp(prefix="saturate-avx2-only-"))
    library = avx2_only_library(directory)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONFAULTHANDLER", MASKED)}
    # Python's fault handler would take SIGSEGV, which answers CPUID here, from the library.
    env.update(LD_PRELOAD=str(library), SATURATE_ISA="avx2", SATURATE_AVX2_ONLY_DIR=str(directory))
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, sys.argv[0], *argv], env)


def check_avx2_only() -> None:
    """In the process exec_avx2_only started: remove the library's directory (the library stays mapped) and
    refuse to go on unless numpy, which read CPUID at import, saw no AVX-512."""
    directory = os.environ.pop("SATURATE_AVX2_ONLY_DIR", None)
    if directory:
        for path in Path(directory).glob("*"):
            path.unlink()
        Path(directory).rmdir()
    try:
        from numpy._core._multiarray_umath import __cpu_features__
    except ImportError:  # numpy before 2.0
        from numpy.core._multiarray_umath import __cpu_features__

    if not avx2_only() or __cpu_features__.get("AVX512F"):
        raise SystemExit("--avx2-only: AVX-512 is still visible through CPUID; the figures would not be an "
                         "AVX2 machine's")


class Spinner:
    """A process that keeps one core busy for as long as the `with` block runs: the load a bench row
    is measured beside, the same for every runtime since their runs are interleaved."""

    def __init__(self, busy: bool = True):
        self.busy = busy
        self.proc = None

    def __enter__(self) -> "Spinner":
        if self.busy:
            self.proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None
