import json
import random

import pytest
import torch
from conftest import COMPACT

from agentrl.analysis.behaviour import action_confidence, repetition_stats
from agentrl.analysis.coupling import (
    Pair,
    gradient_similarity,
    influence_gap,
    mean_gradient,
    one_step_influence,
    representation_separation,
    response_logprob,
)
from agentrl.cli import main
from agentrl.config import PromptConfig
from agentrl.data import play
from agentrl.envs import make_env
from agentrl.envs.base import sample_tasks
from agentrl.envs.household.env import HouseholdEnvConfig
from agentrl.models import load_model, load_tokenizer
from agentrl.rollout.records import read_trajectories
from agentrl.rollout.types import StepSample, Trajectory
from agentrl.sampler.base import Generation

PAIRS = [Pair("Task: put a mug in desk.", "<action>go to desk 1</action>", True),
         Pair("Task: heat an egg.", "<action>go to microwave 1</action>", True),
         Pair("Task: put a mug in desk.", "<action>look</action>", False)]


def test_influence_raises_the_trained_sample_and_restores_the_model(tiny_model_dir):
    model, tokenizer = load_model(tiny_model_dir), load_tokenizer(tiny_model_dir)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    matrix = one_step_influence(model, tokenizer, PAIRS, lr=1e-3)
    assert matrix.shape == (3, 3) and (matrix.diagonal() > 0).all()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_influence_rows_are_the_trained_sample_and_columns_the_measured_one(tiny_model_dir):
    """Entry (i, j) is the change of log p(y_j | x_j) after one step on sample i, by hand; at a step
    this large the matrix is far from symmetric, so rows and columns cannot be swapped unseen."""
    model, tokenizer = load_model(tiny_model_dir), load_tokenizer(tiny_model_dir)
    lr = 0.5
    matrix = one_step_influence(model, tokenizer, PAIRS, lr=lr)
    params = [p for p in model.parameters() if p.requires_grad]
    with torch.no_grad():
        before = response_logprob(model, tokenizer, PAIRS[2]).item()
    grads = torch.autograd.grad(response_logprob(model, tokenizer, PAIRS[0]), params)
    with torch.no_grad():
        for p, g in zip(params, grads):
            p.add_(g, alpha=lr)
        after = response_logprob(model, tokenizer, PAIRS[2]).item()
    assert matrix[0, 2].item() == pytest.approx(after - before, rel=1e-4, abs=1e-5)
    assert abs(matrix[0, 2] - matrix[2, 0]).item() > 1e-3


def test_gradient_similarity_of_a_set_with_itself_is_one(tiny_model_dir):
    model, tokenizer = load_model(tiny_model_dir), load_tokenizer(tiny_model_dir)
    sims = gradient_similarity(model, tokenizer, {"a": PAIRS[:2], "b": PAIRS[:2], "c": PAIRS[2:]})
    assert sims["a|b"] == pytest.approx(1.0, abs=1e-5)
    assert -1 <= sims["a|c"] < 0.9999
    # a class with no sample has no mean gradient: no similarity is reported for it
    assert set(gradient_similarity(model, tokenizer, {"a": PAIRS[:2], "empty": [], "c": PAIRS[2:]})) == {"a|c"}


def test_the_mean_gradient_is_the_mean_of_each_samples_gradient(tiny_model_dir):
    model, tokenizer = load_model(tiny_model_dir), load_tokenizer(tiny_model_dir)
    each = [mean_gradient(model, tokenizer, [pair]) for pair in PAIRS[:2]]
    assert torch.allclose(mean_gradient(model, tokenizer, PAIRS[:2]), (each[0] + each[1]) / 2, atol=1e-9)
    assert torch.allclose(mean_gradient(model, tokenizer, [PAIRS[0]] * 3), each[0], atol=1e-9)


def test_gap_and_separation_by_hand():
    matrix = torch.tensor([[9.0, 2.0, -1.0], [4.0, 9.0, 1.0], [0.0, 3.0, 9.0]])
    gap = influence_gap(matrix, [True, True, False])
    assert gap["influence_same_class"] == pytest.approx(3.0)  # (2 + 4) / 2
    assert gap["influence_different_class"] == pytest.approx(0.75)  # (-1 + 1 + 0 + 3) / 4
    assert gap["influence_gap"] == pytest.approx(2.25)  # same-class minus cross-class: decoupled when large
    reps = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    sep = representation_separation(reps, [True, True, False])
    assert sep == {"cos_within_class": 1.0, "cos_across_class": 0.0, "separation": 1.0}


