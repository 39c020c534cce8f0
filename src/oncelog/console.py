"""The console the CLIs print their tables on."""

from __future__ import annotations

from rich.console import Console

#: Columns of a table written to a file or a pipe: wide enough for the bench's and the demo's.
FILE_WIDTH = 220


def output_console() -> Console:
    """A rich Console on stdout: the terminal's width on a terminal; FILE_WIDTH columns into a file
    or a pipe (a log, CI), where rich's default of 80 cut every figure of a wide table to an
    ellipsis."""
    console = Console()
    return console if console.is_terminal else Console(width=FILE_WIDTH)
