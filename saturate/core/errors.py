"""Errors every stage raises: one clear line for the user, never a traceback."""


class SaturateError(Exception):
    """A user-facing error. `str(err)` is the whole message the CLI prints."""


class MemoryLimitError(SaturateError):
    """Something would take more memory than the limit in force (--max-memory) allows."""


class SourceError(SaturateError):
    """An error at a position in a source file (rules, text graphs, targets).

    The message reads `file:line:col: message`, then the offending line and a caret.
    """

    def __init__(self, file: str, line: int, col: int, message: str, source_line: str | None = None):
        self.file, self.line, self.col, self.message = file, line, col, message
        self.source_line = source_line
        text = f"{file}:{line}:{col}: {message}"
        if source_line is not None:
            text += "\n    " + source_line.rstrip("\n") + "\n    " + " " * max(col - 1, 0) + "^"
        super().__init__(text)


def one_line(text: str) -> str:
    """`text` on one line: line breaks and other control characters (a model's names may hold
    any) escaped as Python escapes them."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def error_text(err: SaturateError) -> str:
    """What the CLI prints for `err`: one line, or for an error in a source file, that line, the
    source line and a caret under the column."""
    if isinstance(err, SourceError):
        text = f"{one_line(err.file)}:{err.line}:{err.col}: {one_line(err.message)}"
        if err.source_line is not None:
            shown, before = _excerpt(err.source_line.rstrip("\n"), max(err.col - 1, 0))
            text += "\n    " + shown + "\n    " + " " * before + "^"
        return text
    return one_line(str(err))


_EXCERPT_SIDE = 60      # characters of a long source line shown on each side of the caret


def _excerpt(line: str, col: int) -> tuple[str, int]:
    """The part of a source line shown under an error (all of it when short; a window around
    `col`, its cut ends marked "...", when a file's line runs to thousands of characters) and
    how many characters of it precede the caret."""
    start = 0 if col <= _EXCERPT_SIDE else col - _EXCERPT_SIDE
    end = len(line) if len(line) - col <= _EXCERPT_SIDE else col + _EXCERPT_SIDE
    head = "..." if start else ""
    shown = head + one_line(line[start:end]) + ("..." if end < len(line) else "")
    return shown, len(head) + len(one_line(line[start:col]))
