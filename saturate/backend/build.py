"""C backend, build stage: compile the emitted C into a shared library and a Python extension module
against OpenBLAS, cached by content hash."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.machinery
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Callable, Iterable, Iterator

from saturate.backend.cache import (SHARED_BLAS_PREFIX, cache_limit_bytes, cache_root, evict, file_digest,
                                     mark_support_used, mark_used, prune_cache, prune_due, read_small,
                                     regular_file)
# cpu_has_avx512 and isa are read through this module by bench/machine.py and tests.
from saturate.backend.toolchain import (BLAS_FILE, ISAS, compiler, compiler_version, cpu_features,  # noqa: F401
                                        cpu_has_avx512, isa, openblas, openblas_digest, openblas_library)
from saturate.backend.weights import WeightsBlob
from saturate.core.errors import SaturateError

# The C headers and binding.pyx, package data; a real folder, for the compiler's -I.
KERNELS_DIR = Path(str(resources.files("saturate.backend"))).resolve()
SANITIZE_FLAGS = ["-fsanitize=address", "-fno-omit-frame-pointer", "-g"]


# Which kernel runs a conv is the planner's choice (plan.py); tests force the others to reach every kernel.
WINO_CHOICES = ("auto", "off", "all")


@dataclass(frozen=True)
class BuildConfig:
    """How a model is planned, emitted and compiled, passed through plan, emit and build and folded into the
    build key. from_env reads the user's settings when a build starts; the rest are kernel choices tests force.

    isa: the instruction set ($SATURATE_ISA). wino: Winograd on the convs the planner picks ("auto"), on none
    ("off") or on every conv it can run ("all"). conv_layout: pgemm.h's tile layout (0, 1 or 2) for every conv
    on it, else the planner's. stream: few-pixel convs on streamed weights (builds without AVX-512). im2col:
    every conv on im2col and OpenBLAS, the path of convs whose weights are not constants. direct: kxk convs
    on the AVX2 direct tiles (dconv8.h) where the planner picks them (AVX2 builds), else on the kernels before
    (tests of those kernels turn it off). pw: 1x1 convs on sat_conv_pw (pw.h) and pixel panels where the planner
    picks them (AVX-512 and AVX2 builds), else on the kernels before (tests of those kernels turn it off)."""

    isa: str = "native"
    sanitize: bool = False
    profile: bool = False
    wino: str = "auto"
    conv_layout: int | None = None
    stream: bool = True
    im2col: bool = False
    direct: bool = True
    pw: bool = True

    def __post_init__(self):
        if self.isa not in ISAS:
            raise SaturateError(f"SATURATE_ISA={self.isa!r}: expected one of {', '.join(ISAS)}")
        if self.wino not in WINO_CHOICES:
            raise SaturateError(f"wino={self.wino!r}: expected one of {', '.join(WINO_CHOICES)}")

    @classmethod
    def from_env(cls, **choices) -> "BuildConfig":
        """The settings in force now ($SATURATE_ISA), with `choices` (sanitize, profile, kernel choices)."""
        return cls(isa=isa(), **choices)

    @property
    def avx512(self) -> bool:
        """Whether the build holds the AVX-512 kernels: an avx512 build, or a native one on a CPU that has them."""
        return self.isa == "avx512" or (self.isa == "native" and cpu_has_avx512())

    @property
    def lanes(self) -> int:
        """Floats per vector register (vec.h's SAT_VL): 16 with AVX-512, 8 with AVX, else 4 (the portable
        build's SSE2 or NEON registers)."""
        if self.avx512:
            return 16
        if self.isa == "avx2" or (self.isa == "native" and _cpu_has_avx()):
            return 8
        return 4

    @property
    def packed_gemm(self) -> bool:
        """Whether convs run on the AVX-512 kernels of gemm.h and dconv.h."""
        return self.avx512 and not self.im2col

    @property
    def pgemm(self) -> bool:
        """Whether convs and products may run on pgemm.h's tile and the kernels beside it (wino.h, streamed)."""
        return not self.im2col


def avx512_build() -> bool:
    """Whether builds for $SATURATE_ISA hold the AVX-512 kernels."""
    return BuildConfig.from_env().avx512


def vector_lanes() -> int:
    """Floats per vector register of builds for $SATURATE_ISA (vec.h's SAT_VL)."""
    return BuildConfig.from_env().lanes


def _cpu_has_avx() -> bool:
    try:
        return " avx " in Path("/proc/cpuinfo").read_text().replace("\n", " ")
    except OSError:
        return False


# Past this many kernel steps a model compiles at -O2 without speculative inlining: -O3 on thousands
# of fused epilogues takes minutes of compiler time for no measurable run-time gain.
LARGE_STEPS = 400
# The name of the model's Python extension module in a compiled directory (binding.pyx).
MODULE = "saturate_model"
EXTENSION = MODULE + importlib.machinery.EXTENSION_SUFFIXES[0]
# What a compiled directory holds once its build finished. build.json, written last, records what the build
# targeted (a library built for another CPU is refused rather than run into SIGILL) and the sha256 of every
# other file (a file changed since is refused rather than loaded).
FACTS = "build.json"
BUILD_FILES = ("model.c", "model.h", "weights.bin", "model.so", EXTENSION, BLAS_FILE, FACTS, "build.key")


def compile_flags(config: BuildConfig | None = None, large: bool = False) -> list[str]:
    """Flags compiling an emitted model (of `config`, else of the settings in force) to a position-independent
    object."""
    config = config or BuildConfig.from_env()
    opt = ["-O2", "-fno-inline-functions", "-fno-inline-small-functions"] if large else ["-O3"]
    # No FP traps are observed, so gcc may if-convert float selects (clamps, relu) and vectorize
    # the pointwise loops; values are unchanged (IEEE non-stop arithmetic either way).
    # The kernels are a header library of static functions and each model calls only some of them; and
    # every function passing vectors is static in the one translation unit, so the vector-ABI note (-Wpsabi,
    # on targets narrower than the vector extensions' width) concerns no call across a library boundary.
    flags = [*opt, *ISAS[config.isa], "-fno-trapping-math", "-fPIC", "-pthread", "-std=gnu11", "-Wall", "-Werror",
             "-Wno-unused-function", "-Wno-psabi", "-include", "sat_heap.h"]
    if config.sanitize:
        flags += SANITIZE_FLAGS
    if config.profile:
        flags.append("-DSAT_PROFILE")
    return flags


def compile_command(source: Path, target: Path, config: BuildConfig, large: bool = False,
                    prelude: Path | None = None) -> list[str]:
    """The compiler command line turning one emitted model into an object file; with `prelude` (a folder
    from model_prelude), the model's headers come precompiled from there."""
    inc, _, _ = openblas()
    flags = compile_flags(config, large)
    if prelude is not None:
        flags[flags.index("sat_heap.h")] = str(prelude / PRELUDE)
    return [compiler(), *flags, f"-I{KERNELS_DIR}", f"-I{inc}", "-c", str(source), "-o", str(target)]


# What every emitted model includes first (sat_heap.h by -include, then kernels.h), compiled once per set of
# flags into a precompiled header beside it: reading and parsing the kernels' headers was about half of each
# model's compile (0.25 of 0.5 s of CPU for a 22-step segment of swinv2_cr). An emitted model's source
# starts with `#include "kernels.h"`, so nothing it defines could change what the headers mean.
PRELUDE = "sat_prelude.h"
PRELUDE_FILES = (PRELUDE, PRELUDE + ".gch")


def prelude_key(config: BuildConfig, large: bool) -> str:
    """The hash naming a prelude: the kernels' headers, the model compile's flags, the compiler and its
    version, the CPU's features (-march=native) and the OpenBLAS whose cblas.h the headers include."""
    return _kernels_key(KERNELS_DIR.glob("*.h"), compile_flags(config, large))


def _kernels_key(paths: Iterable[Path], flags: list[str]) -> str:
    """The hash of kernel files (name and content) compiled with `flags` by this compiler, for this CPU,
    against this OpenBLAS: what names the cache's kernel library and precompiled headers."""
    h = hashlib.sha256()
    for path in sorted(paths):
        h.update(path.name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    inc, _, _ = openblas()
    facts = [" ".join(flags), compiler_version(compiler()), cpu_features(), openblas_digest(), inc]
    h.update("\n".join(facts).encode())
    return h.hexdigest()[:24]


def model_prelude(config: BuildConfig, large: bool = False) -> Path | None:
    """The folder holding sat_prelude.h and its precompiled form for models compiled with `config` (and
    `large`), built in the cache on first use; used only when both files match the sha256s recorded beside
    them (prelude.sha256, written last), else built again. None for a compiler other than gcc (whose
    precompiled headers these are) or where it cannot be built: the model then reads its headers itself, as
    a compiler also does with a precompiled header its flags do not match."""
    if "clang" in compiler_version(compiler()).lower():
        return None
    target = cache_root() / f"prelude-{prelude_key(config, large)}"
    try:
        with _built_once(target, lambda: _prelude_matches(target)) as missing:
            if missing:
                _build_prelude(target, config, large)
    except (SaturateError, OSError):
        return None
    return target


def _prelude_matches(target: Path) -> bool:
    try:
        recorded = json.loads(read_small(target / "prelude.sha256"))
        return all(regular_file(target / name) and recorded.get(name) == file_digest(target / name)
                   for name in PRELUDE_FILES)
    except (OSError, ValueError, AttributeError):
        return False


def _build_prelude(target: Path, config: BuildConfig, large: bool) -> None:
    inc, _, _ = openblas()
    stage = Path(tempfile.mkdtemp(dir=target.parent, prefix=".prelude."))
    try:
        (stage / PRELUDE).write_text('#include "sat_heap.h"\n#include "kernels.h"\n')
        flags = [f for f in compile_flags(config, large) if f not in ("-include", "sat_heap.h")]
        _run([compiler(), *flags, f"-I{KERNELS_DIR}", f"-I{inc}", "-x", "c-header", str(stage / PRELUDE),
              "-o", str(stage / (PRELUDE + ".gch"))], "C compiler failed on the kernels' headers", stage)
        digests_ = {name: file_digest(stage / name) for name in PRELUDE_FILES}
        (stage / "prelude.sha256").write_text(json.dumps(digests_) + "\n")
        if os.path.lexists(target):
            evict(target)
        os.rename(stage, target)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


# The kernels' bodies (the .c beside their headers), compiled into one static archive per compiler, flags and
# instruction set (library_key) and linked into every model: a model's compile is its own glue and the
# work-item templates its epilogues are inlined into. SAT_LIBRARY leaves out what each model defines itself.
LIBRARY_SOURCES = ("dconv.c", "gemm.c", "kernels.c", "pgemm.c", "pool.c", "qgemm.c", "sat_heap.c", "tensor.c", "vec.c",
                   "wino.c")


def library_flags(config: BuildConfig) -> list[str]:
    """Flags compiling the kernel library's sources: a model's, at -O3, with nothing exported. The library
    depends on the instruction set and the sanitizer only."""
    config = BuildConfig(isa=config.isa, sanitize=config.sanitize)
    return [*compile_flags(config), "-fvisibility=hidden", "-DSAT_LIBRARY"]


def library_key(config: BuildConfig) -> str:
    """The hash naming a kernel library: its sources and headers, the compiler and its version, the flags, the
    CPU's features (-march=native) and the OpenBLAS whose cblas.h it includes."""
    return _kernels_key([*KERNELS_DIR.glob("*.h"), *(KERNELS_DIR / name for name in LIBRARY_SOURCES)],
                        library_flags(config))


# Library objects compiled at once: the sources take seconds each, and a machine's cores share them.
LIBRARY_JOBS = max(1, min(len(LIBRARY_SOURCES), os.cpu_count() or 1))


def kernel_library(config: BuildConfig | None = None) -> Path:
    """The kernel library for `config` (else the settings in force): libsat-KEY.a in the cache, built on first
    use. Used only when it matches the sha256 recorded beside it (libsat-KEY.sha256, written after it);
    anything else is built again."""
    config = config or BuildConfig.from_env()
    target = cache_root() / f"libsat-{library_key(config)}.a"
    with _built_once(target, lambda: _library_matches(target)) as missing:
        if missing:
            _build_library(target, config)
    return target


@contextlib.contextmanager
def _built_once(target: Path, matches: Callable[[], bool]) -> Iterator[bool]:
    """Whether the cache entry `target` must be built (the caller then builds it inside the block): False
    when it `matches` its digests (its use is then recorded). One process builds it while others that need it
    wait on a lock beside it (a test run's workers, parallel compiles), rather than each spending the same
    seconds of both cores."""
    if matches():
        mark_support_used(target)
        yield False
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    lock = target.parent / (target.name.rsplit(".", 1)[0] + ".lock")
    # (not following a link, nor blocking on a FIFO put in its place)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SaturateError(f"{lock}: not a regular file; remove it")
        fcntl.flock(fd, fcntl.LOCK_EX)
        if matches():
            yield False
            return
        if os.path.lexists(target):
            print(f"saturate: cache entry {target.name} did not match its digest; rebuilding", file=sys.stderr)
        yield True
    finally:
        os.close(fd)


def _library_matches(target: Path) -> bool:
    """Whether `target` is a regular file matching the sha256 recorded beside it."""
    stamp = target.with_suffix(".sha256")
    try:
        return regular_file(target) and read_small(stamp).strip() == file_digest(target)
    except (OSError, ValueError):
        return False


def _build_library(target: Path, config: BuildConfig) -> None:
    """Compile the library's sources in a staging folder beside `target` and rename the archive, then its
    digest, into place."""
    stamp = target.with_suffix(".sha256")
    inc, _, _ = openblas()
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".libsat.") as tmp:
        objects = [Path(tmp) / (name[:-2] + ".o") for name in LIBRARY_SOURCES]
        _run_all([([compiler(), *library_flags(config), f"-I{KERNELS_DIR}", f"-I{inc}", "-c", str(KERNELS_DIR / name),
                    "-o", str(obj)], f"C compiler failed on the kernel library's {name}")
                  for name, obj in zip(LIBRARY_SOURCES, objects)], Path(tmp))
        archive = Path(tmp) / "libsat.a"
        _run(["ar", "rcs", str(archive), *map(str, objects)], "ar failed on the kernel library", Path(tmp))
        (Path(tmp) / "libsat.sha256").write_text(file_digest(archive) + "\n")
        os.replace(archive, target)
        os.replace(Path(tmp) / "libsat.sha256", stamp)


def link_command(objects: list[Path], target: Path, sanitize: bool = False) -> list[str]:
    """The command linking objects into a shared library against OpenBLAS. -Bsymbolic binds the model's
    own calls inside it, so a library loaded earlier that exports the same sat_* names never intercepts them;
    the soname is the file's name, so a C program linked with DIR/model.so finds it by its rpath. The only
    RUNPATH is $ORIGIN, the library's own directory, where the build puts its copy of OpenBLAS: nothing
    resolves into the venv."""
    _, libdir, lib = openblas()
    return [compiler(), "-shared", "-pthread", *(SANITIZE_FLAGS if sanitize else []), *map(str, objects),
            "-o", str(target), f"-Wl,-soname,{Path(target).name}", "-Wl,-Bsymbolic", f"-L{libdir}", f"-l{lib}",
            "-Wl,-rpath,$ORIGIN", "-lm"]


def build_key(source: str, weights: bytes | WeightsBlob, config: BuildConfig | None = None) -> str:
    """The hash naming a build: the program, its weights, the kernels and binding it includes, the build's
    config, the compiler and its version, every flag, the CPU's features (-march=native), the Python the
    module is for and the OpenBLAS library the build holds a copy of."""
    config = config or BuildConfig.from_env()
    kernels = b"".join(p.read_bytes() for p in sorted(KERNELS_DIR.glob("*.h")))
    large = source.count("SAT_TOC(") > LARGE_STEPS
    flags = " ".join(compile_command(Path("model.c"), Path("model.o"), config, large)
                     + link_command([Path("model.o")], Path("model.so"), config.sanitize))
    facts = "\n".join([repr(config), flags, compiler_version(compiler()), cpu_features(), EXTENSION, binding_key(),
                       openblas_digest(), library_key(config)])
    h = hashlib.sha256()
    for part in (source.encode(), kernels, weights, facts.encode()):
        h.update(part.digest() if isinstance(part, WeightsBlob) else hashlib.sha256(part).digest())
    return h.hexdigest()[:24]


def binding_key() -> str:
    """The hash of the Cython module's object: its source, Cython's, numpy's and Python's versions, the
    compiler."""
    import numpy

    from saturate.core.extras import need

    Cython = need("Cython", "c", "the C backend", "cython")
    parts = [(KERNELS_DIR / "binding.pyx").read_text(), (KERNELS_DIR / "binding.h").read_text(),
             (KERNELS_DIR / "sat_api.h").read_text(), Cython.__version__, numpy.__version__, sys.version, EXTENSION,
             compiler_version(compiler()), " ".join(binding_flags())]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def binding_flags() -> list[str]:
    import numpy

    # The module checks and allocates arrays through numpy's C API (binding.pyx): numpy's headers, whose
    # version binding_key names.
    return ["-O2", "-fPIC", "-pthread", "-Wall", "-Werror", f"-I{sysconfig.get_paths()['include']}", f"-I{KERNELS_DIR}",
            f"-I{numpy.get_include()}", "-DNPY_NO_DEPRECATED_API=NPY_1_7_API_VERSION"]


def binding_object() -> Path:
    """The compiled Cython module without a model (one per cache): each model's extension links it with the
    model's object, so a build pays only a link for it. Used only when it matches the sha256 recorded
    beside it (binding-KEY.sha256, written after it); anything else is built again."""
    target = cache_root() / f"binding-{binding_key()}.o"
    stamp = target.with_suffix(".sha256")
    try:
        if regular_file(target) and read_small(stamp).strip() == file_digest(target):
            mark_support_used(target)
            return target
    except (OSError, ValueError):
        pass
    if os.path.lexists(target):
        print(f"saturate: cache entry {target.name} did not match its digest; rebuilding", file=sys.stderr)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".binding.") as tmp:
        c = Path(tmp) / f"{MODULE}.c"
        _run([sys.executable, "-m", "cython", "-3", "--module-name", MODULE, "-o", str(c),
              str(KERNELS_DIR / "binding.pyx")], "Cython failed on binding.pyx", Path(tmp))
        _run([compiler(), *binding_flags(), "-c", str(c), "-o", str(Path(tmp) / "binding.o")],
             f"C compiler failed on the Cython module {c.name}", Path(tmp))
        (Path(tmp) / "binding.sha256").write_text(file_digest(Path(tmp) / "binding.o") + "\n")
        os.replace(Path(tmp) / "binding.o", target)
        os.replace(Path(tmp) / "binding.sha256", stamp)
    return target


