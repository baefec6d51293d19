"""Progress on a terminal: bars and status lines for the commands, over tqdm.

Library code never prints progress; it takes a callback (pipeline.optimize's `progress`,
check_rules' `progress`, batch.run_batch's `done`) and the commands pass one of these.
Everything goes to stderr, only when stderr is a terminal and --quiet was not given, and only
once a run has lasted DELAY seconds, so a short run or a piped one prints nothing extra.
"""

from __future__ import annotations

import argparse
import sys
import threading
from contextlib import contextmanager
from typing import Iterator

from saturate.core.errors import one_line

DELAY = 1.0     # seconds before anything shows: runs shorter than this stay silent
TICK = 0.5      # seconds between redraws while one long step (a C compile, a big model) runs


def add_quiet_flag(parser: argparse.ArgumentParser, help: str = "no progress display") -> None:
    """The same --quiet for every command that can show progress."""
    parser.add_argument("--quiet", action="store_true", help=help)


def shown(quiet: bool) -> bool:
    """Progress shows on a terminal only: not when stderr is piped or redirected, not with --quiet."""
    if quiet:
        return False
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # a replaced or closed stderr
        return False


def _size() -> tuple[int, int]:
    """The terminal's columns and rows; a terminal that reports none (a pty nobody sized) counts
    as 80 by 24, since tqdm would otherwise cut every line to nothing or draw no line at all."""
    import os

    try:
        size = os.get_terminal_size(sys.stderr.fileno())
        columns, rows = size.columns, size.lines
    except (AttributeError, ValueError, OSError):
        columns = rows = 0
    return columns or 80, rows or 24


class Status:
    """One progress line on stderr: a bar when the number of steps is known, a counter otherwise,
    with a description that names the current stage and details after it (e-graph size, last model).

    A ticker thread redraws it every TICK seconds so the elapsed time keeps moving while one step
    takes long; tqdm itself only redraws when a step is counted."""

    def __init__(self, quiet: bool, desc: str = "", total: int | None = None, unit: str = "it") -> None:
        self.enabled = shown(quiet)
        self.bar = None
        self._drawn = False
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        if self.enabled:
            # tqdm (and the multiprocessing lock it makes) only where a bar can show.
            from tqdm import tqdm

            bar_format = None if total is not None else "{desc}{postfix} [{elapsed}]"
            columns, rows = _size()
            self.bar = tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, delay=DELAY,
                            bar_format=bar_format, leave=False, ncols=columns, nrows=rows)
            self._ticker = threading.Thread(target=self._tick, name="saturate-progress", daemon=True)
            self._ticker.start()

    def _tick(self) -> None:
        while not self._stop.wait(TICK):
            self._redraw()

    def _redraw(self) -> None:
        # tqdm's delay holds back only the redraws it decides on; before DELAY nothing may show.
        if self.bar.format_dict["elapsed"] >= DELAY:
            self.bar.refresh()
            self._drawn = True

    def stage(self, desc: str) -> None:
        """Name what runs now (the description before the bar); the last step's detail goes."""
        if self.enabled:
            self.bar.set_description_str(desc, refresh=False)
            self.bar.set_postfix_str("", refresh=False)
            self._redraw()

    def step(self, n: int = 1, detail: str | None = None) -> None:
        """Count n steps done, and say what the last one was."""
        if not self.enabled:
            return
        if detail is not None:
            self.bar.set_postfix_str(one_line(detail), refresh=False)
        # tqdm's own update skips draws within its minimum interval, so a fast step (the first
        # iteration, the last model) would never show: draw every step once DELAY has passed.
        self.bar.update(n)
        self._redraw()

    def write(self, line: str, file=None) -> None:
        """Print a line of the command's own output without tearing the progress line."""
        if self.enabled and self.bar.format_dict["elapsed"] >= DELAY:
            # tqdm redraws the bar under the line, whatever its delay: it must be erased on close.
            self.bar.write(line, file=file or sys.stdout)
            self._drawn = True
        else:
            print(line, file=file or sys.stdout, flush=True)

    def close(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        if self.bar is None:
            return
        if self._drawn:
            # tqdm erases its line on close only if it drew it itself, not after refresh() alone.
            self.bar.clear()
        self.bar.close()


@contextmanager
def status(quiet: bool, desc: str = "", total: int | None = None, unit: str = "it") -> Iterator[Status]:
    """A Status that is closed (its line erased) however the block ends."""
    s = Status(quiet, desc, total, unit)
    try:
        yield s
    finally:
        s.close()


def saturation_callback(s: Status):
    """A pipeline.optimize `progress` callback that shows the iteration and the e-graph's size."""
    def progress(iteration: int, size: int, seconds: float, matches: dict[str, int]) -> None:
        s.step(1, f"iteration {iteration}, e-graph {size:,} nodes")
    return progress
