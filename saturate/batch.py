"""Batch stage: optimize many models in parallel processes or on a Ray cluster; one failure never
stops the others, and every model's result, time and error land in one summary."""

from __future__ import annotations

import fnmatch
import glob
import json
import os
import select
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

from saturate.core.errors import SaturateError, SourceError, one_line
from saturate.core.fileio import sweep_stale_temps, write_atomic, written_together

MODEL_SUFFIXES = (".onnx", ".sat")


@dataclass(frozen=True)
class Job:
    """One model to optimize and where its result goes."""

    source: str
    output: str


@dataclass
class Outcome:
    """What became of one job: the node counts and stop reason, or the error, and the time taken."""

    source: str
    output: str
    ok: bool
    seconds: float
    nodes_before: int | None = None
    nodes_after: int | None = None
    stop_reason: str | None = None
    error: str | None = None
    # CPU seconds of the process (all its threads) for this model: far below `seconds` when the
    # job waited for a core or for the disk, which wall time alone cannot tell apart from work.
    cpu_seconds: float | None = None


@dataclass(frozen=True)
class Options:
    """The optimize options every job of a batch shares (plain data: it travels to other processes)."""

    rule_paths: tuple[str, ...]
    level: int
    only: tuple[str, ...] | None
    target: str
    preserve: tuple[str, ...]
    max_iterations: int
    max_nodes: int
    timeout: float
    fold_initializer_inputs: bool
    check: int = 0                                   # random inputs to compare in ONNX Runtime
    force: bool = False                              # write a result that fails the check
    input_shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()
    skip: tuple[str, ...] = ()                       # rules not to use
    max_fold_bytes: int | None = None                # fold-any's size limit (None: the default)


def expand_models(specs: Iterable[str]) -> list[str]:
    """Model paths from files, directories (their .onnx and .sat files, recursively) and globs;
    `example:NAME` and `corpus:NAME` pass through, `corpus:GLOB` picks corpus models. A spec that
    names nothing is an error."""
    found: list[str] = []
    for spec in specs:
        if spec.startswith("corpus:") and any(c in spec for c in "*?["):
            from saturate.frontend import corpus

            names = fnmatch.filter(corpus.names(), spec[len("corpus:"):])
            if not names:
                raise SaturateError(f"{spec}: no corpus model matches")
            found.extend(f"corpus:{n}" for n in names)
            continue
        if spec.startswith(("example:", "corpus:")):
            found.append(spec)
            continue
        path = Path(spec)
        if path.is_dir():
            inside = sorted(str(p) for p in path.rglob("*") if p.suffix.lower() in MODEL_SUFFIXES and p.is_file())
            if not inside:
                raise SaturateError(f"{spec}: no .onnx or .sat models in this directory")
            found.extend(inside)
        elif path.is_file():
            found.append(spec)
        else:
            matches = sorted(m for m in glob.glob(spec, recursive=True)
                             if Path(m).is_file() and Path(m).suffix.lower() in MODEL_SUFFIXES)
            if not matches:
                raise SaturateError(f"{spec}: no such file, directory or matching models")
            found.extend(matches)
    return list(dict.fromkeys(found))


def plan_jobs(models: list[str], outdir: str | os.PathLike) -> list[Job]:
    """Each model's output in `outdir`, under its own file name (an example as NAME.onnx); names
    that two models share are told apart by their folders."""
    def name(model: str, depth: int) -> str:
        if model.startswith(("example:", "corpus:")):
            return model.split(":", 1)[1] + ".onnx"
        parts = Path(model).resolve().parts
        return "__".join(parts[-depth:])

    jobs, depth = [], 1
    while True:
        names = [name(m, depth) for m in models]
        if len(set(names)) == len(names) or depth > 16:
            break
        depth += 1
    jobs = [Job(m, str(Path(outdir) / n)) for m, n in zip(models, names)]
    if len({j.output for j in jobs}) != len(jobs):
        raise SaturateError("two models would be written to the same output name")
    return jobs


# A node costs about as much batch time as this many bytes of weights (fitted on the corpus: a
# model's time follows its weights, which are read, folded and written, and its node count).
NODE_BYTES = 90_000


