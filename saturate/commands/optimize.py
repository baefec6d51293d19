"""CLI `saturate optimize`: a thin wrapper over saturate.optimize with a JSON report and a trace."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

from saturate.core.errors import SaturateError, one_line
from saturate.core.fileio import check_outputs, model_files, write_atomic, written_together
from saturate.core.mapped import folds_beside
from saturate.lang.fold import check_fold_bytes
from saturate.pipeline import MAX_ITERATIONS, MAX_NODES, TIMEOUT
from saturate.progress import Status, saturation_callback, status
from saturate.summary import format_summary, summarize

NAME = "optimize"
HELP = "fold a model by equality saturation: batch-norm into conv, merged constants, scale propagation"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="+",
                        help="a .onnx file, a text graph (.sat) or example:NAME; several, a directory or a "
                             "glob optimize a batch into the -o directory")
    parser.add_argument("-o", "--output", required=True,
                        help="where to write the result (.onnx or .sat); for a batch, a directory")
    parser.add_argument("--jobs", type=int, default=None, metavar="N",
                        help="batch: models optimized at once, in separate processes (default: all cores)")
    parser.add_argument("--cluster", metavar="ADDRESS",
                        help="batch: run on the Ray cluster at ADDRESS ('local' starts one here; needs "
                             "pip install 'saturate-onnx[cluster]')")
    parser.add_argument("--quiet", action="store_true",
                        help="print nothing but errors (progress shows only on a terminal anyway)")
    parser.add_argument("--rules", nargs="+", action="extend", default=[], metavar="FILE_OR_DIR",
                        help="more .rules files or directories, loaded beside the standard library")
    parser.add_argument("--no-std", action="store_true", help="do not load the standard rules (only --rules)")
    parser.add_argument("--level", type=int, default=3, help="rule level 0-3 (default 3: every rule)")
    parser.add_argument("--only", nargs="+", metavar="NAME",
                        help="run only these rules (a rule above --level is an error, not a skip)")
    parser.add_argument("--target", default="cpu", help="target name or .target file (default cpu)")
    parser.add_argument("--preserve", default="", metavar="OP,...",
                        help="comma-separated op or node names that no rewrite may change")
    # Partitioning (saturate.partition): group the target's composite patterns into functions.
    parser.add_argument("--partition", action="store_true",
                        help="then group each match of the target's composites into an ONNX local function")
    parser.add_argument("--keep-constants", action="store_true",
                        help="with --partition: keep constants inside function bodies, not as arguments")
    parser.add_argument("--keep-data-file", action="store_true",
                        help="the output (an .onnx beside the input) refers to the weights no rule changed in "
                             "the input's external data file instead of copying them: that file must stay")
    parser.add_argument("--fold-initializer-inputs", action="store_true",
                        help="fold initializers that are also graph inputs as constants (by default they "
                             "stay inputs that a caller may override, as the ONNX spec says)")
    parser.add_argument("--check", type=int, default=1, metavar="N",
                        help="run N random inputs through the model and the result in ONNX Runtime and refuse "
                             "a result whose outputs differ by a relative error over 1e-4, or 4 machine epsilons of a "
                             "less precise output type (float16: 3.9e-3) (exit 1; default "
                             "%(default)s; 0: no check)")
    parser.add_argument("--force", action="store_true", help="write the result even when --check finds it differs")
    parser.add_argument("--input-shape", action="append", default=[], metavar="NAME:1,3,224,224",
                        help="static shape for an input whose shape is symbolic, before optimizing (repeatable; "
                             "NAME=1x3x224x224 as compile takes it works too)")
    parser.add_argument("--skip", action="append", default=[], metavar="RULE",
                        help="do not use this rule (repeatable; a name no loaded rule has is an error)")
    parser.add_argument("--report", metavar="R.json", help="write a JSON report")
    parser.add_argument("--html", metavar="R.html",
                        help="write a self-contained HTML page: the graph before and after, e-graph size "
                             "per iteration, the rules that fired, stage times, op counts")
    parser.add_argument("--trace", action="store_true", help="print progress and a table of what happened")
    parser.add_argument("--max-fold-bytes", metavar="SIZE", default=None,
                        help="largest constant fold-any makes of a node whose inputs are constants (4096, "
                             "512K, 16M; default 1M); a result no larger than its inputs always folds")
    parser.add_argument("--max-iterations", type=int, default=MAX_ITERATIONS)
    parser.add_argument("--max-nodes", type=int, default=MAX_NODES,
                        help="e-nodes the e-graph may grow to (default %(default)s)")
    parser.add_argument("--timeout", type=float, default=TIMEOUT,
                        help="seconds for saturation (default %(default)s); extraction has its own budget "
                             "after it, a quarter of this and at least 2 s, and past it writes the best "
                             "graph it has")


def run(args: argparse.Namespace) -> int:
    if args.max_iterations < 0 or args.max_nodes < 1 or not args.timeout > 0:  # `not >`: NaN too
        raise SaturateError("--max-iterations, --max-nodes and --timeout must be positive")
    args.max_fold_bytes = check_fold_bytes(args.max_fold_bytes)
    if is_batch(args.model):
        return run_batch_command(args)
    args.model = args.model[0]
    if args.check < 0:
        raise SaturateError("--check must be 0 (no check) or more random inputs")
    # Every output is checked before the work, so a bad --report never follows a written model.
    inputs = command_inputs([args.model], args.rules, not args.no_std, args.target)
    outputs = [("-o", args.output), ("-o's external data", data_file(args.output)),
               ("--report", args.report), ("--html", args.html)]
    check_outputs(outputs, inputs)
    _check_suffix(args.output)
    # The model, report and page are renamed into place together once all are written; large
    # folded weights are computed beside the output, where its data file can take them over.
    with status(args.quiet or args.trace, "load") as shown, written_together(inputs) as read, \
            folds_beside(args.output, direct=args.check == 0):
        report, functions, failure, sizes = _optimize_one(args, shown, read, outputs)
    if args.trace:
        print(format_report(report), file=sys.stderr)
    if failure is not None:
        kept = "written anyway (--force)" if args.force else "not written (--force writes it)"
        print(f"saturate: error: {one_line(f'{args.model}: {failure}; {args.output} {kept}')}", file=sys.stderr)
        return 1
    if not args.quiet:
        print(summary_line(report, args.output))
        print(format_summary(*sizes))
    if args.partition and not args.quiet:
        print(f"partitioned into {len(functions)} functions" + "".join(f"\n  {f}" for f in functions))
    return 0


def _optimize_one(args: argparse.Namespace, shown: Status, read: list[str], outputs: list):
    """Load, optimize and write one model, naming each stage on the progress line; `read` gets
    every rules file the load read (an include too), checked against the `outputs` at once.
    Returns the report, the partition's functions, a failed check (or None) and the model
    summaries before and after (None with --quiet and no --report: nothing shows them)."""
    from saturate.frontend import load_graph, save_graph
    from saturate.lang.parser import RULES_DIR, load_rules
    from saturate.pipeline import optimize

    times = {}
    t = time.perf_counter()
    graph = load_graph(args.model)
    if args.input_shape:
        from saturate.commands.compile import parse_shapes
        from saturate.simplifier import with_input_shapes

        graph = with_input_shapes(graph, parse_shapes(args.input_shape))
    times["import"] = time.perf_counter() - t
    paths = ([] if args.no_std else [RULES_DIR]) + list(args.rules)
    rules = load_rules(paths, level=args.level, names=args.only)
    if args.skip:
        from saturate.simplifier import without_rules

        rules = without_rules(rules, args.skip)
    read.extend(sorted({r.loc.file for r in rules}))
    check_outputs(outputs, read)
    preserve = [p.strip() for p in args.preserve.split(",") if p.strip()]
    shown.stage("saturate")
    progress = _progress if args.trace else saturation_callback(shown)
    limits = dict(level=args.level, max_iterations=args.max_iterations, max_nodes=args.max_nodes,
                  timeout=args.timeout, progress=progress, fold_initializer_inputs=args.fold_initializer_inputs,
                  max_fold_bytes=args.max_fold_bytes)
    if args.partition:
        # The target's composites join the rules: extraction chooses fused kernels by cost.
        from saturate.partition import optimize_for_target
        result, report = optimize_for_target(graph, args.target, tuple(preserve), partition_graph=True,
                                             keep_constants=args.keep_constants, rules=rules, **limits)
    else:
        result, report = optimize(graph, rules, target=args.target, preserve=preserve, **limits)
    failure = None
    if args.check:
        shown.stage("check")
        t = time.perf_counter()
        failure = _check(args, graph, result)
        report.times["check"] = time.perf_counter() - t
        if failure is not None and not args.force:
            return report, [], failure, None      # nothing is written
    shown.stage("export")
    t = time.perf_counter()
    functions: list[str] = []
    if args.partition:
        from saturate.partition import save_model, summary
        save_model(result, args.output)
        functions = summary(result)
    else:
        try:
            save_graph(result, args.output, keep_data_file=args.keep_data_file)
        except SaturateError:
            _refuse_invalid_input(args.model, graph)
            raise
    times["export"] = time.perf_counter() - t
    report.times = {"import": times["import"], **report.times, "export": times["export"]}
    sizes = None
    if not args.quiet or args.report:
        # A partitioned result's size is that of the model with its functions, as written.
        size = None
        if args.partition:
            from saturate.partition import to_model

            size = to_model(result).ByteSize()
        sizes = summarize(graph), summarize(result, size)
    if args.report:
        data = {**report.to_json(), "summary": {"before": sizes[0].to_json(), "after": sizes[1].to_json()}}
        text = json.dumps(data, indent=2).encode("utf-8")
        write_atomic(args.report, lambda f: f.write(text))
    if args.html:
        from saturate.report.html import write_html
        shown.stage("html")
        write_html(args.html, graph, result, report, title=args.model)
    return report, functions, failure, sizes


def _refuse_invalid_input(model: str, graph) -> None:
    """When the result fails the ONNX checker, ask the input the same: a model that is itself
    invalid (an op given a type its schema refuses) is the input's fault, said so."""
    from saturate.frontend.onnx_io import check_exported, export_model

    check_exported(graph, export_model(graph, weights=False), f"{model}: not a valid ONNX model")