def place_openblas(dest: Path) -> str:
    """Put OpenBLAS at `dest`, a hard link to the cache's one copy (a copy where the file system has no hard
    links), and return its sha256. The shared copy is used only when what `dest` then holds matches the
    wheel's library; anything else there (missing, changed) is copied from the wheel again."""
    digest = openblas_digest()
    shared = cache_root() / f"{SHARED_BLAS_PREFIX}{digest[:24]}.so"
    if _link_or_copy(shared, dest) and file_digest(dest) == digest:
        return digest
    if os.path.lexists(dest):
        dest.unlink()
    fd, tmp = tempfile.mkstemp(dir=shared.parent, prefix=f".{SHARED_BLAS_PREFIX}")
    os.close(fd)
    try:
        shutil.copyfile(openblas_library(), tmp)
        os.replace(tmp, shared)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
    _link_or_copy(shared, dest)
    if file_digest(dest) != digest:
        raise SaturateError(f"{openblas_library()} changed while it was copied into the build cache {shared.parent}; "
                            "compile again")
    return digest


def _link_or_copy(shared: Path, dest: Path) -> bool:
    """Hard-link `dest` to `shared`, or copy it where the file system has no hard links; False when `shared`
    is missing or not a regular file."""
    if not regular_file(shared):
        return False
    try:
        os.link(shared, dest)
    except FileNotFoundError:  # removed by another process meanwhile
        return False
    except OSError:
        shutil.copyfile(shared, dest)
    return True


