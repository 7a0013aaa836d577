"""Rich progress bars that stay quiet when output is not a terminal (CI, log files), and the stage
the process is at (what an interrupted command says it stopped in)."""

import sys

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

_stage = ["start-up"]


def plain_output() -> bool:
    """Output goes to a file or pipe (a cluster log): one plain line per step instead of a bar."""
    return not sys.stdout.isatty()


def progress(disable: bool = False) -> Progress:
    """A progress bar on a terminal (none when output is plain)."""
    disable = disable or plain_output()
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), transient=False, disable=disable)


def set_stage(text: str) -> None:
    """Where the work is now, e.g. "RL step 12", "SFT step 40", "evaluation l1"."""
    _stage[0] = text


def stage() -> str:
    return _stage[0]
