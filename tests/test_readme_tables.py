"""The README's results tables are the result files' text: none is typed, none is stale."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from readme_tables import BLOCK, render  # noqa: E402


def test_every_results_table_in_the_readme_is_current():
    readme = (ROOT / "README.md").read_text()
    assert len(BLOCK.findall(readme)) >= 2  # the estimators, GCD
    _, stale = render(readme)
    assert stale == [], f"stale tables: {stale} (run python benchmarks/readme_tables.py)"


def test_a_changed_result_file_makes_its_table_stale(tmp_path):
    (tmp_path / "r.md").write_text("| a |\n|---|\n| 1 |\n")
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- results: r.md -->\n| a |\n|---|\n| 1 |\n<!-- end results -->\nafter\n")
    check = [sys.executable, str(ROOT / "benchmarks" / "readme_tables.py"), "--readme", str(readme), "--check"]
    assert subprocess.run(check).returncode == 0
    (tmp_path / "r.md").write_text("| a |\n|---|\n| 2 |\n")
    done = subprocess.run(check, capture_output=True, text=True)
    assert done.returncode == 1 and "r.md is stale" in done.stdout
    subprocess.run(check[:-1], check=True)  # rewrite
    assert readme.read_text() == "intro\n<!-- results: r.md -->\n| a |\n|---|\n| 2 |\n<!-- end results -->\nafter\n"