def _check(args: argparse.Namespace, graph, result):
    """The result against the input in ONNX Runtime on --check random inputs: a CheckFailure or
    None; a model ONNX Runtime cannot run (or no ONNX Runtime) is a note, not a failure."""
    from saturate.simplifier import Unchecked, check_outputs

    after_model = None
    if args.partition:
        from saturate.partition import to_model

        after_model = to_model(result).SerializeToString()
    try:
        return check_outputs(graph, result, args.check, after_model=after_model)
    except Unchecked as why:
        if not args.quiet:
            print(f"saturate: note: {one_line(f'{args.model}: not checked: {why}')}", file=sys.stderr)
        return None


def _check_suffix(output: str) -> None:
    """-o must say which form to write: a typo (`.onxx`) would otherwise write the text form."""
    from pathlib import Path

    from saturate.frontend import TEXT_SUFFIXES

    suffix = Path(output).suffix.lower()
    if suffix != ".onnx" and suffix not in TEXT_SUFFIXES:
        raise SaturateError(f"-o {output}: unknown suffix '{Path(output).suffix}': write .onnx, or "
                            f"{' or '.join(TEXT_SUFFIXES)} for the text form")


def data_file(output: str) -> str | None:
    """The file beside an ONNX output its weights go to when they pass protobuf's limit."""
    return f"{output}.data" if output.lower().endswith(".onnx") else None


