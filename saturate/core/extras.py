"""The distribution's name and its optional parts: a command whose extra is not installed says which one.

The import name and the command are `saturate`; the distribution is DISTRIBUTION, since the name
`saturate` on the package index is an unrelated project.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from saturate.core.errors import SaturateError

DISTRIBUTION = "saturate-onnx"


def install_hint(extra: str) -> str:
    """The pip command that installs `extra`."""
    return f"pip install '{DISTRIBUTION}[{extra}]'"


def version() -> str:
    """This installation's version, from its metadata (pyproject.toml is the one place it is written)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version(DISTRIBUTION)
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


class MissingExtra(SaturateError, ImportError):
    """An optional part used without its extra installed: one line for the command line (a
    SaturateError), an ImportError to Python code that imports it (`import saturate.check`)."""


def need(module: str, extra: str, what: str, package: str | None = None) -> ModuleType:
    """Import `module`, which `extra` installs; without it, MissingExtra, one line: `what` needs
    `package`, and how to install it. A module that is there but fails to import raises as it does."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name is None or err.name.split(".")[0] != module.split(".")[0]:
            raise
        raise MissingExtra(f"{what} needs {package or module}: {install_hint(extra)}", name=module) from None
