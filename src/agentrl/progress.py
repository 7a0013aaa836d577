"""Rich progress bars that stay quiet when output is not a terminal (CI, log files), and the stage
the process is at (what an interrupted command says it stopped in)."""

import sys
from contextlib import contextmanager
from typing import Callable, Iterator

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

_stage = ["start-up"]


def plain_output() -> bool:
    """Output goes to a file or pipe (a cluster log): one plain line per step instead of a bar."""
    return not sys.stdout.isatty()


def progress(disable: bool = False) -> Progress:
    """A progress bar on a terminal (none when output is plain). Bars nest (rich >= 14.1): an
    evaluation inside RL draws its own under RL's."""
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    transient=False, disable=disable or plain_output())


@contextmanager
def task(description: str, total: int) -> Iterator[Callable[[int], None]]:
    """A bar for one piece of work of `total` units; yields advance(n)."""
    with progress() as bar:
        line = bar.add_task(description, total=total)
        yield lambda n=1: bar.advance(line, n)


def set_stage(text: str) -> None:
    """Where the work is now, e.g. "RL step 12", "SFT step 40", "evaluation l1"."""
    _stage[0] = text


def stage() -> str:
    return _stage[0]
