"""Evaluation statistics by hand (the Wilson interval, the split summary) and evaluation in batches."""

import json

import pytest
import torch
from conftest import COMPACT

from agentrl.config import EnvPoolConfig, EvalConfig, PromptConfig
from agentrl.envs.household.env import HouseholdEnvConfig
from agentrl.envs.pool import EnvPool
from agentrl.evaluate import evaluate, summarize, wilson_interval
from agentrl.models import load_model, load_tokenizer
from agentrl.rollout.types import StepSample, Trajectory
from agentrl.sampler.hf import HFSampler


def test_wilson_interval_by_hand():
    # 8 of 10, z 1.96: centre (0.8 + 0.19208) / 1.38416 = 0.71674,
    # half 1.96 sqrt(0.016 + 0.009604) / 1.38416 = 0.22658.
    assert wilson_interval(8, 10) == pytest.approx((0.49016, 0.94332), abs=1e-5)
    low, high = wilson_interval(0, 20)  # no success: the interval still has width
    assert low == 0.0 and high == pytest.approx(0.16113, abs=1e-5)
    assert wilson_interval(0, 0) == (0.0, 0.0)


def episode(task_type, actions, success=False, aborted=False):
    steps = [StepSample([1], [2], [0.0], response="", action=a, observation="o", anchor="o", reward=10.0 * success)
             for a in actions]
    return Trajectory("t", 0, task_type, steps, success=success, aborted=aborted)


def test_summary_counts_aborted_episodes_apart():
    trajectories = [episode("pick", ["go", "take"], success=True), episode("pick", ["go", "go", None]),
                    episode("heat", [None], success=False), episode("heat", ["go"], success=True),
                    episode("heat", ["go"], aborted=True)]
    out = summarize(trajectories)
    assert out["episodes"] == 4 and out["aborted"] == 1
    assert out["success"] == 0.5 and out["ci95"] == list(wilson_interval(2, 4))
    assert out["per_task_type"] == {"heat": 0.5, "pick": 0.5}
    assert out["invalid_rate"] == pytest.approx(2 / 7)  # over the finished episodes' 7 steps
    assert out["repeated_rate"] == pytest.approx(1 / 7)  # "go", "go"
    assert out["mean_length"] == pytest.approx(7 / 4)
    assert out["mean_return"] == pytest.approx((2 * 10 + 10) / 4)  # the successes' steps, aborted left out


def test_mean_score_clips_each_episode_at_0_and_mean_return_does_not():
    """ScienceWorld: a failed task ends at -100 (its rewards sum to the final score); the paper's
    score counts it 0, the return keeps it."""
    def scored(rewards):
        steps = [StepSample([1], [2], [0.0], "", "go", "o", "o", reward=r) for r in rewards]
        return Trajectory("t", 0, "boil", steps)

    out = summarize([scored([20.0, -120.0]), scored([10.0, 20.0]), scored([5.0, -5.0])])
    assert out["mean_return"] == pytest.approx((-100 + 30 + 0) / 3)
    assert out["mean_score"] == pytest.approx((0 + 30 + 0) / 3)



@pytest.mark.parametrize("batch_size, alive", [(3, 3), (None, 7)])
def test_evaluation_plays_every_task_once_with_batch_size_environments_alive(tiny_model_dir, tmp_path, batch_size,
                                                                            alive):
    """eval.batch_size bounds the environments alive at once (on ScienceWorld each is a JVM: 120 at
    once ran 24 GiB out of memory), and every one of the split's first `episodes` tasks is still
    played once, in order, each its own group."""
    tokenizer = load_tokenizer(tiny_model_dir)
    eval_cfg = EvalConfig(splits=["l0"], episodes=7, batch_size=batch_size, sampling={"max_new_tokens": 4})
    with EnvPool(HouseholdEnvConfig(max_steps=2), EnvPoolConfig(workers=0)) as pool:
        sampler = HFSampler(load_model(tiny_model_dir), tokenizer)
        results = evaluate(pool, sampler, tokenizer, eval_cfg, PromptConfig(template=COMPACT), 0, tmp_path)
        assert len(pool._server.envs) == alive
        tasks = pool.local.split_tasks("l0")[:7]
    played = [json.loads(line) for line in (tmp_path / "trajectories_l0.jsonl").read_text().splitlines()]
    assert [(t["task_id"], t["group_id"]) for t in played] == list(zip(tasks, range(7)))
    assert results["l0"]["episodes"] == 7


