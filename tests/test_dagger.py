"""DAgger: the policy plays, the environment's expert labels every state it reached."""

import json
import random

import pytest
from conftest import COMPACT

from agentrl.config import DaggerConfig, EnvPoolConfig, PromptConfig, SamplingConfig
from agentrl.dagger import expert_share, play_labelled
from agentrl.data import encode_conversation, expert_episode
from agentrl.envs import make_env
from agentrl.envs.base import NoExpertMove
from agentrl.envs.household.env import HouseholdEnvConfig
from agentrl.envs.pool import EnvPool
from agentrl.models import load_model, load_tokenizer
from agentrl.prompting import parse_action
from agentrl.sampler.hf import HFSampler

PROMPT = PromptConfig(template=COMPACT, history_length=1)


def play(model_dir, tasks, share, workers=0, prompt=PROMPT):
    tokenizer = load_tokenizer(model_dir)
    sampler = HFSampler(load_model(model_dir), tokenizer)
    with EnvPool(HouseholdEnvConfig(), EnvPoolConfig(workers=workers)) as pool:
        return play_labelled(pool, sampler, tokenizer, tasks, prompt, SamplingConfig(temperature=1.0), share,
                             random.Random(0))


@pytest.mark.parametrize("prompt", [PROMPT, PromptConfig(template=COMPACT, history_length=1, full_history=True)],
                         ids=["window", "full_history"])
def test_with_every_move_the_experts_dagger_is_the_expert_data(tiny_model_dir, prompt):
    """Expert share 1: the policy's moves are never executed, so the labelled states are the
    expert's own episodes, example for example (with a full history, the conversation up to each
    state), whatever the random-init policy said."""
    env = make_env(HouseholdEnvConfig())
    tasks = env.split_tasks("train")[:6]
    played = play(tiny_model_dir, tasks, share=1.0, prompt=prompt)
    stats = played.stats()
    assert stats.success == 1.0 and stats.episodes == 6 and stats.policy_agreement < 0.5
    expert = [example for task in tasks for example in expert_episode(env, task, prompt)]
    ordered = sorted(played.examples, key=lambda e: tasks.index(e["task_id"]))  # stable within a task
    assert [e["messages"] for e in ordered] == [e["messages"] for e in expert]
    if prompt.full_history:  # each state asked with the tokens SFT encodes its conversation to
        tokenizer = load_tokenizer(tiny_model_dir)
        for trajectory in played.trajectories:
            mine = [e for e in played.examples if e["task_id"] == trajectory.task_id]
            assert len(mine) == len(trajectory.steps)
            for step, example in zip(trajectory.steps, mine):
                assert encode_conversation(tokenizer, example["messages"]).ids == step.prompt_ids + step.response_ids


def test_the_policys_states_are_labelled_with_the_experts_move_from_there(tiny_model_dir):
    """Expert share 0: the random-init policy wanders; each label is the expert's move from the
    state the executed moves led to (replayed in a fresh environment), in workers as in-process."""
    env = make_env(HouseholdEnvConfig())
    tasks = env.split_tasks("train")[:4]
    played = play(tiny_model_dir, tasks, share=0.0, workers=2)
    assert played.stats().success == 0.0 and len(played.examples) >= 20
    for trajectory in played.trajectories:
        expected = []
        env.reset(trajectory.task_id)
        for step in trajectory.steps:
            try:
                expected.append(env.expert_action()[1])
            except NoExpertMove:
                pass
            env.step(step.action)
        labels = [parse_action(e["messages"][1]["content"]) for e in played.examples
                  if e["task_id"] == trajectory.task_id]
        assert labels == expected and len(labels) >= 5
        assert [e["messages"][0]["content"] for e in played.examples if e["task_id"] == trajectory.task_id] == \
            [s.prompt for s in trajectory.steps][:len(labels)]


