"""What the benchmarks print about the machine that gave their figures."""

from __future__ import annotations

import platform
from pathlib import Path


def cpu_name() -> str:
    """The CPU's model name as the kernel reports it, with its family and model numbers, which tell the
    generation when a virtual machine shows only a brand ("AMD EPYC"): every figure names the CPU that gave it."""
    try:
        fields = {}
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
        if "model name" in fields:
            ids = [f"{k} {fields[k]}" for k in ("cpu family", "model") if k in fields]
            return fields["model name"] + (f" ({', '.join(ids)})" if ids else "")
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def build_label() -> str:
    """Which kernels the C backend builds and on what CPU: an AVX2 build measured on an AVX-512 CPU is
    not an AVX2 machine's figure, and the header says so."""
    from saturate.backend.build import cpu_has_avx512, isa

    target = isa()
    cpu = "an AVX-512 CPU" if cpu_has_avx512() else "a CPU without AVX-512"
    if target == "native":
        return f"native build ({'AVX-512' if cpu_has_avx512() else 'no AVX-512'} kernels)"
    return f"{target} build on {cpu}"


class Spinner:
    """A process that keeps one core busy for as long as the `with` block runs: the load a bench row
    is measured beside, the same for every runtime since their runs are interleaved."""

    def __init__(self, busy: bool = True):
        self.busy = busy
        self.proc = None

    def __enter__(self) -> "Spinner":
        import subprocess
        import sys

        if self.busy:
            self.proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None