def test_evaluation_is_seeded_by_its_own_seed_and_leaves_the_global_stream_alone(tiny_model_dir, tmp_path):
    """Sampled at temperature 1: the same seed plays the same episodes whatever state the global
    RNG is in, another seed plays others, and the global stream is where evaluation found it."""
    tokenizer = load_tokenizer(tiny_model_dir)
    eval_cfg = EvalConfig(splits=["l0"], episodes=3, sampling={"max_new_tokens": 6, "temperature": 1.0})
    with EnvPool(HouseholdEnvConfig(max_steps=2), EnvPoolConfig(workers=0)) as pool:
        sampler = HFSampler(load_model(tiny_model_dir), tokenizer)

        def responses(global_seed, seed, out_dir):
            torch.manual_seed(global_seed)
            before = torch.random.get_rng_state()
            evaluate(pool, sampler, tokenizer, eval_cfg, PromptConfig(template=COMPACT), seed, out_dir)
            assert torch.equal(torch.random.get_rng_state(), before)
            return [s["response"] for line in (out_dir / "trajectories_l0.jsonl").read_text().splitlines()
                    for s in json.loads(line)["steps"]]

        first = responses(1, 0, tmp_path / "a")
        assert responses(2, 0, tmp_path / "b") == first
        assert responses(1, 1, tmp_path / "c") != first


def test_each_component_measures_its_split_with_the_evaluations_seed(tiny_model_dir):
    """A component's own measure (a GCD judge's accuracy: a seeded draw of pairs) is drawn with the
    evaluation's seed, on each split's own episodes, so it follows the run's seed as they do."""
    from agentrl.components import Component

    class SeedSeen(Component):  # a researcher's component, as a plugin would define it
        name = "seed_seen"

        def evaluate(self, trajectories, seed):
            return {"seed_seen": seed, "tasks_seen": sorted(t.task_id for t in trajectories)}

    tokenizer = load_tokenizer(tiny_model_dir)
    eval_cfg = EvalConfig(splits=["l0", "l2"], episodes=2, sampling={"max_new_tokens": 4})
    with EnvPool(HouseholdEnvConfig(max_steps=2), EnvPoolConfig(workers=0)) as pool:
        sampler = HFSampler(load_model(tiny_model_dir), tokenizer)
        results = evaluate(pool, sampler, tokenizer, eval_cfg, PromptConfig(template=COMPACT), 7,
                           components=[SeedSeen()])
        first = {split: pool.local.split_tasks(split)[:2] for split in ("l0", "l2")}
    assert {s: (r["seed_seen"], r["tasks_seen"]) for s, r in results.items()} == {
        s: (7, sorted(tasks)) for s, tasks in first.items()}


def test_the_aborted_share_is_taken_over_every_episode_played(tiny_model_dir):
    """One of 3 episodes aborted (its worker killed before the first move): a share of 1/3, within
    eval.max_aborted_share 0.4 (measured against the 2 that finished it would be 1/2) and beyond 0.3."""
    import signal

    from test_pool import SignalOnCall

    from agentrl.errors import RunError

    tokenizer = load_tokenizer(tiny_model_dir)
    for share in (0.4, 0.3):
        eval_cfg = EvalConfig(splits=["l0"], episodes=3, max_aborted_share=share, sampling={"max_new_tokens": 4})
        with EnvPool(HouseholdEnvConfig(max_steps=2), EnvPoolConfig(workers=3)) as pool:
            sampler = SignalOnCall(HFSampler(load_model(tiny_model_dir), tokenizer), pool, signal.SIGKILL, at=1)
            if share == 0.3:
                with pytest.raises(RunError, match="1 of 3 episodes aborted"):
                    evaluate(pool, sampler, tokenizer, eval_cfg, PromptConfig(template=COMPACT), 0)
                continue
            results = evaluate(pool, sampler, tokenizer, eval_cfg, PromptConfig(template=COMPACT), 0)
            assert (results["l0"]["episodes"], results["l0"]["aborted"]) == (2, 1)