def test_repetition_stats_by_hand():
    steps = [StepSample([], [], [], response="", action=a, observation=o, anchor=o)
             for a, o in [("go to a", "start"), ("go to a", "at a"), ("look", "at a"), (None, "start"), (None, "start")]]
    stats = repetition_stats([Trajectory("t", 0, "x", steps)])
    # repeats: the second "go to a" (two unparsed replies in a row repeat no action); loops: the
    # steps at an observation seen earlier ("at a" once, "start" twice)
    assert stats == {"steps": 5, "repeat_rate": 0.2, "loop_rate": 0.6}


class NamedActionPolicy:
    """A rule policy as the sampler: it replies with the action its prompt names after "Next:"."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def generate(self, prompts, sampling):
        names = [self.tokenizer.decode(p).split("Next:")[-1].split("<")[0].strip() for p in prompts]
        return [Generation(self.tokenizer(f"<action>{n}</action>").input_ids, []) for n in names]


def test_action_confidence_by_hand(tiny_model_dir):
    def step(action, named):
        return StepSample([], [], [], response="", action=action, observation="", anchor="",
                          prompt=f"Task: x. Next: {named}")
    # two "other" steps the policy reproduces and one it does not; one repeat it reproduces
    steps = [step("go to a", "go to a"), step("look", "look"), step("open b", "close b"), step("open b", "open b")]
    tokenizer = load_tokenizer(tiny_model_dir)
    out = action_confidence(NamedActionPolicy(tokenizer), tokenizer, [Trajectory("t", 0, "x", steps)], None,
                            resamples=2, max_steps=5, require_think=False)
    # each re-sample is read against its own step's action: 4 of 6 for the others, 2 of 2 for the repeat
    assert out == {"confidence_repeated": 1.0, "steps_repeated": 1, "samples_repeated": 2,
                   "confidence_other": pytest.approx(4 / 6), "steps_other": 3, "samples_other": 6}


def test_analyze_cli_on_recorded_trajectories(tiny_model_dir, tmp_path):
    env, prompt, rng = make_env(HouseholdEnvConfig()), PromptConfig(template=COMPACT, history_length=1), random.Random(0)
    rows = []
    for i, task in enumerate(sample_tasks(env, "train", 6, rng)):
        policy = (lambda obs: env.expert_action()[1]) if i % 2 else (lambda obs: rng.choice(obs.admissible_actions))
        t = play(env, task, prompt, policy)
        rows.append({"task_id": t.task_id, "task_type": t.task_type, "success": t.success, "steps": [
            {"observation": s.observation, "response": f"<think>ok</think><action>{s.action}</action>",
             "action": s.action, "reward": s.reward, "prompt": s.prompt, "progress": s.progress} for s in t.steps]})
    path = tmp_path / "trajectories_l0.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert len(read_trajectories(path)) == 6
    ood = tmp_path / "trajectories_l2.jsonl"  # the same steps the other way round: another draw of pairs
    ood.write_text("".join(json.dumps({**r, "steps": r["steps"][::-1]}) + "\n" for r in rows[::-1]))

    out = tmp_path / "coupling"
    assert main(["analyze", "coupling", "--model", str(tiny_model_dir), "--trajectories", str(path),
                 "--ood", str(path), "--out", str(out), "--samples", "3", "--pairs", "4"]) == 0
    report = json.loads((out / "coupling.json").read_text())
    assert report["set_sizes"] == {"pos_id": 3, "neg_id": 3, "pos_ood": 3, "neg_ood": 3}
    assert report["gradient_cosine"]["pos_id|pos_ood"] == pytest.approx(1.0, abs=1e-5)  # same samples
    assert main(["analyze", "coupling", "--model", str(tiny_model_dir), "--trajectories", str(path),
                 "--ood", str(ood), "--out", str(tmp_path / "apart"), "--samples", "3", "--pairs", "4"]) == 0
    apart = json.loads((tmp_path / "apart" / "coupling.json").read_text())["gradient_cosine"]
    assert apart["pos_id|neg_id"] == report["gradient_cosine"]["pos_id|neg_id"]
    assert apart["pos_ood|neg_ood"] != pytest.approx(report["gradient_cosine"]["pos_ood|neg_ood"], abs=1e-4)
    assert len(report["influence_matrix"]) == 4 and "influence_gap" in report and "separation" in report
    matrix = report["influence_matrix"]  # two good samples, then two bad
    across = [matrix[i][j] for i in range(4) for j in range(4) if (i < 2) != (j < 2)]
    assert report["influence_different_class"] == pytest.approx(sum(across) / 8)
    assert (out / "influence.png").stat().st_size > 1000

    assert main(["analyze", "repeats", "--model", str(tiny_model_dir), "--trajectories", str(path),
                 "--out", str(tmp_path / "rep"), "--resamples", "2", "--max-steps", "2",
                 "--max-new-tokens", "4"]) == 0
    repeats = json.loads((tmp_path / "rep" / "repeats.json").read_text())
    assert repeats["steps"] == sum(len(r["steps"]) for r in rows) and "confidence_other" in repeats

    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    assert main(["analyze", "repeats", "--model", str(tiny_model_dir), "--trajectories", str(bad),
                 "--out", str(tmp_path / "x")]) == 2



def test_analyze_repeats_samples_at_its_temperature_and_reads_replies_without_think(tiny_model_dir, tmp_path):
    """`agentrl analyze repeats` with `--temperature 0 --no-think`: a policy fine-tuned to answer
    the two-step task's first prompts with an `<action>` alone, either action as often, re-samples
    the action it gives greedily every time (confidence 1); at the default temperature 1 it does
    not; without `--no-think` none of its replies is read (no think tag)."""
    from twostep import BAD, GOOD, first_prompt

    from agentrl.config import SamplingConfig, SFTConfig
    from agentrl.prompting import encode_prompt, parse_action
    from agentrl.sampler.hf import HFSampler
    from agentrl.sft import train_sft

    prompts = [first_prompt(f"train-{i}") for i in range(4)]
    data, model_dir = tmp_path / "data.jsonl", tmp_path / "model"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": prompt}, {
        "role": "assistant", "content": f"<action>{action}</action>"}]}) + "\n" for prompt in prompts for action in (GOOD, BAD)))
    train_sft(load_model(tiny_model_dir), load_tokenizer(tiny_model_dir), data,
              SFTConfig(epochs=30, batch_size=8, optim={"lr": 3e-3}), 0, model_dir)
    tokenizer = load_tokenizer(model_dir)
    greedy = HFSampler(load_model(model_dir), tokenizer).generate(
        [encode_prompt(tokenizer, prompt) for prompt in prompts], SamplingConfig(temperature=0, max_new_tokens=24))
    actions = [parse_action(tokenizer.decode(g.token_ids, skip_special_tokens=True), False) for g in greedy]
    assert set(actions) <= {GOOD, BAD}
    path = tmp_path / "trajectories_l0.jsonl"
    path.write_text("".join(json.dumps({"task_id": f"train-{i}", "task_type": "two_step", "success": False, "steps": [
        {"observation": "", "response": "", "action": action, "reward": 0.0, "prompt": prompt, "progress": None}]}) + "\n"
        for i, (prompt, action) in enumerate(zip(prompts, actions))))

    def confidence(*flags):
        out = tmp_path / "-".join(flags)
        assert main(["analyze", "repeats", "--model", str(model_dir), "--trajectories", str(path), "--out", str(out),
                     "--resamples", "8", "--max-new-tokens", "24", *flags]) == 0
        report = json.loads((out / "repeats.json").read_text())
        assert report["samples_other"] == 8 * report["steps_other"] == 8 * len(prompts)  # --resamples 8 of each step
        return report["confidence_other"]
    assert confidence("--temperature", "0", "--no-think") == 1.0
    assert confidence("--no-think") < 0.9
    assert confidence("--temperature", "0") == 0.0


def expert_and_random_episodes() -> list[Trajectory]:
    """Four household episodes, the expert's and a random player's in turn: steps the environment
    labels good and bad, with the replies that took them."""
    env, prompt, rng = make_env(HouseholdEnvConfig()), PromptConfig(template=COMPACT, history_length=1), random.Random(1)
    trajectories = []
    for i, task in enumerate(sample_tasks(env, "train", 4, rng)):
        policy = (lambda obs: env.expert_action()[1]) if i % 2 else (lambda obs: rng.choice(obs.admissible_actions))
        t = play(env, task, prompt, policy)
        for s in t.steps:
            s.response = f"<think>ok</think><action>{s.action}</action>"
        trajectories.append(t)
    return trajectories


def test_coupling_metrics_on_played_trajectories(tiny_model_dir):
    from agentrl.analysis.coupling import coupling_metrics

    trajectories = expert_and_random_episodes()
    model, tokenizer = load_model(tiny_model_dir), load_tokenizer(tiny_model_dir)
    before = [p.detach().clone() for p in model.parameters()]
    out = coupling_metrics(model, tokenizer, trajectories, 4, 1e-3, seed=0)
    assert set(out) == {"grad_cos_pos_neg", "influence_same_class", "influence_different_class", "influence_gap",
                        "cos_within_class", "cos_across_class", "separation"}
    assert -1 <= out["grad_cos_pos_neg"] <= 1
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # the model is left as it was
    assert coupling_metrics(model, tokenizer, trajectories[:0], 4, 1e-3, seed=0) == {}
    from test_gcd import traj
    only_good = traj(["start", "A", "B"], success=True, progress=[True, True, True])
    assert coupling_metrics(model, tokenizer, [only_good], 4, 1e-3, seed=0) == {}  # no bad step to couple with
    one_each = coupling_metrics(model, tokenizer, trajectories, 2, 1e-3, seed=0)  # `pairs` in all, half good
    assert one_each["influence_same_class"] == 0.0 and one_each["cos_within_class"] == 0.0  # no two of a class


def test_action_representations_read_the_last_layer_in_context(tiny_model_dir):
    """The same response after two prompts: the last layer sees the prompt (the embeddings would not)."""
    from agentrl.analysis.coupling import action_representations

    model, tokenizer = load_model(tiny_model_dir), load_tokenizer(tiny_model_dir)
    reps = action_representations(model, tokenizer, [PAIRS[0], Pair("Task: heat an egg.", PAIRS[0].response)])
    assert reps.shape == (2, model.config.hidden_size)
    assert not torch.allclose(reps[0], reps[1], atol=1e-4)


def test_a_responses_log_prob_and_representation_by_hand(tiny_model_dir):
    """log p(response | prompt) is the sum of each response token's log-prob given everything
    before it (computed here one prefix at a time), and a representation is the mean of the
    response tokens' last-layer states."""
    from agentrl.analysis.coupling import _encode, action_representations, response_logprob

    model, tokenizer = load_model(tiny_model_dir), load_tokenizer(tiny_model_dir)
    ids, n_prompt = _encode(model, tokenizer, PAIRS[0])
    with torch.no_grad():
        by_prefix = sum(torch.log_softmax(model(input_ids=ids[:, :k]).logits[0, -1].float(), -1)[ids[0, k]]
                        for k in range(n_prompt, ids.shape[1]))
        assert response_logprob(model, tokenizer, PAIRS[0]).item() == pytest.approx(by_prefix.item(), abs=1e-4)
        states = model(input_ids=ids, output_hidden_states=True).hidden_states[-1][0]
    response = [states[k] for k in range(n_prompt, ids.shape[1])]
    assert len(response) > 1
    assert torch.allclose(action_representations(model, tokenizer, PAIRS[:1])[0], sum(response) / len(response),
                          atol=1e-5)


