"""Writing outputs so that a kill at any moment leaves the old file or the whole new one."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomic(path: str | Path, text: str) -> None:
    """Write `text` beside `path` under a temporary name, then rename it into place."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