def test_an_evaluation_without_settings_keeps_no_record_to_resume_from(tiny_model_dir, tmp_path, monkeypatch):
    """Given an output folder but no settings (what its results depend on unknown), a stopped
    evaluation leaves no record of its finished splits: run again, it plays every split."""
    import agentrl.evaluate as evaluation

    played = []

    def stage(name):
        played.append(name)
        if len(played) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(evaluation, "set_stage", stage)
    tokenizer = load_tokenizer(tiny_model_dir)
    eval_cfg = EvalConfig(splits=["l0", "l1"], episodes=2, sampling={"max_new_tokens": 4})
    with EnvPool(HouseholdEnvConfig(max_steps=2), EnvPoolConfig(workers=0)) as pool:
        sampler = HFSampler(load_model(tiny_model_dir), tokenizer)
        with pytest.raises(KeyboardInterrupt):
            evaluate(pool, sampler, tokenizer, eval_cfg, PromptConfig(template=COMPACT), 0, tmp_path)
        assert (tmp_path / "trajectories_l0.jsonl").is_file() and not list(tmp_path.glob("*.done.json"))
        evaluate(pool, sampler, tokenizer, eval_cfg, PromptConfig(template=COMPACT), 0, tmp_path)
    assert played == ["evaluation l0", "evaluation l1", "evaluation l0", "evaluation l1"]

def test_a_stopped_evaluation_resumes_at_the_split_it_stopped_in(tiny_model_dir, tmp_path, monkeypatch):
    """An evaluation phase records each split it finishes: stopped in L1, it plays only L1 when run
    again with the same settings, to the results of one uninterrupted run (each split is seeded on
    its own); with other settings, or without L0's trajectories, it plays L0 again. Once complete,
    only results.json records it."""
    import agentrl.evaluate as evaluation
    from agentrl.pipeline import _eval_phase
    from agentrl.provenance import Phases
    from agentrl.recipe import validate_config

    played, stop = [], {"in": None}

    def stage(name):
        played.append(name)
        if name == stop["in"]:
            raise KeyboardInterrupt

    def phase(run_dir, seed=0):
        config = validate_config({"run_dir": str(run_dir), "seed": seed, "model": {"path": str(tiny_model_dir)},
                                  "env": {"type": "household", "max_steps": 3}, "prompt": {"template": COMPACT},
                                  "eval": {"splits": ["l0", "l1"], "episodes": 3,
                                           "sampling": {"max_new_tokens": 6, "temperature": 1.0}}})
        played.clear()
        return _eval_phase(config, Phases(run_dir, say=lambda line: None), "sft", str(tiny_model_dir), {}, {})

    monkeypatch.setattr(evaluation, "set_stage", stage)
    whole = phase(tmp_path / "whole")
    for name, seed, gone, replayed in [("same", 0, False, ["evaluation l1"]),
                                       ("other", 1, False, ["evaluation l0", "evaluation l1"]),
                                       ("gone", 0, True, ["evaluation l0", "evaluation l1"])]:
        out_dir = tmp_path / name / "eval" / "sft"
        stop["in"] = "evaluation l1"
        with pytest.raises(KeyboardInterrupt):
            phase(tmp_path / name)
        assert (out_dir / "l0.done.json").is_file() and not (out_dir / "results.json").exists()
        if gone:
            (out_dir / "trajectories_l0.jsonl").unlink()
        stop["in"] = None
        results = phase(tmp_path / name, seed)
        assert played == replayed and (seed or results == whole)
        assert sorted(p.name for p in out_dir.iterdir()) == ["results.json", "trajectories_l0.jsonl",
                                                             "trajectories_l1.jsonl"]
    for split in ("l0", "l1"):
        same, once = (tmp_path / run / "eval" / "sft" / f"trajectories_{split}.jsonl" for run in ("same", "whole"))
        assert same.read_text() == once.read_text()
