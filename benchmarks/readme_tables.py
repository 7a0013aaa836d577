"""The README's results tables, written from the result files, never typed.

A table in README.md stands between two markers and is replaced by the text of the file the
first one names (a summary.md that `agentrl compare` or a benchmark wrote):

    <!-- results: benchmarks/results/demo-seeds.md -->
    ...
    <!-- end results -->

    python benchmarks/readme_tables.py            # rewrite the tables
    python benchmarks/readme_tables.py --check    # exit 1 naming each table that is stale
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"(<!-- results: (?P<file>\S+) -->\n)(?P<body>.*?)(<!-- end results -->)", re.DOTALL)


def render(readme: str, root: Path = ROOT) -> tuple[str, list[str]]:
    """The README with every table replaced by its file's text, and the files whose table changed."""
    stale = []

    def fill(match: re.Match) -> str:
        text = (root / match["file"]).read_text()
        if match["body"] != text:
            stale.append(match["file"])
        return match.group(1) + text + match.group(4)

    return BLOCK.sub(fill, readme), stale


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only say which tables are stale")
    parser.add_argument("--readme", type=Path, default=ROOT / "README.md")
    args = parser.parse_args()
    text, stale = render(args.readme.read_text(), args.readme.parent)
    if args.check:
        for name in stale:
            print(f"{args.readme}: the table from {name} is stale (python benchmarks/readme_tables.py)")
        return 1 if stale else 0
    args.readme.write_text(text)
    print(f"{len(stale)} table(s) rewritten" + (f": {', '.join(stale)}" if stale else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
