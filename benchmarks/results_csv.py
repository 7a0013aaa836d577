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
    """Append `rows` to the CSV at `path`, writing the header when the file is new; a row with
    columns the file lacks rewrites it with the union of columns (old rows get them empty)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    old_rows, fields = [], list(rows[0])
    if path.exists():
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            old_rows = list(reader)
            fields = list(reader.fieldnames or []) + [k for k in rows[0] if k not in (reader.fieldnames or [])]
    partial = path.with_name(path.name + ".partial")  # a crash mid-write leaves the old file whole
    with partial.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, restval="")
        writer.writeheader()
        writer.writerows(old_rows + rows)
    partial.replace(path)