def test_the_rounds_play_their_own_tasks_with_their_own_sampling(tiny_model_dir, tmp_path):
    """Every move of a round is sampled as `sft.dagger.sampling` says, not as evaluation does, and
    each round plays tasks of its own, drawn from (seed, round)."""
    from agentrl.dagger import dagger_data
    from agentrl.recipe import validate_config

    class Recording(HFSampler):
        params = []

        def generate(self, prompts, params):
            self.params.append(params)
            return super().generate(prompts, params)

    dagger = {"episodes": 2, "expert_share": [0.0, 0.0], "sampling": {"temperature": 0.7, "max_new_tokens": 8}}
    config = validate_config({"env": {"type": "household", "max_steps": 3}, "prompt": {"template": COMPACT},
                              "sft": {"dagger": dagger}, "eval": {"sampling": {"max_new_tokens": 6}}})
    tokenizer = load_tokenizer(tiny_model_dir)
    sampler = Recording(load_model(tiny_model_dir), tokenizer)
    tasks = []
    with EnvPool(config.env, EnvPoolConfig(workers=0)) as pool:
        for number, round_number in enumerate((1, 2, 1)):
            out = tmp_path / f"labels{number}.jsonl"
            dagger_data(pool, sampler, tokenizer, config, round_number, out)
            tasks.append(list(dict.fromkeys(json.loads(line)["task_id"] for line in out.read_text().splitlines())))
    assert len(sampler.params) == 9 and all(p == config.sft.dagger.sampling for p in sampler.params)
    assert len(tasks[1]) == 2 and tasks[0] == tasks[2] != tasks[1]


def test_each_round_plays_at_its_own_expert_share_and_its_labels_are_seeded(tiny_model_dir, tmp_path):
    """Expert share annealed from 1 to 0 over two rounds: round 1 is the expert's play (every
    episode won), round 2 the random-init policy's own (none won). A round's labels are the same
    whatever drew from torch's generator before it (a full history, so that the labelled
    conversations hold the policy's sampled replies)."""
    import torch

    from agentrl.pipeline import _dagger_labels
    from agentrl.recipe import validate_config

    dagger = {"rounds": 2, "episodes": 2, "expert_share": [1.0, 0.0],
              "sampling": {"max_new_tokens": 8, "temperature": 1.0}}
    prompt = {"template": COMPACT, "history_length": 1, "full_history": True}
    config = validate_config({"env": {"type": "household"}, "prompt": prompt, "sft": {"dagger": dagger}})
    for number, seed in ((1, 0), (2, 0), (2, 1)):
        torch.manual_seed(seed)
        (tmp_path / f"{number}-{seed}").mkdir()
        _dagger_labels(config, tiny_model_dir, number, tmp_path / f"{number}-{seed}" / "labels.jsonl", {})
    rounds = [json.loads((tmp_path / f"{n}-{s}" / "rounds.jsonl").read_text()) for n, s in ((1, 0), (2, 0))]
    assert [r["success"] for r in rounds] == [1.0, 0.0]
    assert (tmp_path / "2-0" / "labels.jsonl").read_text() == (tmp_path / "2-1" / "labels.jsonl").read_text()


def test_expert_share_is_annealed_linearly_over_the_rounds():
    dagger = DaggerConfig(rounds=5, expert_share=(1.0, 0.0))
    assert [expert_share(dagger, r) for r in range(1, 6)] == [1.0, 0.75, 0.5, 0.25, 0.0]
    assert expert_share(DaggerConfig(rounds=1, expert_share=(0.3, 0.0)), 1) == 0.3


def test_a_rounds_numbers_by_hand():
    """A round's success is over the episodes that finished (an aborted one is neither a win nor a
    loss); its policy agreement is over the labelled states, not the episodes."""
    from agentrl.dagger import Labelled
    from agentrl.rollout.types import Trajectory

    won, lost, aborted = (Trajectory(f"train-{i}", i, "pick", []) for i in range(3))
    won.success, aborted.aborted = True, True
    stats = Labelled([{}] * 8, [won, lost, aborted], agreed=2).stats()
    assert (stats.episodes, stats.examples, stats.success, stats.policy_agreement) == (2, 8, 0.5, 0.25)