def test_the_coupling_lab_draws_its_pairs_afresh_each_step(tiny_model_dir):
    from types import SimpleNamespace

    from agentrl.analysis.coupling import CouplingLab, CouplingLabConfig
    from agentrl.components import Context, StepBatch

    trajectories = expert_and_random_episodes()
    model, tokenizer = load_model(tiny_model_dir), load_tokenizer(tiny_model_dir)
    context = Context(SimpleNamespace(seed=0), "", model, None, tokenizer, None)
    lab = CouplingLab(CouplingLabConfig(pairs=2), context)

    def measured(step, metric="grad_cos_pos_neg", lab=lab):
        batch = StepBatch(step, trajectories, [s for t in trajectories for s in t.steps], [])
        lab.shape(batch)
        return batch.metrics[f"coupling/{metric}"]

    assert measured(1) == measured(1)  # seeded by the step
    assert len({measured(step) for step in range(1, 5)}) > 1  # another step, other pairs
    # the one-step influence is taken with the lab's own lr
    farther = CouplingLab(CouplingLabConfig(pairs=2, lr=1e-1), context)
    assert measured(1, "influence_gap", farther) != measured(1, "influence_gap")


def test_the_labs_pairs_take_the_environments_word_over_the_rules():
    """A step the environment calls progress is a good pair even where the loop rule would call it
    bad (a move can make progress and still lead to a state seen again); steps only the rules
    label keep the rules' word."""
    from test_gcd import traj

    from agentrl.analysis.coupling import labelled_pairs

    # step 0's result (A) re-occurs: the rules say bad, the environment says progress
    t = traj(["start", "A", "B", "A", "C"], success=True, progress=[True, None, False, None, None])
    good, bad = labelled_pairs([t], 10, seed=0)
    assert {p.response for p in good} == {"a0", "a4"} and {p.response for p in bad} == {"a2"}
