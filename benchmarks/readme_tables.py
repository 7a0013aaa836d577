"""The results tables of the README and the documentation pages, written from the result files, never typed.

A table in README.md or a page under docs/ stands between two markers and is replaced by what the first one names: the
text of a Markdown file (a summary.md that `agentrl compare` or a benchmark wrote), or a table of a
benchmark's CSV rows (`columns=` picks and orders the columns, each `where=column=value` keeps the
matching rows), or of a JSON file's entries (`rows=KEY`: one row per top-level entry holding a KEY
object, whose fields are the columns):

    <!-- results: benchmarks/results/demo-seeds.md -->
    ...
    <!-- end results -->
    <!-- results: benchmarks/results/sampler.csv columns=hidden,layers,hf_tok_s where=device=cpu -->

    python benchmarks/readme_tables.py            # rewrite the tables
    python benchmarks/readme_tables.py --check    # exit 1 naming each table that is stale
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"(<!-- results: (?P<file>\S+)(?P<options>(?: \S+)*) -->\n)"
                   r"(?P<body>.*?)(?P<end><!-- end results -->)", re.DOTALL)


def markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = [header, ["---"] * len(header), *rows]
    return "".join("| " + " | ".join(line) + " |\n" for line in lines)


def csv_table(path: Path, columns: list[str], where: list[tuple[str, str]]) -> str:
    with path.open(newline="") as f:
        rows = [row for row in csv.DictReader(f) if all(row[k] == v for k, v in where)]
    columns = columns or list(rows[0])
    return markdown(columns, [[row[c] for c in columns] for row in rows])


def json_table(path: Path, key: str) -> str:
    data = json.loads(path.read_text())
    entries = {name: value[key] for name, value in data.items() if isinstance(value, dict) and key in value}
    columns = list(next(iter(entries.values())))
    return markdown(["", *columns], [[name, *(_cell(row[c]) for c in columns)] for name, row in entries.items()])


def _cell(value) -> str:
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def table(path: Path, options: str) -> str:
    """The text a marker with these options stands for."""
    settings = [option.split("=", 1) for option in options.split()]
    if path.suffix == ".csv":
        columns = next((v.split(",") for k, v in settings if k == "columns"), [])
        return csv_table(path, columns, [tuple(v.split("=", 1)) for k, v in settings if k == "where"])
    if path.suffix == ".json":
        return json_table(path, dict(settings)["rows"])
    return path.read_text()


def render(readme: str, root: Path = ROOT) -> tuple[str, list[str]]:
    """The README with every table replaced by its file's text, and the files whose table changed."""
    stale = []

    def fill(match: re.Match) -> str:
        text = table(root / match["file"], match["options"])
        if match["body"] != text:
            stale.append(match["file"])
        return match.group(1) + text + match["end"]

    return BLOCK.sub(fill, readme), stale


def pages(root: Path = ROOT) -> list[Path]:
    """The Markdown pages that may hold tables: the README and the documentation site's pages."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only say which tables are stale")
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository (result paths are relative to it)")
    args = parser.parse_args()
    stale_anywhere = 0
    for page in pages(args.root):
        if not page.is_file():
            continue
        text, stale = render(page.read_text(), args.root)
        stale_anywhere += len(stale)
        if args.check:
            for name in stale:
                print(f"{page}: the table from {name} is stale (python benchmarks/readme_tables.py)")
        elif stale:
            page.write_text(text)
            print(f"{page}: {len(stale)} table(s) rewritten: {', '.join(stale)}")
    return 1 if args.check and stale_anywhere else 0


if __name__ == "__main__":
    sys.exit(main())