def command_inputs(models: list[str], rules: list[str], std: bool, target: str | None) -> list[str]:
    """Every file a command reads before it writes: the models (and their external data), the
    rules files (a directory's *.rules, the standard library's with `std`), a target file."""
    from saturate.lang.parser import RULES_DIR, rule_files

    files = [f for m in models for f in model_files(m)]
    files += [str(p) for p in rule_files(([RULES_DIR] if std else []) + list(rules))]
    if target and os.path.isfile(target):
        files.append(target)
    return files


def is_batch(models: list[str]) -> bool:
    """Several models, a directory or a glob make a batch; one model file does not."""
    from pathlib import Path

    return len(models) > 1 or any(Path(m).is_dir() or any(c in m for c in "*?[") for m in models)


def run_batch_command(args: argparse.Namespace) -> int:
    """Optimize every model into the -o directory in parallel; a table, and summary.json there."""
    import os

    from saturate import batch
    from saturate.commands.compile import parse_shapes
    from saturate.lang.parser import RULES_DIR, load_rules
    from saturate.simplifier import without_rules

    for flag in ("report", "html", "partition", "trace"):
        if getattr(args, flag):
            raise SaturateError(f"--{flag} takes one model; a batch writes summary.json in its output directory")
    if args.jobs is not None and args.jobs < 1:
        raise SaturateError("--jobs must be at least 1")
    models = batch.expand_models(args.model)
    if os.path.exists(args.output) and not os.path.isdir(args.output):
        raise SaturateError(f"{args.output}: a batch writes into a directory, and this is a file")
    paths = ([] if args.no_std else [str(RULES_DIR)]) + list(args.rules)
    # A bad rule (or --skip, --input-shape) fails once, here, not per model.
    without_rules(load_rules(paths, level=args.level, names=args.only), args.skip)
    shapes = tuple(parse_shapes(args.input_shape).items())
    if args.check < 0:
        raise SaturateError("--check must be 0 (no check) or more random inputs")
    inputs = command_inputs(models, args.rules, not args.no_std, args.target)
    os.makedirs(args.output, exist_ok=True)
    jobs = batch.plan_jobs(models, args.output)
    summary_path = os.path.join(args.output, "summary.json")
    check_outputs([("the summary", summary_path)]
                  + [(f"the output of {job.source}", path) for job in jobs
                     for path in (job.output, data_file(job.output))], inputs)
    options = batch.Options(tuple(paths), args.level, tuple(args.only) if args.only else None, args.target,
                            tuple(p.strip() for p in args.preserve.split(",") if p.strip()),
                            args.max_iterations, args.max_nodes, args.timeout, args.fold_initializer_inputs,
                            args.check, args.force, shapes,
                            tuple(args.skip), args.max_fold_bytes)
    start = time.perf_counter()
    finished: dict[batch.Job, batch.Outcome] = {}
    with batch.stopped_by_signals():
        try:
            with status(args.quiet, "optimize", total=len(jobs), unit="model") as shown:
                def done(o: batch.Outcome) -> None:
                    finished[batch.Job(o.source, o.output)] = o
                    shown.step(1, o.source if o.ok else f"{o.source} failed")
                outcomes = batch.run_batch(jobs, options, args.jobs, args.cluster, done=done)
        except batch.Stopped as stop:
            return _interrupted(stop.signum, jobs, finished, summary_path, time.perf_counter() - start)
    seconds = time.perf_counter() - start
    batch.write_summary(outcomes, summary_path, seconds)
    failed = [o for o in outcomes if not o.ok]
    if not args.quiet:
        print(batch.format_table(outcomes))
        print(f"{len(outcomes) - len(failed)} of {len(outcomes)} models optimized in {seconds:.1f} s; "
              f"summary in {summary_path}")
    for o in failed:
        print(f"saturate: error: {one_line(f'{o.source}: {o.error}')}", file=sys.stderr)
    return 2 if failed else 0


