"""Command line: a thin dispatcher over the modules in saturate.commands."""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import pkgutil
import signal
import sys

import saturate.commands
from saturate.core import limits
from saturate.core.errors import SaturateError, error_text


def command_names() -> list[str]:
    """Every subcommand, by module name (the module's NAME matches it)."""
    folders = list(saturate.commands.__path__)
    if all(os.path.isdir(f) for f in folders):
        # What pkgutil.iter_modules finds in a folder of .py files, without the `inspect` module it
        # imports to find it (a tenth of `saturate --version`).
        return sorted({n[:-3] for f in folders for n in os.listdir(f)
                       if n.endswith(".py") and n[:-3].isidentifier() and n != "__init__.py"})
    return sorted(m.name for m in pkgutil.iter_modules(folders))


class _Version(argparse.Action):
    """--version: the installation's metadata is read only when asked for (reading it takes
    longer than the rest of starting a command)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        from saturate.core.extras import version

        print(f"saturate {version()}")
        parser.exit()


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """One subcommand per module in saturate/commands (each has NAME, HELP, configure, run).

    With `only`, just that command's module is imported: each module pulls in its own stage
    (egglog, onnx, scipy), and a run should pay for the one it uses, not for all of them.
    """
    parser = argparse.ArgumentParser(prog="saturate", description="Graph folding by equality saturation.")
    parser.add_argument("--version", action=_Version, help="show the version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in command_names():
        if only is not None and name != only:
            continue
        mod = importlib.import_module(f"saturate.commands.{name}")
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=mod.HELP)
        mod.configure(p)
        p.add_argument("--max-memory", metavar="SIZE", default=None,
                       help="refuse any one tensor, weight or workspace larger than SIZE (512M, 4G; "
                            "default: half the machine's memory)")
        p.set_defaults(_run=mod.run)
    return parser


class Terminated(BaseException):
    """SIGTERM, raised where the process is so that `finally` blocks remove temp files."""


def _terminate(signum, frame) -> None:
    raise Terminated()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # `saturate --version` needs no command's module (each pulls in numpy at least).
    chosen = argv[0] if argv and argv[0] in command_names() else "" if argv[:1] == ["--version"] else None
    args = build_parser(chosen).parse_args(argv)
    if _collector["held"]:
        # What the start made lives to the exit: frozen, no collection walks it again.
        _collector["held"] = False
        gc.freeze()
        gc.enable()
    try:
        limits.set_max_memory(args.max_memory)
        return int(args._run(args) or 0)
    except SaturateError as err:
        print(f"saturate: error: {error_text(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("saturate: interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print("saturate: terminated", file=sys.stderr)
        return 143
    except RecursionError:
        print("saturate: error: input nested too deeply to process", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # `saturate rules | head` closed our stdout: not an error; silence the flush at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except BaseException as err:  # egglog's Rust panics are BaseExceptions, not Exceptions
        if isinstance(err, (KeyboardInterrupt, SystemExit)):
            raise
        if type(err).__name__ == "PanicException":
            print(f"saturate: error: the e-graph engine failed: {str(err).splitlines()[0]}", file=sys.stderr)
            return 2
        raise


# The command's process holds the cyclic collector while it starts (main lets it go once the
# command's module is imported and the arguments parsed): the imports make over a hundred thousand
# objects that live to the exit, and a collection every 700 new ones walked them again and again
# (1.5% of the instructions of optimizing a small model) to free nothing.
_collector = {"held": False}


def entry() -> None:
    signal.signal(signal.SIGTERM, _terminate)
    if gc.isenabled():
        gc.disable()
        _collector["held"] = True
    try:
        code = main()
    except KeyboardInterrupt:  # during start-up or argument parsing
        print("saturate: interrupted", file=sys.stderr)
        code = 130
    # The process ends here. Python's shutdown runs full collections that walk every object the
    # run made or imported (onnx, numpy and the engine leave hundreds of thousands), which took
    # longer than optimizing a small model; frozen, they are left to the exit. atexit handlers
    # still run, streams are flushed, and what the run opened it closed itself.
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    entry()