def estimated_work(source: str) -> int:
    """A rough measure of how long one model takes: its weight bytes plus NODE_BYTES per node for a
    corpus model (known from its skeleton), its file size for a file, 0 for a built-in example."""
    if source.startswith("example:"):
        return 0
    if source.startswith("corpus:"):
        import math

        from saturate.frontend import corpus

        try:
            skeleton = corpus.skeleton(source[len("corpus:"):])
        except SaturateError:  # reported by the job itself
            return 0
        weights = sum(4 * math.prod(t.dims) for t in skeleton.graph.initializer)
        return weights + NODE_BYTES * len(skeleton.graph.node)
    try:
        return os.path.getsize(source)
    except OSError:
        return 0


def largest_first(jobs: list[Job]) -> list[int]:
    """Job indices, the largest model first: started last, a large model would leave the other
    workers idle while it finishes alone."""
    work = [estimated_work(job.source) for job in jobs]
    return sorted(range(len(jobs)), key=lambda k: -work[k])


def optimize_job(job: Job, options: Options) -> Outcome:
    """Optimize one model and write it; every failure becomes the outcome's one-line error."""
    start, cpu = time.perf_counter(), time.process_time()
    try:
        from saturate.frontend import load_graph, save_graph
        from saturate.lang.parser import load_rules
        from saturate.pipeline import optimize

        from saturate import simplifier

        graph = load_graph(job.source)
        if options.input_shapes:
            graph = simplifier.with_input_shapes(graph, dict(options.input_shapes))
        rules = load_rules(list(options.rule_paths), level=options.level, names=options.only)
        rules = simplifier.without_rules(rules, options.skip)
        result, report = optimize(graph, rules, level=options.level, target=options.target,
                                  max_iterations=options.max_iterations, max_nodes=options.max_nodes,
                                  timeout=options.timeout, preserve=options.preserve,
                                  fold_initializer_inputs=options.fold_initializer_inputs,
                                  max_fold_bytes=options.max_fold_bytes)
        failure = None
        if options.check:
            try:
                failure = simplifier.check_outputs(graph, result, options.check)
            except simplifier.Unchecked:
                pass  # a model ONNX Runtime cannot run is optimized unchecked, as a single one is
            if failure is not None and not options.force:
                raise SaturateError(f"{failure}; not written (--force writes it)")
        with written_together():  # a model and its external data file, both or neither
            save_graph(result, job.output)
        if failure is not None:
            raise SaturateError(f"{failure}; written anyway (--force)")
        return Outcome(job.source, job.output, True, time.perf_counter() - start, len(graph.nodes),
                       len(result.nodes), report.run.stop_reason, cpu_seconds=time.process_time() - cpu)
    except BaseException as err:  # one model's failure (even an engine panic) must not stop the batch
        if not isinstance(err, Exception) and type(err).__name__ != "PanicException":
            raise  # Ctrl-C, SIGTERM (Stopped, saturate.cli.Terminated), exit: they end the batch
        # A SaturateError is the whole message (a path in it may hold a line break); a source
        # error without its excerpt; anything else, its first line.
        text = (f"{err.file}:{err.line}:{err.col}: {err.message}" if isinstance(err, SourceError)
                else str(err) if isinstance(err, SaturateError)
                else str(err).split("\n")[0] or type(err).__name__)
        if not isinstance(err, SaturateError):
            text = f"{type(err).__name__}: {text}"
        return Outcome(job.source, job.output, False, time.perf_counter() - start, error=text,
                       cpu_seconds=time.process_time() - cpu)


