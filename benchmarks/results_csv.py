"""What every benchmark script shares: the commit it measured, and appending rows to its CSV."""

from __future__ import annotations

import csv
import subprocess
from pathlib import Path


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""


def append_rows(path: str | Path, rows: list[dict]) -> None:
    """Append `rows` to the CSV at `path`, writing the header when the file is new."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists()
    with path.open("a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        if new:
            writer.writeheader()
        writer.writerows(rows)
