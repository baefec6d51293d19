"""Errors every stage raises: one clear line for the user, never a traceback."""


class SaturateError(Exception):
    """A user-facing error. `str(err)` is the whole message the CLI prints."""


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
