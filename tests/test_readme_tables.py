"""The README's results tables are the result files' text: none is typed, none is stale."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from readme_tables import BLOCK, pages, render  # noqa: E402


def test_every_results_table_in_the_readme_and_the_docs_is_current():
    texts = [page.read_text() for page in pages()]
    assert sum(len(BLOCK.findall(text)) for text in texts) >= 10  # demo seeds, estimators, GCD, benchmarks, testbed
    stale = [name for text in texts for name in render(text)[1]]
    assert stale == [], f"stale tables: {stale} (run python benchmarks/readme_tables.py)"


def test_a_changed_result_file_makes_its_table_stale(tmp_path):
    (tmp_path / "r.md").write_text("| a |\n|---|\n| 1 |\n")
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- results: r.md -->\n| a |\n|---|\n| 1 |\n<!-- end results -->\nafter\n")
    check = [sys.executable, str(ROOT / "benchmarks" / "readme_tables.py"), "--root", str(tmp_path), "--check"]
    assert subprocess.run(check).returncode == 0
    (tmp_path / "r.md").write_text("| a |\n|---|\n| 2 |\n")
    done = subprocess.run(check, capture_output=True, text=True)
    assert done.returncode == 1 and "r.md is stale" in done.stdout
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("<!-- results: r.md -->\n| a |\n|---|\n| 1 |\n<!-- end results -->\n")
    done = subprocess.run(check, capture_output=True, text=True)
    assert done.returncode == 1 and "page.md: the table from r.md is stale" in done.stdout  # the docs' pages too
    subprocess.run(check[:-1], check=True)  # rewrite
    assert readme.read_text() == "intro\n<!-- results: r.md -->\n| a |\n|---|\n| 2 |\n<!-- end results -->\nafter\n"


def test_the_testbed_report_is_written_from_its_result_files(tmp_path):
    from testbed_table import table

    results = ROOT / "benchmarks" / "results"
    if (results / "testbed.md").exists():
        assert (results / "testbed.md").read_text() == table(results), "run python benchmarks/testbed_table.py"
    # every difference is read as method - GRPO, whichever way round the comparison wrote the pair
    row = {"difference": 0.1, "ci95": [0.05, 0.2], "per_seed": [0.05, 0.15], "mdd": 0.08}
    base = {"mean": 0.4, "ci95": [0.3, 0.5], "per_seed": [0.3, 0.5]}
    summary = {"splits": ["l0"], "methods": {"grpo": {"l0": base}, "gigpo": {"l0": base}},
               "pairs": {"grpo - gigpo": {"l0": row, "seeds": [1, 2]}}}
    (tmp_path / "testbed-x.json").write_text(json.dumps(summary))
    coldstart = {"set": "env.delay=4", "sft": {"l0": {"success": 0.35}}}
    (tmp_path / "testbed-x-coldstart.json").write_text(json.dumps(coldstart))
    line = table(tmp_path).splitlines()[2]
    assert "| x | `env.delay=4` | L0 | 35 | 40.0 [30.0, 50.0] | gigpo - grpo: -10.0 [-20.0, -5.0]* t [-73.5, +53.5] (8) | 2 |" == line
    # the t-interval from the per-seed differences, oriented too: -0.1 +- t_.975,1 x 0.0707 / sqrt(2)
    summary["methods"]["gigpo"]["l0"] = {**base, "judge_accuracy": 0.625}
    (tmp_path / "testbed-x.json").write_text(json.dumps(summary))
    assert "(8)<br>judge accuracy (%, chance 50): gigpo 62 |" in table(tmp_path)


def test_csv_and_json_tables_pick_columns_and_rows(tmp_path):
    (tmp_path / "r.csv").write_text("device,n,ms\ncpu,1,2.5\ngpu,1,0.1\ncpu,2,5.0\n")
    entries = {"model": "m", "a": {"pairs": {"nn": 0.912, "pp": 0.5}}, "b": {"pairs": {"nn": 1, "pp": 0.25}}}
    (tmp_path / "r.json").write_text(json.dumps(entries))
    readme = ("<!-- results: r.csv columns=n,ms where=device=cpu -->\n<!-- end results -->\n"
              "<!-- results: r.json rows=pairs -->\n<!-- end results -->\n")
    text, stale = render(readme, tmp_path)
    assert stale == ["r.csv", "r.json"]
    assert text == ("<!-- results: r.csv columns=n,ms where=device=cpu -->\n"
                    "| n | ms |\n| --- | --- |\n| 1 | 2.5 |\n| 2 | 5.0 |\n<!-- end results -->\n"
                    "<!-- results: r.json rows=pairs -->\n"
                    "|  | nn | pp |\n| --- | --- | --- |\n| a | 0.91 | 0.50 |\n| b | 1 | 0.25 |\n"
                    "<!-- end results -->\n")


def test_result_rows_are_appended_and_a_failed_write_leaves_the_file_whole(tmp_path):
    from results_csv import append_rows

    path = tmp_path / "r.csv"
    append_rows(path, [{"a": 1}])
    append_rows(path, [{"a": 2, "b": "x"}])  # a new column: old rows get it empty
    assert path.read_text().splitlines() == ["a,b", "1,", "2,x"]

    class Unprintable:
        def __str__(self):
            raise RuntimeError("crash mid-write")

    with pytest.raises(RuntimeError):
        append_rows(path, [{"a": 3}, {"a": Unprintable()}])
    assert path.read_text().splitlines() == ["a,b", "1,", "2,x"]


def test_the_smollm2_gpu_table_is_its_committed_trajectories(tmp_path):
    """The GPU run stopped during L1's evaluation: its L0 row comes from the trajectories written."""
    import csv
    import lzma

    from smollm2_table import rows

    folder = tmp_path / "seed0" / "eval" / "sft"
    folder.mkdir(parents=True)
    packed = ROOT / "benchmarks" / "results" / "alfworld-smollm2-gpu-sft-l0.jsonl.xz"
    (folder / "trajectories_l0.jsonl").write_bytes(lzma.decompress(packed.read_bytes()))
    found = rows(tmp_path)
    assert found == [{"seed": "0", "phase": "sft", "l0": "41 / 50 = 82.0% [69.2, 90.2]", "l1": "not evaluated"}]
    with (ROOT / "benchmarks" / "results" / "alfworld-smollm2-gpu.csv").open() as f:
        assert list(csv.DictReader(f)) == found


def test_the_smollm2_table_keeps_the_rows_of_phases_not_evaluated_again():
    """A run without its zero-shot evaluation (`eval.initial: false`) replaces the seed's SFT row and
    adds its RL row; the zero-shot row stays, and another seed's rows are left as they were."""
    from smollm2_table import merged

    def row(seed, phase, l0):
        return {"seed": seed, "phase": phase, "l0": l0, "l1": "x"}

    kept = [row("0", "zero-shot", "a"), row("0", "sft", "old"), row("1", "sft", "b")]
    found = [row("0", "sft", "new"), row("0", "rl", "c")]
    assert merged(kept, found) == [row("0", "zero-shot", "a"), row("0", "sft", "new"), row("0", "rl", "c"),
                                   row("1", "sft", "b")]
