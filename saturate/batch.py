"""Batch stage: optimize many models in parallel processes or on a Ray cluster; one failure never
stops the others, and every model's result, time and error land in one summary."""

from __future__ import annotations

import fnmatch
import glob
import json
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable

from saturate.core.errors import SaturateError
from saturate.core.fileio import write_atomic

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

        graph = load_graph(job.source)
        rules = load_rules(list(options.rule_paths), level=options.level, names=options.only)
        result, report = optimize(graph, rules, level=options.level, target=options.target,
                                  max_iterations=options.max_iterations, max_nodes=options.max_nodes,
                                  timeout=options.timeout, preserve=options.preserve,
                                  fold_initializer_inputs=options.fold_initializer_inputs)
        save_graph(result, job.output)
        return Outcome(job.source, job.output, True, time.perf_counter() - start, len(graph.nodes),
                       len(result.nodes), report.run.stop_reason, cpu_seconds=time.process_time() - cpu)
    except KeyboardInterrupt:
        raise
    except BaseException as err:  # one model's failure (even an engine panic) must not stop the batch
        text = str(err).splitlines()[0] if str(err) else type(err).__name__
        if not isinstance(err, SaturateError):
            text = f"{type(err).__name__}: {text}"
        return Outcome(job.source, job.output, False, time.perf_counter() - start, error=text,
                       cpu_seconds=time.process_time() - cpu)


def run_batch(jobs: list[Job], options: Options, workers: int | None = None, cluster: str | None = None,
              done: Callable[[Outcome], None] | None = None) -> list[Outcome]:
    """Run every job, `workers` processes at a time (default: all cores) or as Ray tasks on the
    cluster at `cluster` ("local" starts one on this machine); outcomes in job order."""
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
    # Fresh interpreters, not forks: a fork would copy whatever threads the parent has started.
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                             initializer=_import_stages) as pool:
        futures = {pool.submit(optimize_job, jobs[k], options): k for k in largest_first(jobs)}
        for future in as_completed(futures):
            k = futures[future]
            try:
                outcomes[k] = future.result()
            except Exception as err:  # the worker process itself died (out of memory, a signal)
                outcomes[k] = Outcome(jobs[k].source, jobs[k].output, False, 0.0,
                                      error=f"worker process failed: {err}")
            if done:
                done(outcomes[k])
    return [outcomes[k] for k in range(len(jobs))]


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
        raise SaturateError("--cluster needs Ray: pip install 'saturate[cluster]'") from None
    try:
        ray.init(address=None if cluster == "local" else cluster, ignore_reinit_error=True,
                 log_to_driver=False, include_dashboard=False)
    except Exception as err:
        raise SaturateError(f"cannot reach the Ray cluster at '{cluster}': {str(err).splitlines()[0]}") from None
    remote = ray.remote(optimize_job)
    pending = {remote.remote(jobs[k], options): k for k in largest_first(jobs)}
    outcomes: dict[int, Outcome] = {}
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
    return [outcomes[k] for k in range(len(jobs))]


def write_summary(outcomes: list[Outcome], path: str | os.PathLike, seconds: float) -> None:
    """summary.json: every model's outcome, and the batch's totals."""
    data = {"models": len(outcomes), "failed": sum(not o.ok for o in outcomes), "seconds": round(seconds, 3),
            "results": [asdict(o) | {"seconds": round(o.seconds, 3),
                                     "cpu_seconds": None if o.cpu_seconds is None else round(o.cpu_seconds, 3)}
                        for o in outcomes]}
    text = json.dumps(data, indent=2).encode("utf-8")
    write_atomic(path, lambda f: f.write(text))


def format_table(outcomes: list[Outcome]) -> str:
    """The outcomes as a table: model, nodes before and after, seconds, and the stop reason or error."""
    width = max([len("model")] + [len(o.source) for o in outcomes])
    lines = [f"{'model':<{width}}  {'nodes':>13}  {'seconds':>8}  result"]
    for o in outcomes:
        nodes = f"{o.nodes_before} -> {o.nodes_after}" if o.ok else "-"
        result = o.stop_reason if o.ok else f"error: {o.error}"
        lines.append(f"{o.source:<{width}}  {nodes:>13}  {o.seconds:8.2f}  {result}")
    return "\n".join(lines)