# After SIGTERM a compiler gets this long to remove its own temp files before its group is killed.
COMPILER_GRACE_SECONDS = 0.5


def _run(cmd: list[str], what: str, tmpdir: Path | None = None) -> None:
    """Run a compiler step; a failure is one line naming `what`. The compiler runs in a process group of
    its own with its temp files in `tmpdir` (a staging directory removed with it): an interrupt (SIGINT,
    or SIGTERM raised as an exception by the CLI) ends the whole group, cc1 and as included, before it
    propagates, instead of leaving them running as orphans."""
    env = None if tmpdir is None else dict(os.environ, TMPDIR=str(tmpdir))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate()
    except BaseException:
        _end_group(proc)
        raise
    if proc.returncode != 0:
        lines = [line for line in (stderr + stdout).strip().splitlines() if line.strip()]
        first = next((line for line in lines if "error" in line.lower()), lines[0] if lines else "(no output)")
        raise SaturateError(f"{what}: {first.strip()}")


def _run_all(steps: list[tuple[list[str], str]], tmpdir: Path) -> None:
    """Run compiler steps (command, what) LIBRARY_JOBS at a time, as _run does one; the first failure is one line
    naming its `what`, after every step started has ended."""
    env = dict(os.environ, TMPDIR=str(tmpdir))
    pending, running, failure = list(steps), [], None
    try:
        while pending or running:
            while pending and len(running) < LIBRARY_JOBS and failure is None:
                cmd, what = pending.pop(0)
                running.append((subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                                 env=env, start_new_session=True), what))
            if not running:
                break
            proc, what = running[0]
            output, _ = proc.communicate()
            running.pop(0)
            if proc.returncode != 0 and failure is None:
                lines = [line for line in output.strip().splitlines() if line.strip()]
                first = next((line for line in lines if "error" in line.lower()), lines[0] if lines else "(no output)")
                failure = f"{what}: {first.strip()}"
    except BaseException:
        for proc, _ in running:
            _end_group(proc)
        raise
    if failure is not None:
        raise SaturateError(failure)


