import json
import re
import shutil
import signal
import time
from pathlib import Path

import pytest
import yaml
from conftest import COMPACT

from agentrl.cli import main
from agentrl.provenance import Phases


CONTINUABLE = {"rl": ("rl.steps", "rl.eval_every", "rl.save_every", "rl.keep_last", "rl.env_pool",
                      "rl.max_aborted_share", "rl.max_skipped_updates", "rl.check_logprobs_every",
                      "rl.save_rollouts", "rl.log_samples"),
               "sft": ("sft.save_every",), "eval": ("eval.max_aborted_share", "eval.initial")}
"""Settings that change nothing a phase's steps did (named here, so that one more is a decision,
not a slip): a run stopped or finished continues with another value of these."""


def recipe(tmp_path, **extra):
    data = {
        "seed": 1, "run_dir": str(tmp_path / "run"), "model": {"path": str(tmp_path / "run" / "init")},
        "init": {"layers": 1, "intermediate_size": 128, "corpus_episodes": 20},
        "env": {"type": "household", "max_steps": 10},
        "prompt": {"template": COMPACT, "history_length": 1},
        "sampling": {"max_new_tokens": 8},
        "sft": {"episodes": 3, "epochs": 1, "batch_size": 8},
        "rl": {"steps": 1, "tasks_per_step": 2, "group_size": 2},
        "eval": {"episodes": 2},
        **extra,
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_run_pipeline_end_to_end_and_rerun_skips_done_phases(tmp_path, capsys):
    path = recipe(tmp_path)
    assert main(["run", str(path)]) == 0
    run = tmp_path / "run"
    summary = json.loads((run / "summary.json").read_text())
    assert list(summary["phases"]) == ["initial", "sft", "rl"]
    for phase in summary["phases"].values():
        assert set(phase) == {"l0", "l1", "l2"}
        assert all(0 <= r["success"] <= 1 and r["episodes"] == 2 for r in phase.values())
    assert (run / "config.yaml").exists() and (run / "sft" / "model" / "config.json").exists()
    assert (run / "rl" / "checkpoints").is_dir() and (run / "eval" / "sft" / "trajectories_l1.jsonl").exists()
    # every evaluation's record holds every setting of the seed, env, prompt and eval sections but
    # the guards (a changed prompt redoes each evaluation), by construction
    from agentrl.pipeline import EVAL_GUARDS
    from agentrl.provenance import flatten
    from agentrl.recipe import load_config
    leaves = flatten(load_config(path).model_dump(mode="json"))
    deciding = {"seed"} | {k for k in leaves if k.startswith(("env.", "prompt.", "eval."))
                           and not any(k == g or k.startswith(g + ".") for g in EVAL_GUARDS)}
    records = json.loads((run / "phases.json").read_text())
    for phase in ("eval initial", "eval sft", "eval rl"):
        assert deciding <= set(records[phase]), (phase, deciding - set(records[phase]))
    out = capsys.readouterr().out
    assert "Success rate" in out
    assert re.search(r"SFT step (\d+)/\1  epoch 1  loss", out) and "RL step 1/1  success" in out  # a log's lines

    # TensorBoard: the post-SFT evaluation is step 0 of the eval curves; success per task type.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(run / "rl" / "logs" / "tb"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    l0 = [(e.step, e.value) for e in events.Scalars("eval/l0/success")]
    assert l0 == [(0, pytest.approx(summary["phases"]["sft"]["l0"]["success"])),
                  (1, pytest.approx(summary["phases"]["rl"]["l0"]["success"]))]
    assert {f"eval/l1/success/{kind}" for kind in summary["phases"]["rl"]["l1"]["per_task_type"]} <= tags
    assert any(tag.startswith("rollout/success/") for tag in tags)
    assert {"rollout/logprob_diff_mean", "rollout/kl_sampler_actor", "actor/skipped_updates",
            "throughput/gen_tokens_per_s", "throughput/update_tokens_per_s", "timing_s/gen", "timing_s/update"} <= tags
    assert all(events.Scalars(tag)[0].value > 0 for tag in tags if tag.startswith("throughput/"))
    texts = {tag: events.Tensors(tag) for tag in events.Tags()["tensors"]}
    samples = texts["samples/text_summary"][0].tensor_proto.string_val[0].decode()
    assert texts["samples/text_summary"][0].step == 1 and "turn" in samples and "advantage" in samples
    config_text = texts["config/text_summary"][0].tensor_proto.string_val[0].decode()
    assert "tasks_per_step: 2" in config_text
    sft_events = EventAccumulator(str(run / "sft" / "logs" / "tb"))
    sft_events.Reload()
    assert "config/text_summary" in sft_events.Tags()["tensors"] and "sft/loss" in sft_events.Tags()["scalars"]
    phases = EventAccumulator(str(run / "logs" / "tb"))
    phases.Reload()
    expected = {"init", "eval initial", "expert data", "sft", "eval sft", "rl"}
    assert {tag for tag in phases.Tags()["scalars"] if tag.startswith("phase_s/")} == {f"phase_s/{name}" for name in expected}
    l1 = [(e.step, e.value) for e in phases.Scalars("phase_eval/l1/success")]  # initial, post-SFT, post-RL
    assert l1 == [(i, pytest.approx(summary["phases"][p]["l1"]["success"])) for i, p in enumerate(("initial", "sft", "rl"))]
    assert set(summary["seconds"]) == expected and all(v > 0 for v in summary["seconds"].values())

    # The step's training trajectories, every episode, in evaluation's record format.
    from agentrl.rollout.records import read_trajectories
    saved = read_trajectories(run / "rl" / "rollouts" / "step_000001.jsonl.gz")
    assert len(saved) == 4 and {t.group_id for t in saved} == {0, 1}
    assert all(s.prompt and s.advantage is not None for t in saved for s in t.steps)

    # agentrl plot: every figure, a real PNG.
    assert main(["plot", str(run)]) == 0
    figures = {p.name: p.read_bytes() for p in (run / "plots").iterdir()}
    assert set(figures) == {f"{name}.png" for name in ("eval_success", "rollout", "kl_entropy", "sampler_gap",
                                                       "step_time", "sft_loss", "overview")}
    assert all(data.startswith(b"\x89PNG") and len(data) > 5000 for data in figures.values())
    assert main(["plot", str(run / "rl"), "--out", str(tmp_path / "rl-plots")]) == 0  # the rl/ folder itself
    assert figures["rollout.png"] == (tmp_path / "rl-plots" / "rollout.png").read_bytes()
    assert not (tmp_path / "rl-plots" / "sft_loss.png").exists()
    assert main(["plot", str(tmp_path)]) == 2 and "no RL metrics" in capsys.readouterr().err

    # What decides each phase's reuse, by construction: every setting of its sections, less the few
    # that change nothing its steps did (named here, so that one more is a decision, not a slip).
    from agentrl.provenance import flatten
    from agentrl.recipe import load_config
    record = json.loads((run / "phases.json").read_text())
    leaves = set(flatten(load_config(path).model_dump(mode="json")))
    for phase, section in (("rl", "rl"), ("sft", "sft"), ("eval sft", "eval"), ("eval rl", "eval")):
        deciding = {k for k in leaves if k.startswith(section + ".")
                    and not any(k == c or k.startswith(c + ".") for c in CONTINUABLE[section])}
        assert deciding and deciding <= set(record[phase]), (phase, deciding - set(record[phase]))
        continuable = {k for k in leaves if any(k == c or k.startswith(c + ".") for c in CONTINUABLE[section])}
        assert not continuable & set(record[phase]), (phase, continuable & set(record[phase]))
    # ... and what each builds on: the seed, the starting model's dtype and the fingerprint of the
    # model it starts from (replaced in place, it is another model), the environment and the prompt;
    # an RL evaluation is of the model after rl.steps.
    world = {k for k in leaves if k.startswith(("env.", "prompt."))}
    for phase in ("eval initial", "sft", "eval sft", "rl", "eval rl"):
        assert {"seed", "model.dtype", "model.fingerprint"} <= set(record[phase]), phase
    for phase in ("eval initial", "eval sft", "rl", "eval rl"):
        assert world <= set(record[phase]), (phase, world - set(record[phase]))
    assert record["eval rl"]["rl.steps"] == 1
    # The expert data: what the expert plays in (the environment and the prompt, less what changes
    # only the reward) and every sft setting its play and its judgment examples read.
    reward_only = {"prompt.invalid_penalty"}
    assert world - reward_only <= set(record["expert data"]), world - reward_only - set(record["expert data"])
    assert {"seed", "sft.episodes", "sft.judgments", "sft.detours", "sft.keep_failed"} <= set(record["expert data"])

    # Recorded before a setting existed (rl.mini_batch_order, at its old behaviour): every phase is
    # kept, the RL phase's checkpoints too (a stricter comparison there once deleted them).
    for settings in record.values():
        settings.pop("rl.mini_batch_order", None)
    (run / "phases.json").write_text(json.dumps(record))
    stamp = (run / "sft" / "model" / "model.safetensors").stat().st_mtime
    assert main(["run", str(path)]) == 0
    assert (run / "rl" / "checkpoints" / "step_000001").is_dir()
    assert (run / "sft" / "model" / "model.safetensors").stat().st_mtime == stamp
    assert json.loads((run / "summary.json").read_text())["seconds"] == summary["seconds"]  # nothing ran again

    # Raising rl.steps continues RL: its time adds to what its checkpoint says the runs before took
    # (set here to 1000 s), the other phases keep theirs, and the final model is a plain HF folder.
    state = run / "rl" / "checkpoints" / "step_000001" / "trainer_state.json"
    state.write_text(json.dumps({**json.loads(state.read_text()), "seconds": 1000.0}))
    started = time.perf_counter()
    assert main(["run", str(path), "--set", "rl.steps=2"]) == 0
    seconds = json.loads((run / "summary.json").read_text())["seconds"]
    assert 1000 < seconds["rl"] < 1000 + time.perf_counter() - started
    assert {k: v for k, v in seconds.items() if k != "rl"} == {k: v for k, v in summary["seconds"].items() if k != "rl"}
    assert json.loads((run / "logs" / "phase_seconds.json").read_text()) == seconds
    assert (run / "rl" / "model" / "model.safetensors").is_file() and not (run / "rl" / "model.tmp").exists()

    checkpoint = run / "rl" / "checkpoints" / "step_000001"  # a checkpoint folder, not its model/
    assert main(["eval", str(path), "--checkpoint", str(checkpoint), "--out", str(tmp_path / "ev")]) == 0
    out = capsys.readouterr().out
    assert "Success rate" in out and "L0" in out and "results.json" in out
    counts = json.loads((tmp_path / "ev" / "results.json").read_text())["l1"]["per_task_type_counts"]
    assert sum(c["episodes"] for c in counts.values()) == 2
    for kind, c in counts.items():  # the table's row: successes / episodes per split
        assert re.search(rf"{kind}\s.*{c['success']}/{c['episodes']}", out), out

    # The exported model carries the prompt it was trained with; a recipe with another is warned about.
    assert main(["export", str(checkpoint), "--out", str(tmp_path / "exported")]) == 0
    carried = json.loads((tmp_path / "exported" / "agentrl_prompt.json").read_text())
    assert carried["template"] == COMPACT and carried["history_length"] == 1
    assert json.loads((run / "sft" / "model" / "agentrl_prompt.json").read_text()) == carried
    other = recipe(tmp_path, prompt={"template": "Do: {task}\n{history}\n{observation}\n{actions}",
                                     "history_length": 1}, eval={"episodes": 1, "splits": ["l0"]})
    capsys.readouterr()
    assert main(["eval", str(other), "--checkpoint", str(tmp_path / "exported"), "--out", str(tmp_path / "ev2")]) == 0
    assert "trained with other prompt settings (prompt.template)" in capsys.readouterr().out


def test_eval_command_and_bad_recipe(tmp_path, capsys, tiny_model_dir):
    path = recipe(tmp_path, eval={"episodes": 3, "splits": ["l2"]})
    assert main(["eval", str(path), "--checkpoint", str(tiny_model_dir), "--out", str(tmp_path / "ev")]) == 0
    results = json.loads((tmp_path / "ev" / "results.json").read_text())
    assert list(results) == ["l2"] and results["l2"]["episodes"] == 3
    assert len((tmp_path / "ev" / "trajectories_l2.jsonl").read_text().splitlines()) == 3

    bad = tmp_path / "bad.yaml"
    bad.write_text("rl:\n  advantage:\n    type: gigpoo\n")
    assert main(["train", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "rl.advantage" in err and "grpo" in err and "Traceback" not in err


def test_full_history_with_a_template_that_rewrites_replies_exits_2(tmp_path, capsys, tiny_model_dir):
    """The model is the user's input too: full history with a chat template that drops an earlier
    reply's reasoning stops before any episode, with one line naming the model and the setting."""
    from test_full_history import REWRITING

    from agentrl.models import load_tokenizer
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    tokenizer = load_tokenizer(str(model))
    tokenizer.chat_template = REWRITING["drops all reasoning"]
    tokenizer.save_pretrained(model)
    path = recipe(tmp_path, prompt={"template": COMPACT, "history_length": 0, "full_history": True})
    assert main(["train", str(path), "--model", str(model)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{model}: prompt.full_history: its chat template") and err.count("\n") == 1


def test_a_cpu_run_prints_no_library_warnings(tmp_path):
    """DeepSpeed (imported by transformers wherever it is installed) warns that it found no GPU,
    and HF prints a bar per file written: neither belongs in the log of a run that uses neither."""
    import subprocess
    import sys

    path = recipe(tmp_path)
    done = subprocess.run([sys.executable, "-m", "agentrl.cli", "model", "init", str(path)], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    pytest.importorskip("deepspeed")  # the warning's source
    output = done.stdout + done.stderr
    assert "WARNING" not in output and "Setting accelerator" not in output and "shards" not in output, output


def test_on_a_terminal_every_phase_shows_a_progress_bar(tmp_path):
    """Run under a pseudo-terminal: init, expert data, SFT, RL and each evaluation draw bars (an
    evaluation inside RL: a bar inside RL's)."""
    import os
    import pty
    import subprocess
    import sys

    path = recipe(tmp_path, rl={"steps": 2, "tasks_per_step": 2, "group_size": 2, "eval_every": 1})
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "agentrl.cli", "run", str(path)], stdin=subprocess.DEVNULL,
                            stdout=follower, stderr=follower, env={**os.environ, "COLUMNS": "200"})
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:  # the terminal closed: the process is gone
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    screen = b"".join(chunks).decode(errors="replace")
    assert proc.wait(timeout=600) == 0, screen[-3000:]
    for line in ("init: tokenizer corpus", "expert data", "SFT", "evaluation l0", "evaluation l2", "RL success"):
        assert line in screen, line
    assert "RL step 1/2" not in screen  # the plain per-step lines are for files, not terminals


def wandb_history(run_file) -> list[dict]:
    """The logged rows of an offline W&B run file (`run-<id>.wandb`: a LevelDB-style log of
    protobuf records in 32 KiB blocks after a 7-byte header)."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data, pos, pending, rows = run_file.read_bytes(), 7, b"", []
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7]) if left >= 7 else (0, 0, 0)
        if left < 7 or (length == 0 and kind == 0):  # block trailer / padding
            pos += left
            continue
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a whole record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            if record.WhichOneof("record_type") == "history":
                rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                             for item in record.history.item})
    return rows


def test_metrics_also_go_to_weights_and_biases_offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    path = recipe(tmp_path, tracking=["tensorboard", "wandb"], rl={"steps": 2, "tasks_per_step": 2, "group_size": 2})
    assert main(["run", str(path)]) == 0
    run = tmp_path / "run"
    runs = list((run / "rl" / "logs" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1
    rows = wandb_history(runs[0])
    from agentrl.tracking import read_metrics
    logged = read_metrics(run / "rl" / "logs" / "metrics.jsonl")
    by_step = {}
    for row in rows:
        by_step.setdefault(row["_step"], {}).update(row)
    assert sorted(by_step) == [0, 1, 2]
    for line in logged:  # the same numbers as metrics.jsonl, step by step
        assert all(by_step[line["step"]][k] == pytest.approx(v) for k, v in line.items() if k != "step")
    assert by_step[1]["samples/_type"] == "html-file" and by_step[0]["config/_type"] == "html-file"
    assert (run / "rl" / "logs" / "tb").is_dir()  # TensorBoard as well
    assert list((run / "sft" / "logs" / "wandb").glob("offline-run-*/run-*.wandb"))

    bad = recipe(tmp_path, tracking=["mlflow"])
    assert main(["run", str(bad)]) == 2


def test_a_resumed_phase_continues_its_weights_and_biases_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from agentrl.recipe import validate_config
    from agentrl.tracking import Tracker

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    config = validate_config({"run_dir": str(tmp_path / "run"), "tracking": ["wandb"]})
    logs = tmp_path / "run" / "rl" / "logs"

    def start(resume_step, steps):
        tracker = Tracker(logs, resume_step, config, "rl")
        for step in steps:
            tracker.log(step, {"x": float(step)})
        tracker.close()
        return tracker.wandb.id

    first = start(0, [1, 2])
    time.sleep(1.1)  # W&B names an offline run's folder by the second it started: two, not one
    assert start(2, [3, 4]) == first  # resumed: the same run continued
    files = sorted((logs / "wandb").glob(f"offline-run-*-{first}/run-{first}.wandb"))
    assert len(files) == 2
    # W&B's service process can still be writing the last records after `finish` returns (seen once
    # in a loaded CI run: steps 3 and 4 missing): give it a few seconds before calling them lost.
    deadline = time.monotonic() + 30
    while (steps := [r["_step"] for f in files for r in wandb_history(f)]) != [0, 1, 2, 3, 4] \
            and time.monotonic() < deadline:
        time.sleep(0.5)
    assert steps == [0, 1, 2, 3, 4]  # 0: the config
    assert start(0, [1]) != first  # started over: a new run


def test_make_targets_run_a_recipes_phases(tmp_path):
    """make sft and RL on 2 ranks (torchrun), then eval of the checkpoint and the memory plan, with overrides."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    path = recipe(tmp_path)

    def make(*args):
        # This interpreter's environment, as installed (no reinstall from a test).
        done = subprocess.run(["make", "-s", "-C", str(root), *args, f"RECIPE={path}", f"VENV={sys.prefix}", "STAMP="],
                              capture_output=True, text=True, timeout=600)
        return done.returncode, done.stdout + done.stderr

    rc, out = make("sft", "NPROC=2", "SET=sft.epochs=2 eval.episodes=1 sft.actor.backend=fsdp2")
    run = tmp_path / "run"
    assert rc == 0, out[-3000:]
    assert json.loads((run / "phases.json").read_text())["sft"]["sft.actor.backend"] == "fsdp2"
    assert (run / "sft" / "model" / "config.json").is_file() and not (run / "rl").exists()
    assert json.loads((run / "summary.json").read_text())["phases"]["sft"]["l0"]["episodes"] == 1
    rc, out = make("rl", "NPROC=2", f"MODEL={run / 'sft' / 'model'}", "SET=rl.steps=1 rl.actor.backend=fsdp2")
    assert rc == 0, out[-3000:]
    checkpoint = run / "rl" / "checkpoints" / "step_000001"
    assert (checkpoint / "model" / "config.json").is_file()
    rc, out = make("eval", f"CHECKPOINT={checkpoint}", f"OUT={tmp_path / 'ev'}")
    assert rc == 0 and (tmp_path / "ev" / "results.json").is_file(), out[-3000:]
    rc, out = make("eval")
    assert rc == 2 and "make eval: give CHECKPOINT=" in out
    rc, out = make("plan", "GPUS=2", "GPU_MEMORY=16", "SET=rl.actor.backend=fsdp2")
    assert rc == 0 and "2 GPU(s) of 16 GiB" in out and "rl (fsdp2)" in out, out[-3000:]


def test_data_from_a_recipe_without_sft_or_rl_sections(tmp_path, capsys):
    """`agentrl data` needs only the environment and the prompt: a recipe with neither an `sft` nor
    an `rl` section collects the expert's episodes (it failed with a traceback)."""
    path = tmp_path / "env-only.yaml"
    path.write_text(yaml.safe_dump({"run_dir": str(tmp_path / "run"), "env": {"type": "household", "max_steps": 10},
                                    "prompt": {"template": COMPACT, "history_length": 1}}))
    out = tmp_path / "data" / "expert.jsonl"  # its folder is made
    assert main(["data", str(path), "--out", str(out), "--episodes", "3"]) == 0
    stats = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows and len({r["task_id"] for r in rows}) == 3 and stats["episodes"] == 3
    # Made once: the same settings reuse it (a setting it does not depend on changed, too); a
    # setting it depends on remakes it.
    made = out.stat().st_mtime_ns
    for unrelated in ("eval.episodes=7", "prompt.invalid_penalty=0.5"):  # (the penalty: a reward, not a text)
        assert main(["data", str(path), "--out", str(out), "--episodes", "3", "--set", unrelated]) == 0
        assert "done earlier with the same settings, reused" in capsys.readouterr().err and out.stat().st_mtime_ns == made
    assert main(["data", str(path), "--out", str(out), "--episodes", "3", "--set", "env.max_steps=12"]) == 0
    assert "settings changed (env.max_steps: 10 -> 12), redoing" in capsys.readouterr().err
    assert out.stat().st_mtime_ns != made
    # Every other input of the data remakes it too, one change at a time (each kept for the next).
    args = ["--episodes", "3", "--set", "env.max_steps=12"]
    for change, key in ((["--episodes", "4"], "episodes: 3 -> 4"), (["--split", "l0"], "split: train -> l0"),
                        (["--set", "seed=5"], "seed: 0 -> 5"),
                        (["--set", "prompt.history_length=2"], "prompt.history_length: 1 -> 2"),
                        (["--set", "sft.detours=0.2"], "sft.detours: 0.0 -> 0.2"),
                        (["--set", "sft.keep_failed=true"], "sft.keep_failed: False -> True"),
                        (["--judgments", "2"], "judgments: 0 -> 2")):
        args += change
        assert main(["data", str(path), "--out", str(out), *args]) == 0
        assert f"settings changed ({key}), redoing" in capsys.readouterr().err
    made = [json.loads(line)["task_id"] for line in out.read_text().splitlines()]
    assert len(set(made) - {"judgment"}) == 4 and made.count("judgment") == 2  # the last --episodes and --judgments
    # --judgments 0 over a recipe that asks for some: none.
    assert main(["data", str(path), "--out", str(out), *args, "--set", "sft.judgments=2", "--judgments", "0"]) == 0
    assert "settings changed (judgments: 2 -> 0), redoing" in capsys.readouterr().err
    assert "judgment" not in [json.loads(line)["task_id"] for line in out.read_text().splitlines()]


def test_a_model_folder_rewritten_in_place_is_another_model(tmp_path):
    """A model's fingerprint (what decides whether results made from it are reused) changes when a
    file is rewritten with other bytes of the same size, as a retrained model's weights are."""
    import os

    from agentrl.provenance import folder_fingerprint

    model = tmp_path / "model"
    model.mkdir()
    weights = model / "model.safetensors"
    weights.write_bytes(b"a" * 64)
    os.utime(weights, ns=(1_000_000_000, 1_000_000_000))
    first = folder_fingerprint(model)
    assert folder_fingerprint(model) == first and folder_fingerprint(tmp_path / "absent") is None
    weights.write_bytes(b"b" * 64)
    os.utime(weights, ns=(2_000_000_000, 2_000_000_000))  # written a second later
    assert folder_fingerprint(model) != first
    (model / "extra.json").write_text("{}")
    assert len({first, folder_fingerprint(model)}) == 2
    nested = model / "checkpoint" / "optimizer.pt"  # a file in a subfolder (a peft adapter, a checkpoint)
    nested.parent.mkdir()
    nested.write_bytes(b"c")
    with_nested = folder_fingerprint(model)
    nested.write_bytes(b"cc")
    assert len({first, with_nested, folder_fingerprint(model)}) == 3


def test_a_phase_is_reused_only_with_its_output_and_a_redo_forgets_its_old_record(tmp_path):
    """Same settings without the output: the phase runs. A phase being redone (its settings changed)
    loses its record at once, so a redo stopped half-way is not reused by a rerun with the old
    settings: its output folder then holds the unfinished redo, not what the record describes."""
    Phases(tmp_path, print).complete("sft", {"sft.lr": 1e-3})
    assert not Phases(tmp_path, print).reusable("sft", {"sft.lr": 1e-3}, False)
    Phases(tmp_path, print).complete("sft", {"sft.lr": 1e-3})
    assert Phases(tmp_path, print).reusable("sft", {"sft.lr": 1e-3}, True)
    assert not Phases(tmp_path, print).reusable("sft", {"sft.lr": 5e-4}, True)  # the redo starts, then stops
    assert "sft" not in Phases(tmp_path, print).done
    assert not Phases(tmp_path, print).reusable("sft", {"sft.lr": 1e-3}, True)


def test_each_reuse_decision_says_why_in_one_line(tmp_path):
    """Reused, running (no record, or no output), or redone naming the first four changes and how
    many more: what a user reads to know whether a phase's result is the one they asked for."""
    said = []
    settings = {f"sft.k{i}": i for i in range(6)}
    assert not Phases(tmp_path, said.append).reusable("sft", settings, True)
    Phases(tmp_path, said.append).complete("sft", settings)
    assert Phases(tmp_path, said.append).reusable("sft", settings, True)
    assert not Phases(tmp_path, said.append).reusable("sft", settings, False)
    Phases(tmp_path, said.append).complete("sft", settings)
    assert not Phases(tmp_path, said.append).reusable("sft", {k: v + 1 for k, v in settings.items()}, True)
    assert said == ["sft: running", "sft: done earlier with the same settings, reused", "sft: running",
                    "sft: settings changed (sft.k0: 0 -> 1; sft.k1: 1 -> 2; sft.k2: 2 -> 3; sft.k3: 3 -> 4; "
                    "and 2 more), redoing"]


def test_a_setting_the_record_has_and_the_settings_now_lack_is_a_change(tmp_path):
    """A plugin dropped from `imports` leaves its `plugin <spec>` in the record and not in the
    settings now: the phase is redone, naming it (only a setting no phase depends on any more,
    `UNRECORDED_SINCE`, is let go: test_a_setting_added_since_at_its_old_behaviour_keeps_a_phase)."""
    said = []
    Phases(tmp_path, said.append).complete("rl", {"rl.steps": 3, "plugin my_env.py": "0123456789abcdef"})
    assert not Phases(tmp_path, said.append).reusable("rl", {"rl.steps": 3}, True)
    assert said[-1] == "rl: settings changed (plugin my_env.py: 0123456789abcdef -> (unset)), redoing"


def test_a_setting_added_since_at_its_old_behaviour_keeps_a_phase(tmp_path):
    """A phase recorded before a setting existed is reused while the new setting does what runs
    did before it (None, or its `OLD_BEHAVIOUR` value; ALFWorld's init redid itself, naming no
    change, when `init.corpus` was added), and redone, naming it, once it is set otherwise."""
    said = []
    Phases(tmp_path, said.append).complete("init", {"init.d_model": 64})
    phases = Phases(tmp_path, said.append)
    assert phases.reusable("init", {"init.d_model": 64, "init.corpus": None}, True)
    assert not phases.reusable("init", {"init.d_model": 64, "init.corpus": "data.jsonl"}, True)
    assert said[-1] == "init: settings changed (init.corpus: (unset) -> data.jsonl), redoing"
    phases.complete("rl", {"rl.steps": 3})  # recorded before rl.mini_batch_order existed
    assert phases.reusable("rl", {"rl.steps": 3, "rl.mini_batch_order": "shuffled"}, True)
    assert not phases.reusable("rl", {"rl.steps": 3, "rl.mini_batch_order": "grouped"}, True)
    phases.complete("sample", {"rl.sampler.share_prefill": False})  # recorded under its earlier name
    assert phases.reusable("sample", {"rl.sampler.share_prefixes": False}, True)
    assert not phases.reusable("sample", {"rl.sampler.share_prefixes": True}, True)
    phases.complete("data", {"env.max_steps": 30})  # recorded before ScienceWorld had a notebook or teleports
    assert phases.reusable("data", {"env.max_steps": 30, "env.memory": False, "env.expert_teleports": False}, True)
    assert not phases.reusable("data", {"env.max_steps": 30, "env.memory": True, "env.expert_teleports": False}, True)
    # DAgger's rounds record env and prompt again under `dagger.`: each added setting is kept there too.
    added = {"env.memory": False, "env.expert_teleports": False, "env.reject_unparsed": False,
             "env.failure_penalty": True, "env.expert_median_s": 0.0, "prompt.full_history": False}
    phases.complete("labels 1", {"dagger.env.max_steps": 30})
    assert phases.reusable("labels 1", {"dagger.env.max_steps": 30, **{f"dagger.{k}": v for k, v in added.items()}}, True)
    assert not phases.reusable("labels 1", {"dagger.env.max_steps": 30, "dagger.env.memory": True}, True)
    phases.complete("data", {"env.max_steps": 30, "prompt.invalid_penalty": 0.1})  # before it was reward-only
    assert phases.reusable("data", {"env.max_steps": 30}, True)  # the expert data no longer depends on it
    phases.complete("rl", {"prompt.invalid_penalty": 0.1})
    assert not phases.reusable("rl", {"prompt.invalid_penalty": 0.5}, True)  # RL still does
    assert said[-1] == "rl: settings changed (prompt.invalid_penalty: 0.1 -> 0.5), redoing"


def test_a_phase_recorded_before_nthr_and_the_coupling_lab_became_components_is_kept(tmp_path):
    """Settings recorded with `rl.nthr` and the lab's `rl.coupling_*` (the saved configs of that
    time) match the same config read now, where they are `rl.components`, while the lab was off;
    with the lab on, the component it became is a change and the phase is redone."""
    from agentrl.provenance import config_settings, flatten
    from agentrl.recipe import load_config

    saved = Path(__file__).parent / "data" / "saved-configs" / "demo.yaml"
    before = yaml.safe_load(saved.read_text())
    phases = Phases(tmp_path, print)
    phases.complete("rl", {k: v for k, v in flatten(before).items() if k.startswith("rl.")})
    assert phases.reusable("rl", config_settings(load_config(saved), "rl"), True)
    before["rl"]["coupling_every"] = 2
    phases.complete("rl", {k: v for k, v in flatten(before).items() if k.startswith("rl.")})
    lab_on = tmp_path / "lab-on.yaml"
    lab_on.write_text(yaml.safe_dump(before))
    now = config_settings(load_config(lab_on), "rl")
    assert now["rl.components"] == [{"type": "coupling", "every": 2, "pairs": 8, "lr": 0.001}]
    assert not phases.reusable("rl", now, True)


def test_a_sections_settings_are_its_own_keys_not_every_key_sharing_its_name():
    """`rl.loss` is the loss's section, not `rl.loss_agg`; `init.corpus` a value, not also
    `init.corpus_episodes`: a phase's settings are whole sections, excluded the same way."""
    from agentrl.provenance import config_settings, flatten
    from agentrl.recipe import load_config

    config = load_config("recipes/testbed.yaml")
    flat = flatten(config.model_dump(mode="json"))
    assert {"rl.loss_agg", "init.corpus_episodes"} <= set(flat)
    loss = config_settings(config, "rl.loss")
    assert loss and set(loss) == {k for k in flat if k.startswith("rl.loss.")}
    assert set(config_settings(config, "init.corpus")) == {"init.corpus"}
    assert "rl.loss_agg" in config_settings(config, "rl", exclude=("rl.loss",))

def test_the_initial_evaluation_can_be_skipped_and_added_later(tmp_path, capsys):
    path = recipe(tmp_path, eval={"episodes": 2, "initial": False})
    assert main(["run", str(path)]) == 0
    run = tmp_path / "run"
    assert list(json.loads((run / "summary.json").read_text())["phases"]) == ["sft", "rl"]
    assert not (run / "eval" / "initial").exists()
    capsys.readouterr()
    assert main(["run", str(path), "--set", "eval.initial=true"]) == 0  # adds it; nothing else is redone
    out = capsys.readouterr().out
    for phase in ("sft", "eval sft", "eval rl"):
        assert f"phase {phase}: done earlier with the same settings, reused" in out, out
    assert list(json.loads((run / "summary.json").read_text())["phases"]) == ["initial", "sft", "rl"]


def test_a_tokenizer_corpus_rewritten_remakes_the_tiny_model(tmp_path, capsys):
    """`init.corpus` names a file: the tiny model (its tokenizer learnt from that text) is reused
    while the file is unchanged and remade once it is rewritten, under the same name."""
    import os

    corpus = tmp_path / "corpus.jsonl"

    def write(word, stamp):
        corpus.write_text(json.dumps({"messages": [{"role": "user", "content": f"{word} " * 40},
                                                   {"role": "assistant", "content": "<action>look</action>"}]}) + "\n")
        os.utime(corpus, ns=(stamp, stamp))

    path = recipe(tmp_path, init={"layers": 1, "intermediate_size": 128, "vocab_size": 300, "corpus": str(corpus)},
                  sft=None, rl=None, eval={"episodes": 1, "splits": ["l0"], "initial": False})
    write("zorblat", 1_000_000_000)
    assert main(["run", str(path)]) == 0
    capsys.readouterr()
    assert main(["run", str(path)]) == 0
    assert "init: done earlier with the same settings, reused" in capsys.readouterr().out
    write("quaxeni", 2_000_000_000)  # as long, written later
    assert main(["run", str(path)]) == 0
    out = capsys.readouterr().out
    assert "init: settings changed (init.corpus.fingerprint" in out


def test_what_an_rl_run_depends_on_outside_the_pipeline(tmp_path):
    """`agentrl train` and `agentrl compare` decide an RL run's reuse by `rl_settings` alone (the
    starting model aside): every setting of the seed, the model's dtype, the environment, the
    prompt, the sampling and the rl section, less the continuable ones."""
    from agentrl.pipeline import rl_settings
    from agentrl.provenance import flatten
    from agentrl.recipe import load_config

    config = load_config(recipe(tmp_path))
    leaves = set(flatten(config.model_dump(mode="json")))
    deciding = {"seed", "model.dtype"} | {k for k in leaves if k.startswith(("env.", "prompt.", "sampling.", "rl."))
                                          and not any(k == c or k.startswith(c + ".") for c in CONTINUABLE["rl"])}
    assert set(rl_settings(config)) == deciding, set(rl_settings(config)) ^ deciding  # a continuable one neither


def test_what_sft_on_given_data_depends_on(tmp_path, tiny_model_dir):
    """SFT on a given `sft.data` is redone when the file is rewritten under its name (its size and
    time are part of the settings), and, with DAgger's rounds (they play in the environment with
    the prompt), when any environment or prompt setting changes: every one is part of SFT's
    settings, with the seed and the sft section less the continuable settings."""
    import os

    from agentrl.pipeline import SFT_CONTINUABLE, _until_sft
    from agentrl.provenance import flatten
    from agentrl.recipe import load_config

    data = tmp_path / "data.jsonl"
    path = recipe(tmp_path, init=None, model={"path": str(tiny_model_dir)}, eval={"episodes": 2, "initial": False},
                  sft={"data": str(data), "epochs": 1, "dagger": {"rounds": 1, "episodes": 2}})
    config = load_config(path)

    def settings(stamp: int) -> dict:
        data.write_text('{"messages": []}\n')
        os.utime(data, ns=(stamp, stamp))
        return _until_sft(config, restart=False)["sft_settings"]

    first, rewritten = settings(1_000_000_000), settings(2_000_000_000)
    assert {k for k in first if first[k] != rewritten[k]} == {"sft.data.fingerprint"}
    leaves = flatten(config.model_dump(mode="json"))
    deciding = {"seed"} | {k for k in leaves if k.startswith("sft.") and k not in SFT_CONTINUABLE} | \
        {f"dagger.{k}" for k in leaves if k.startswith(("env.", "prompt."))}
    assert deciding <= set(first), deciding - set(first)
    assert not set(SFT_CONTINUABLE) & set(first)


def test_a_model_command_warns_of_bf16_on_a_cpu_that_computes_it_slowly(tmp_path, capsys):
    """bf16 on a CPU without AVX-512 / AMX: a LoRA SFT step of SmolLM2 took 13x float32's time (AVX2). The
    warning comes before the command's own checks (here: no model.path, exit 2); not for float32,
    nor for a command that computes with no model. (On a CPU with bf16 instructions no command
    warns: test_models checks the rule itself.)"""
    import torch

    from agentrl.models import cpu_bf16
    slow = not torch.cuda.is_available() and not cpu_bf16()
    for command, dtype, expected in (("sft", "bfloat16", slow), ("sft", "float32", False), ("plan", "bfloat16", False)):
        path = recipe(tmp_path, model={"dtype": dtype})
        sft = ["--data", "x", "--out", str(tmp_path / "out")] if command == "sft" else []
        code = main([command, str(path), *sft])
        assert code == 2 or command != "sft"
        err = capsys.readouterr().err
        assert ("warning: model.dtype bfloat16: this CPU has no bfloat16 instructions" in err) == expected, (command, dtype)


def test_a_command_called_from_python_gives_its_caller_sigterm_back(tmp_path):
    """`main` turns SIGTERM into the orderly stop only while its command runs: a program that calls
    it (a notebook, a sweep script) has its own handler back afterwards, however the command ended."""
    def mine(signum, frame):
        pass

    old = signal.signal(signal.SIGTERM, mine)
    try:
        assert main(["train", str(tmp_path / "missing.yaml")]) == 2
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, old)


def test_serve_listens_on_the_host_and_port_it_is_given(tiny_model_dir):
    """`agentrl serve --host --port 0`: the server listens on that address (127.0.0.2, another
    loopback address), on the free port it prints, and answers there."""
    import subprocess
    import sys
    import urllib.request

    server = subprocess.Popen([sys.executable, "-u", "-m", "agentrl.cli", "serve", str(tiny_model_dir), "--host",
                               "127.0.0.2", "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = next(line for line in server.stdout if line.startswith("serving "))
        address = re.search(r"at (http://[\d.]+:\d+)/v1/chat/completions", line).group(1)
        assert address.startswith("http://127.0.0.2:")
        with urllib.request.urlopen(f"{address}/v1/models", timeout=30) as reply:
            assert json.loads(reply.read())["data"][0]["id"] == Path(tiny_model_dir).name
    finally:
        server.terminate()
        server.wait(timeout=30)
