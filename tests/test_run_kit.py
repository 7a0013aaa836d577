"""benchmarks/run_kit.py: a stopped run carried to another machine continues where it stopped."""

import io
import json
import shutil
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from run_kit import pack, unpack  # noqa: E402

from agentrl.pipeline import run_pipeline  # noqa: E402
from agentrl.recipe import load_config  # noqa: E402

OVERRIDES = ["run_dir=runs/demo/seed0", "model.path=runs/demo/seed0/init", "sft.episodes=12", "sft.epochs=1",
             "sft.save_every=2", "rl.steps=0", "eval.episodes=2", "eval.splits=[l0]", "eval.initial=false",
             "init.corpus_episodes=10"]


def times(folder: Path) -> dict[str, int]:
    return {p.relative_to(folder).as_posix(): p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}


def test_an_unpacked_run_reuses_every_phase_and_a_checkpoint_in_the_making_is_left_out(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    config = load_config(ROOT / "recipes" / "demo.yaml", OVERRIDES)
    run_pipeline(config)
    runs = Path("runs")
    unfinished = [runs / "demo" / "seed0" / "sft" / ".tmp-step_000004" / "model.safetensors",
                  runs / "demo" / "expert.jsonl.tmp"]
    for path in unfinished:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("half written")
    kept = {rel: ns for rel, ns in times(runs).items() if not rel.endswith(".tmp") and ".tmp-" not in rel}
    manifest = pack(runs, tmp_path / "kit.tar.xz", exclude=[])
    assert set(manifest["files"]) == set(kept)

    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # another machine: the same checkout, no runs
    unpack(tmp_path / "kit.tar.xz")
    assert times(runs) == kept
    capsys.readouterr()
    run_pipeline(config)
    said = capsys.readouterr().out
    assert "phase eval sft: done earlier" in said and "running" not in said

    with pytest.raises(SystemExit, match="exists and is not empty"):
        unpack(tmp_path / "kit.tar.xz")
    (runs / "demo" / "stray").write_text("")
    unpack(tmp_path / "kit.tar.xz", force=True)
    assert not (runs / "demo" / "stray").exists()


def test_excluded_files_stay_out_and_a_kit_whose_file_was_altered_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for rel in ("a.json", "seed0/model/w.safetensors", "seed1/model/w.safetensors"):
        (tmp_path / "runs" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "runs" / rel).write_text(rel)
    manifest = pack(Path("runs"), tmp_path / "kit.tar.xz", exclude=["seed0/*"])
    assert set(manifest["files"]) == {"a.json", "seed1/model/w.safetensors"}
    manifest["files"]["a.json"]["sha256"] = "0" * 64
    with tarfile.open(tmp_path / "kit.tar.xz", "w:xz") as tar:
        data = json.dumps(manifest).encode()
        info = tarfile.TarInfo("kit.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        tar.add("runs/a.json")
    shutil.rmtree(tmp_path / "runs")
    with pytest.raises(SystemExit, match="does not match"):
        unpack(tmp_path / "kit.tar.xz")
    with pytest.raises(SystemExit, match="inside the current directory"):
        pack(tmp_path / "runs", tmp_path / "other.tar.xz", exclude=[])
