"""C backend under AddressSanitizer: compiled kernels run a few graphs with no ASan report."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.compiler, pytest.mark.slow]
HERE = Path(__file__).resolve().parent


def test_kernels_run_clean_under_address_sanitizer(tmp_path):
    libasan = subprocess.run(["cc", "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    if not os.path.isabs(libasan):
        pytest.fail("the C compiler has no libasan.so")
    env = dict(os.environ, LD_PRELOAD=libasan, SATURATE_CACHE=str(tmp_path),
               ASAN_OPTIONS="detect_leaks=0:abort_on_error=0:exitcode=97",
               PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(HERE / "backend_asan_cases.py")], env=env, cwd=HERE,
                          capture_output=True, text=True, timeout=600)
    assert "AddressSanitizer" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "asan cases ok" in proc.stdout