def test_pipeline_rounds_aggregate_every_label_and_are_reused(tmp_path, capsys):
    """`agentrl run` with sft.dagger: each round trains on the expert data and every round's
    labels so far; a rerun reuses every round, and other DAgger settings reuse the cloning."""
    import shutil
    from pathlib import Path

    from agentrl.pipeline import run_pipeline
    from agentrl.recipe import load_config

    recipe = Path(__file__).resolve().parents[1] / "recipes" / "demo.yaml"
    overrides = [f"run_dir={tmp_path / 'run'}", f"model.path={tmp_path / 'init'}", "sft.episodes=30", "sft.epochs=1",
                 "rl.steps=0", "eval.episodes=4", "eval.initial=false", "init.corpus_episodes=20"]
    run_pipeline(load_config(recipe, [*overrides, "sft.dagger={rounds: 2, episodes: 6}"]))
    work = tmp_path / "run" / "sft" / "dagger"
    lines = [len((p).read_text().splitlines()) for p in
             (tmp_path / "run" / "sft" / "data.jsonl", work / "labels1.jsonl", work / "labels2.jsonl")]
    assert min(lines) > 0
    rounds = [json.loads(line) for line in (work / "rounds.jsonl").read_text().splitlines()]
    assert [(r["round"], r["examples"]) for r in rounds] == [(1, lines[1]), (2, lines[2])]
    # the rounds play train tasks (drawn like the expert's), never the evaluation's
    train = set(make_env(load_config(recipe, overrides).env).split_tasks("train"))
    for labels in ("labels1.jsonl", "labels2.jsonl"):
        assert {json.loads(line)["task_id"] for line in (work / labels).read_text().splitlines()} <= train
    assert (work / "aggregate2.jsonl").read_text() == "".join(
        p.read_text() for p in (tmp_path / "run" / "sft" / "data.jsonl", work / "labels1.jsonl", work / "labels2.jsonl"))
    final = (tmp_path / "run" / "sft" / "model" / "model.safetensors").read_bytes()
    assert final == (work / "model2" / "model.safetensors").read_bytes()
    capsys.readouterr()
    run_pipeline(load_config(recipe, [*overrides, "sft.dagger={rounds: 2, episodes: 6}"]))
    assert "running" not in capsys.readouterr().out
    # A round's labels changed under it (here cut short; its settings are the same) redo that
    # round's SFT when the rounds are gone through again (here: the final model is missing, as when
    # a run stopped in the last round), not keep a model trained on other labels.
    labels = work / "labels2.jsonl"
    labels.write_text("".join(labels.read_text().splitlines(keepends=True)[:-1]))
    shutil.rmtree(tmp_path / "run" / "sft" / "model")
    run_pipeline(load_config(recipe, [*overrides, "sft.dagger={rounds: 2, episodes: 6}"]))
    said = capsys.readouterr().out
    assert "labels 2: done earlier" in said and "sft 2: settings changed (dagger.labels:" in said
    # A round's model gone (the same settings): that round trains again, and the next round's
    # labels, which its old model played, are played again.
    shutil.rmtree(work / "model1")
    shutil.rmtree(tmp_path / "run" / "sft" / "model")
    run_pipeline(load_config(recipe, [*overrides, "sft.dagger={rounds: 2, episodes: 6}"]))
    said = capsys.readouterr().out
    assert "sft 1: done earlier" not in said and "labels 2: settings changed (dagger.model" in said
    assert (work / "model1" / "config.json").is_file()
    run_pipeline(load_config(recipe, [*overrides, "sft.dagger={rounds: 1, episodes: 6}"]))
    said = capsys.readouterr().out
    assert "sft 0: done earlier" in said and "labels 1: settings changed" in said
    run_pipeline(load_config(recipe, [*overrides, "sft.dagger={rounds: 1, episodes: 6, sampling: {temperature: 1.0}}"]))
    said = capsys.readouterr().out
    assert "sft 0: done earlier" in said and "labels 1: settings changed (sft.dagger.sampling.temperature" in said


def test_labels_of_given_data_are_redone_when_the_environment_or_prompt_changes(tmp_path, capsys):
    """With `sft.data` given, the expert data's settings hold no environment or prompt; the rounds'
    labels, played in that environment with that prompt, must still follow them."""
    import shutil
    from pathlib import Path

    from agentrl.pipeline import run_pipeline
    from agentrl.recipe import load_config

    recipe = Path(__file__).resolve().parents[1] / "recipes" / "demo.yaml"
    overrides = [f"run_dir={tmp_path / 'run'}", f"model.path={tmp_path / 'init'}", "sft.episodes=20", "sft.epochs=1",
                 "rl.steps=0", "eval.episodes=2", "eval.splits=[l0]", "eval.initial=false",
                 "init.corpus_episodes=20", "sft.dagger={rounds: 1, episodes: 4, epochs: 2}"]
    run_pipeline(load_config(recipe, overrides))
    said = capsys.readouterr().out  # the cloning trains sft.epochs (1), the round sft.dagger.epochs (2)
    assert "  epoch 2  loss" in said
    shutil.copy(tmp_path / "run" / "sft" / "data.jsonl", tmp_path / "data.jsonl")
    shutil.copytree(tmp_path / "init", tmp_path / "start")
    given = [*overrides, f"sft.data={tmp_path / 'data.jsonl'}", f"model.path={tmp_path / 'start'}", "init=null"]
    run_pipeline(load_config(recipe, given))
    capsys.readouterr()
    run_pipeline(load_config(recipe, [*given, "env.max_steps=5"]))
    said = capsys.readouterr().out
    assert "sft 0: done earlier" in said and "labels 1: settings changed (dagger.env.max_steps" in said
