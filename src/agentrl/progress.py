"""Rich progress bars that stay quiet when output is not a terminal (CI, log files)."""

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


def progress(disable: bool = False) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), transient=False, disable=disable)