def _end_group(proc: subprocess.Popen) -> None:
    """SIGTERM to a compiler's process group (gcc's driver removes its temp files on it), SIGKILL to what
    is left of the group after COMPILER_GRACE_SECONDS, and reap the compiler."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except OSError:  # the group is gone already
        pass
    try:
        proc.wait(COMPILER_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # cc1 or as, should the driver have left them behind
    except OSError:
        pass
    try:
        proc.wait()
    except BaseException:  # a second interrupt while reaping: the group is killed already
        pass
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


# build.json holds a few kilobytes; anything far larger in its place is not one (and is not read whole).
FACTS_MAX_BYTES = 1 << 20


def read_facts(directory: Path) -> dict | None:
    """A build's build.json as a dict, or None when it is missing, not a regular file, too large or not
    a JSON object."""
    path = Path(directory) / FACTS
    try:
        if not regular_file(path) or os.stat(path).st_size > FACTS_MAX_BYTES:
            return None
        facts = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return None
    return facts if isinstance(facts, dict) else None


def digests(directory: Path, known: dict[str, str] | None = None) -> dict[str, str]:
    """The sha256 of every file of a build but build.json, which records them; `known` gives the ones
    just checked (OpenBLAS, tens of megabytes)."""
    known = known or {}
    return {name: known.get(name) or file_digest(Path(directory) / name) for name in BUILD_FILES if name != FACTS}


def mismatch(directory: Path, key: str | None = None) -> str | None:
    """Why `directory` is not a finished build (of `key`, when given) whose every file matches the sha256
    its build.json recorded when it was built, as "FILE: reason"; None when it is one."""
    directory = Path(directory)
    facts = read_facts(directory)
    if facts is None:
        return f"{FACTS}: it is missing or unreadable"
    recorded = facts.get("files")
    if not isinstance(recorded, dict) or set(recorded) != set(BUILD_FILES) - {FACTS}:
        return f"{FACTS}: it lists no digests of the files of a build"
    if key is not None and facts.get("key") != key:
        return f"{FACTS}: it is of another build"
    for name in BUILD_FILES:
        if name == FACTS:
            continue
        path = directory / name
        if not regular_file(path):
            return f"{name}: it is missing or not a regular file"
        try:
            if file_digest(path) != recorded[name]:
                return f"{name}: it does not match the sha256 {FACTS} records"
        except OSError as err:
            return f"{name}: {err.strerror or err}"
    return None


def verify(directory: Path) -> None:
    """Refuse a compiled directory whose files are not the ones its build wrote (changed, truncated or
    replaced since), in one line naming the first such file."""
    problem = mismatch(directory)
    if problem is not None:
        raise SaturateError(f"{directory}: cannot load {problem}; compile the model again")


def runs_here(directory: Path) -> None:
    """Refuse a build this CPU cannot run: -march=native for another CPU, or AVX-512 where it is missing."""
    facts = read_facts(directory) or {}
    target, cpu = facts.get("isa"), facts.get("cpu")
    if not isinstance(target, str) or not isinstance(cpu, str):
        raise SaturateError(f"{directory}: no readable build.json; compile the model again")
    if target == "native" and cpu != cpu_features():
        model = next((line.split(":", 1)[1].strip() for line in cpu.splitlines() if line.startswith("model name")),
                     "another CPU")
        raise SaturateError(f"{directory}: built with -march=native for {model}, not this CPU; compile it again "
                            "here, or build it with SATURATE_ISA=avx2 or portable to run it on other machines")
    if target == "avx512" and not cpu_has_avx512():
        raise SaturateError(f"{directory}: built for AVX-512 (SATURATE_ISA=avx512), which this CPU lacks")


def build(source: str, weights: bytes | WeightsBlob, header: str, config: BuildConfig | None = None) -> Path:
    """Compile one emitted model into the cache; returns the directory holding model.c, model.h,
    weights.bin, model.so (the C library), the Python extension module, OpenBLAS (BLAS_FILE, hard-linked to
    the cache's one copy), build.key and build.json.

    The directory is named by build_key, so the same graph on the same machine and toolchain compiles
    once; it is built beside its final name and renamed into place, so no reader sees half of it. A
    cached directory is used only when every file matches the sha256 its build.json recorded (written
    last); anything else there is rebuilt, with one line saying so."""
    config = config or BuildConfig.from_env()
    key = build_key(source, weights, config)
    root = cache_root()
    target = root / key
    cache_limit_bytes()  # a bad $SATURATE_CACHE_MB is refused on every build, not only when a prune is due
    if os.path.lexists(target):
        # marked before its digests are read (seconds for large weights): a prune meanwhile leaves it be
        mark_used(target)
        problem = mismatch(target, key)
        if problem is None:
            return target
        print(f"saturate: cache entry {key} did not match its digests ({problem}); rebuilding", file=sys.stderr)
    try:
        _build_into(root, key, source, weights, header, config)
    except OSError as err:  # a full disk, a read-only or vanished cache folder
        where = f" ({err.filename})" if err.filename else ""
        raise SaturateError(f"cannot write the build cache {root}{where}: {err.strerror or err}; free some space "
                            "or point SATURATE_CACHE at a writable folder") from None
    if prune_due():
        prune_cache(keep=target)
    return target


def _build_into(root: Path, key: str, source: str, weights: bytes | WeightsBlob, header: str,
                config: BuildConfig) -> None:
    """Build `key` in a staging directory of `root` and rename it to root/key (replacing what is there)."""
    target = root / key
    binding = binding_object()
    library = kernel_library(config)
    stage = Path(tempfile.mkdtemp(dir=root, prefix=f".{key}."))
    try:
        for name, data in (("model.c", source.encode()), ("model.h", header.encode())):
            (stage / name).write_bytes(data)
        if isinstance(weights, WeightsBlob):
            weights.write_to(stage / "weights.bin")
        else:
            (stage / "weights.bin").write_bytes(weights)
        large = source.count("SAT_TOC(") > LARGE_STEPS
        obj = stage / "model.o"
        prelude = model_prelude(config, large)
        try:
            _run(compile_command(stage / "model.c", obj, config, large, prelude), "C compiler failed", stage)
        except SaturateError as err:  # keep the source the message speaks of
            kept = root / f"failed-{key}.c"
            os.replace(stage / "model.c", kept)
            first = str(err).removeprefix("C compiler failed: ").replace(str(stage / "model.c"), kept.name)
            raise SaturateError(f"C compiler failed on {kept}: {first}") from None
        _run(link_command([obj, library], stage / "model.so", config.sanitize), f"linking {target / 'model.so'} failed",
             stage)
        _run(link_command([binding, obj, library], stage / EXTENSION, config.sanitize),
             f"linking {target / EXTENSION} failed", stage)
        obj.unlink()
        blas = place_openblas(stage / BLAS_FILE)
        (stage / "build.key").write_text(key)
        facts = {"key": key, "isa": config.isa, "flags": compile_flags(config, large),
                 "compiler": compiler_version(compiler()), "cpu": cpu_features(),
                 "files": digests(stage, {BLAS_FILE: blas})}
        (stage / FACTS).write_text(json.dumps(facts, indent=1) + "\n", encoding="utf-8")
        if os.path.lexists(target):  # a build that failed its digests, or a foreign entry under this name
            try:
                evict(target)
            except FileNotFoundError:  # another process moved it first
                pass
        try:
            os.rename(stage, target)
        except OSError:
            if mismatch(target, key) is not None:  # else another process finished the same build first
                raise
    finally:
        shutil.rmtree(stage, ignore_errors=True)