def _interrupted(signum: int, jobs: list, finished: dict, summary_path: str, seconds: float) -> int:
    """A batch ended by Ctrl-C or SIGTERM (its workers already gone): summary.json for the models
    that finished, one line, and the shell's code for the signal (130, 143)."""
    from saturate import batch

    outcomes = [finished[job] for job in jobs if job in finished]
    batch.write_summary(outcomes, summary_path, seconds, not_done=[job.source for job in jobs if job not in finished])
    word = "interrupted" if signum == signal.SIGINT else "terminated"
    print(f"saturate: {word}: {len(outcomes)} of {len(jobs)} models done; summary in {summary_path}",
          file=sys.stderr)
    return 128 + signum


def summary_line(report, output: str) -> str:
    """One line: where the result went, node counts, op changes, why saturation stopped."""
    data = report.to_json()
    before, after = data["ops_before"], data["ops_after"]
    changed = [f"{op} {before.get(op, 0)}->{after.get(op, 0)}"
               for op in sorted(set(before) | set(after)) if before.get(op, 0) != after.get(op, 0)]
    stop = f"{data['stop_reason']} after {data['iterations']} iterations"
    if report.run.hit_limit:
        stop += f", best graph found so far ({_peak(report)})"
    if report.extract_cut:
        stop += f"; {report.extract_cut}"
    return (f"wrote {output}: {sum(before.values())} -> {sum(after.values())} nodes"
            f" ({', '.join(changed) or 'no change'}); {stop}; {sum(data['times'].values()):.2f} s")


