"""Test configuration: hypothesis runs derandomized under CI, so a landing never rests on luck."""

import os

from hypothesis import HealthCheck, settings

# Locally every run explores new examples; in CI the same examples run every time, and a
# failure there reproduces on any machine with CI=true.
settings.register_profile("ci", derandomize=True, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
if os.environ.get("CI"):
    settings.load_profile("ci")


def pytest_configure(config):
    """Point every cache saturate keeps (parsed rules, compiled builds) into this run's temporary
    folder: tests never read or write the user's caches. xdist workers inherit the variables, so a
    run's workers share one cache, as one user's processes do."""
    if hasattr(config, "workerinput"):
        return
    import tempfile

    base = tempfile.mkdtemp(prefix="saturate-test-cache-")
    os.environ["XDG_CACHE_HOME"] = os.path.join(base, "xdg")
    os.environ["SATURATE_CACHE"] = os.path.join(base, "backend")
    config._saturate_cache = base


def pytest_unconfigure(config):
    import shutil

    base = getattr(config, "_saturate_cache", None)
    if base:
        shutil.rmtree(base, ignore_errors=True)


def pytest_addoption(parser):
    parser.addoption("--fuzz-examples", type=int, default=25, metavar="N",
                     help="examples per kind in tests/test_fuzz.py (default 25; more to fuzz longer)")


import pytest  # noqa: E402  (after the hooks above, which must not need it)


@pytest.fixture
def fuzz_examples(request) -> int:
    return request.config.getoption("--fuzz-examples")


@pytest.fixture(autouse=True)
def _memory_limit_per_test(monkeypatch):
    """`--max-memory` sets an environment variable for child processes; a test that passes it to
    main() in this process must not leave it to the tests after it."""
    monkeypatch.delenv("SATURATE_MAX_MEMORY", raising=False)


# The files that take the most worker time, dearest first (per-file sums of `--durations=0`). xdist's
# loadfile hands out whole files in collection order (--no-loadscope-reorder), so these start first and
# the many small files fill in around them at the end; by default xdist orders files by their number of
# tests, which left single dear tests (the ASan run) to start last and run alone. Only the order depends
# on this list: a file missing from it runs after those in it.
DEAREST_FIRST = ["test_corpus.py", "test_check.py", "test_backend_asan.py", "test_backend_binding.py",
                 "test_backend.py", "test_backend_trust.py", "test_backend_ops.py", "test_faults.py",
                 "test_backend_hypothesis.py", "test_backend_kernels.py", "test_check_any_op.py",
                 "test_check_blindspots.py", "test_text.py", "test_onnx_io.py", "test_wheel.py", "test_run_cli.py",
                 "test_interp_conformance.py", "test_optimize.py", "test_signals.py", "test_kept_egraph.py", "test_control_flow.py",
                 "test_startup.py", "test_backend_quant.py", "test_backend_epilogue_reuse.py", "test_partition.py"]


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """On an xdist worker (whose collection order the controller follows), the dearest files first; the
    tests within a file keep their order (module fixtures stay grouped)."""
    if not hasattr(config, "workerinput"):
        return
    rank = {name: k for k, name in enumerate(DEAREST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