def run_batch(jobs: list[Job], options: Options, workers: int | None = None, cluster: str | None = None,
              done: Callable[[Outcome], None] | None = None) -> list[Outcome]:
    """Run every job, `workers` processes at a time (default: all cores) or as Ray tasks on the
    cluster at `cluster` ("local" starts one on this machine); outcomes in job order.

    An exception here (Ctrl-C, SIGTERM turned into Stopped) kills the worker processes at once
    and removes the temp files they leave, then propagates: `done` has seen what finished."""
    if cluster is not None:
        return _run_on_ray(jobs, options, cluster, done)
    workers = max(1, min(workers or os.cpu_count() or 1, len(jobs)))
    outcomes: dict[int, Outcome] = {}
    if workers == 1:
        for k, job in enumerate(jobs):
            outcomes[k] = optimize_job(job, options)
            if done:
                done(outcomes[k])
        return [outcomes[k] for k in range(len(jobs))]
    order = deque(largest_first(jobs))
    pool: list[_Worker] = []
    try:
        with selectors.DefaultSelector() as selector:
            def start_worker() -> None:
                worker = _Worker(options)
                pool.append(worker)
                selector.register(worker.proc.stdout, selectors.EVENT_READ, worker)
                worker.take(order, jobs)

            for _ in range(workers):
                start_worker()
            while any(w.job is not None for w in pool):
                for key, _ in selector.select():
                    worker: _Worker = key.data
                    answers = worker.read()
                    if answers is None:  # the worker process died (out of memory, a signal)
                        selector.unregister(worker.proc.stdout)
                        code = worker.end()
                        k = worker.job
                        if k is not None:
                            outcomes[k] = Outcome(jobs[k].source, jobs[k].output, False, 0.0,
                                                  error=f"worker process failed ({_exit_reason(code)})")
                            worker.job = None
                            if done:
                                done(outcomes[k])
                        if order:
                            start_worker()
                        continue
                    for answer in answers:
                        _record(worker, answer, outcomes, done)
                        worker.take(order, jobs)
    except BaseException:
        # Ctrl-C or SIGTERM (or a bug): the workers end now, not after their models, and the temp
        # files they were writing go with them. An outcome a worker already sent counts as done: its
        # model was written, and the summary says so.
        with signals_ignored():
            _collect_sent(pool, outcomes, done)
            _kill(pool)
            for folder in {os.path.dirname(job.output) or "." for job in jobs}:
                sweep_stale_temps(folder)
        raise
    for worker in pool:
        worker.end()
    return [outcomes[k] for k in range(len(jobs))]


class _Worker:
    """A worker process that optimizes one job at a time: a job goes in on its stdin, its outcome
    comes back on its stdout (one JSON line each). It runs in a process group of its own, so a
    Ctrl-C at the terminal reaches only the parent, which ends its workers itself. A fresh
    interpreter, not a fork, which would copy whatever threads the parent has started; -P keeps
    the working directory (which may hold anything) off its import path."""

    def __init__(self, options: Options) -> None:
        self.proc = subprocess.Popen([sys.executable, "-P", "-c", "from saturate.batch import work; work()"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, process_group=0)
        self.job: int | None = None
        self._partial = b""
        self._send({"options": asdict(options)})

    def _send(self, message: dict) -> None:
        try:
            self.proc.stdin.write(json.dumps(message).encode("utf-8") + b"\n")
            self.proc.stdin.flush()
        except BrokenPipeError:  # it died: its stdout ends, and the main loop sees that
            pass

    def take(self, order: deque[int], jobs: list[Job]) -> None:
        """Start the next job of `order`, or let the worker exit when none is left."""
        if order:
            self.job = order.popleft()
            self._send({"job": asdict(jobs[self.job])})
        elif not self.proc.stdin.closed:
            self.proc.stdin.close()

    def read(self) -> list[dict] | None:
        """The outcomes that arrived (maybe none yet), or None once the worker has exited."""
        data = os.read(self.proc.stdout.fileno(), 1 << 16)
        if not data:
            return None
        *lines, self._partial = (self._partial + data).split(b"\n")
        return [json.loads(line) for line in lines]

    def end(self) -> int:
        """Wait for the worker to exit; its exit code."""
        for pipe in (self.proc.stdin, self.proc.stdout):
            if not pipe.closed:
                pipe.close()
        return self.proc.wait()


class Stopped(BaseException):
    """SIGINT or SIGTERM arrived during a batch (a BaseException, so that no `except Exception`
    takes it for one model's failure)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextmanager
def stopped_by_signals() -> Iterator[None]:
    """Within the block, the first SIGINT or SIGTERM raises Stopped, wherever the main thread is;
    later ones are ignored until the block ends, so that clean-up after the first one finishes."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread sets handlers
        yield
        return

    def stop(signum, frame) -> None:
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)
        raise Stopped(signum)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextmanager
def signals_ignored() -> Iterator[None]:
    """SIGINT and SIGTERM ignored within the block (clean-up after the first one must finish)."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread sets handlers
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _collect_sent(pool: list[_Worker], outcomes: dict[int, Outcome], done: Callable[[Outcome], None] | None) -> None:
    """Record the outcomes the workers have written to their pipes and the batch has not read yet."""
    for worker in pool:
        if worker.job is None or worker.proc.stdout.closed:
            continue
        try:
            ready, _, _ = select.select([worker.proc.stdout], [], [], 0)
            answers = worker.read() if ready else []
        except (OSError, ValueError):  # a pipe gone, or a line cut short by the signal
            continue
        for answer in (answers or [])[:1]:  # a worker has one job at a time
            _record(worker, answer, outcomes, done)


def _record(worker: _Worker, answer: dict, outcomes: dict[int, Outcome],
            done: Callable[[Outcome], None] | None) -> None:
    """The outcome a worker sent for its job: recorded, told to `done`, the worker free for the next."""
    k = worker.job
    outcomes[k] = Outcome(**answer)
    worker.job = None
    if done:
        done(outcomes[k])


def _kill(pool: list[_Worker]) -> None:
    for worker in pool:
        try:
            os.killpg(worker.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for worker in pool:
        try:
            worker.end()
        except OSError:
            pass


def _exit_reason(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def work() -> None:
    """A batch worker's main loop (see _Worker): jobs in on stdin, outcomes out on stdout."""
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # anything else printed goes to stderr, never between the answers
    _import_stages()
    options = None
    for line in sys.stdin:
        message = json.loads(line)
        if "options" in message:
            options = Options(**{k: tuple(v) if isinstance(v, list) else v for k, v in message["options"].items()})
            continue
        outcome = optimize_job(Job(**message["job"]), options)
        answers.write(json.dumps(asdict(outcome)) + "\n")
        answers.flush()


def _import_stages() -> None:
    """A fresh worker imports the stages before its first job, so that job's time (and CPU) in the
    summary is its own, as it is with --jobs 1, and not the worker's start-up."""
    import saturate.frontend  # noqa: F401
    import saturate.lang.parser  # noqa: F401
    import saturate.pipeline  # noqa: F401


def _run_on_ray(jobs: list[Job], options: Options, cluster: str, done) -> list[Outcome]:
    try:
        import ray
    except ImportError:
        from saturate.core.extras import install_hint

        raise SaturateError(f"--cluster needs Ray: {install_hint('cluster')}") from None
    try:
        ray.init(address=None if cluster == "local" else cluster, ignore_reinit_error=True,
                 log_to_driver=False, include_dashboard=False)
    except Exception as err:
        raise SaturateError(f"cannot reach the Ray cluster at '{cluster}': {str(err).splitlines()[0]}") from None
    remote = ray.remote(optimize_job)
    pending = {remote.remote(jobs[k], options): k for k in largest_first(jobs)}
    outcomes: dict[int, Outcome] = {}
    try:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            k = pending.pop(ready[0])
            try:
                outcomes[k] = ray.get(ready[0])
            except Exception as err:
                outcomes[k] = Outcome(jobs[k].source, jobs[k].output, False, 0.0,
                                      error=f"Ray task failed: {str(err).splitlines()[0]}")
            if done:
                done(outcomes[k])
    except BaseException:  # Ctrl-C, SIGTERM: the tasks still queued or running end too
        with signals_ignored():
            for ref in pending:
                try:
                    ray.cancel(ref, force=True)
                except Exception:  # noqa: BLE001 - a task that already ended
                    pass
        raise
    return [outcomes[k] for k in range(len(jobs))]


def write_summary(outcomes: list[Outcome], path: str | os.PathLike, seconds: float,
                  not_done: list[str] | None = None) -> None:
    """summary.json: every model's outcome, and the batch's totals; for a batch cut short by a
    signal, `interrupted` and the models it did `not_done`."""
    data = {"models": len(outcomes), "failed": sum(not o.ok for o in outcomes), "seconds": round(seconds, 3),
            "results": [asdict(o) | {"seconds": round(o.seconds, 3),
                                     "cpu_seconds": None if o.cpu_seconds is None else round(o.cpu_seconds, 3)}
                        for o in outcomes]}
    if not_done is not None:
        data |= {"interrupted": True, "not_done": not_done}
    text = json.dumps(data, indent=2).encode("utf-8")
    write_atomic(path, lambda f: f.write(text))


def format_table(outcomes: list[Outcome]) -> str:
    """The outcomes as a table: model, nodes before and after, seconds, and the stop reason or error."""
    # File names may hold line breaks and terminal escapes: printed escaped, a row stays a line.
    width = max([len("model")] + [len(one_line(o.source)) for o in outcomes])
    lines = [f"{'model':<{width}}  {'nodes':>13}  {'seconds':>8}  result"]
    for o in outcomes:
        nodes = f"{o.nodes_before} -> {o.nodes_after}" if o.ok else "-"
        result = o.stop_reason if o.ok else f"error: {o.error}"
        lines.append(f"{one_line(o.source):<{width}}  {nodes:>13}  {o.seconds:8.2f}  {one_line(result)}")
    return "\n".join(lines)