def _peak(report) -> str:
    """The largest e-graph saturation built and the memory the process peaked at."""
    return f"peak {report.run.peak_nodes} e-nodes, {report.run.peak_rss / 2**20:.0f} MiB"


def _progress(iteration: int, size: int, seconds: float, matches: dict[str, int]) -> None:
    fired = ", ".join(f"{k} {v}" for k, v in sorted(matches.items())) or "-"
    print(f"  iteration {iteration:3d}  e-nodes {size:8d}  {seconds:7.2f} s  matches: {fired}",
          file=sys.stderr, flush=True)


def format_report(report) -> str:
    """The report as a readable table."""
    data = report.to_json()
    lines = [f"stopped: {data['stop_reason']} after {data['iterations']} iterations"
             + (" (best graph found so far)" if report.run.hit_limit else ""),
             _peak(report) + "".join(f"; {m['rule']} ({m['at']}) held back by the {m['limit']}"
                                     for m in data["held_back"]),
             "e-graph size per iteration: " + " ".join(str(s) for s in data["egraph_sizes"]),
             "time per stage: " + "  ".join(f"{k} {v:.3f} s" for k, v in data["times"].items()),
             f"cost: {report.cost_before:.0f} -> {report.cost_after:.0f}"
             + ("  (no cheaper graph: original kept)" if report.kept_original and not report.extract_cut
                else f"  ({report.extract_cut})" if report.extract_cut else ""),
             "ops:"]
    ops = sorted(set(data["ops_before"]) | set(data["ops_after"]))
    for op in ops:
        lines.append(f"  {op:<20} {data['ops_before'].get(op, 0):6d} -> {data['ops_after'].get(op, 0):6d}")
    lines.append("rule matches:")
    fired = [m for m in data["matches"] if m["matches"]]
    width = max((len(m["rule"]) for m in fired), default=0)
    for m in fired:
        lines.append(f"  {m['rule']:<{width}}  {m['matches']:6d}  {m['at']}")
    if not fired:
        lines.append("  (no rule matched)")
    # Each line escaped: a rules file's path (an include names it) may hold a terminal escape.
    return "\n".join(one_line(line) for line in lines)
