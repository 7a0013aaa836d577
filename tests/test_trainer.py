import contextlib
import json
import math
import random
from pathlib import Path

import pytest
import torch
from conftest import COMPACT, leaves_like_a_launched_rank
from safetensors.torch import load_file

from agentrl.checkpoint import list_checkpoints
from agentrl.recipe import validate_config
from agentrl.seeding import step_seed
from agentrl.tracking import read_metrics
from agentrl.trainer import RLTrainer, epoch_orders, shuffled


def small_config(run_dir, steps, **rl):
    return validate_config({
        "seed": 3, "run_dir": str(run_dir),
        "env": {"type": "household", "max_steps": 3},
        "prompt": {"template": COMPACT, "history_length": 1},
        "sampling": {"max_new_tokens": 8},
        "rl": {"steps": steps, "tasks_per_step": 2, "group_size": 3, "mini_batch_size": 8,
               "micro_batch_tokens": 600, "save_every": 1, "kl_coef": 0.01, "optim": {"lr": 1e-3}, **rl},
        "eval": {"episodes": 2, "splits": ["l0"]},
    })


def run(config, model_dir, resume=False):
    trainer = RLTrainer(config, str(model_dir), Path(config.run_dir))
    try:
        trainer.run(resume=resume)
    finally:
        trainer.close()


def played_off_reference(trainer):
    """Step 1's trajectories, played after the policy was moved off its reference (seeded); the
    sampler is the policy itself."""
    torch.manual_seed(0)
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    return trainer.rollout(1)


def strip_timing(rows):
    return [{k: v for k, v in r.items() if not k.startswith(("timing_s/", "throughput/", "eval/"))} for r in rows]


def test_resume_continues_exactly_like_an_uninterrupted_run(tiny_model_dir, tmp_path):
    straight = tmp_path / "straight"
    run(small_config(straight, 3), tiny_model_dir)

    split = tmp_path / "split"
    run(small_config(split, 2, save_rollouts=2), tiny_model_dir)
    # Simulate a crash after step 2's checkpoint: a later, stale metrics line must not survive.
    with (split / "logs" / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": 3, "stale": 1.0}) + "\n")
    run(small_config(split, 3, save_rollouts=2), tiny_model_dir, resume=True)
    assert sorted(p.name for p in (split / "rollouts").iterdir()) == ["step_000002.jsonl.gz", "step_000003.jsonl.gz"]

    final_a = load_file(list_checkpoints(straight)[-1] / "model" / "model.safetensors")
    final_b = load_file(list_checkpoints(split)[-1] / "model" / "model.safetensors")
    for name in final_a:
        assert torch.equal(final_a[name], final_b[name]), name
    rows_a = strip_timing(read_metrics(straight / "logs" / "metrics.jsonl"))
    rows_b = strip_timing(read_metrics(split / "logs" / "metrics.jsonl"))
    assert [r["step"] for r in rows_b] == [1, 2, 3]
    assert rows_a == rows_b
    assert len(list_checkpoints(split)) == 2  # keep_last


def test_training_changes_the_weights_and_logs_namespaced_metrics(tiny_model_dir, tmp_path):
    config = small_config(tmp_path, 1)
    trainer = RLTrainer(config, str(tiny_model_dir), tmp_path)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    try:
        metrics = trainer.train_step()
    finally:
        trainer.close()
    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(before[n], p)]
    assert changed
    for key in ["rollout/success", "rollout/invalid_rate", "rollout/repeated_rate", "actor/pg_clipfrac",
                "actor/kl", "actor/entropy", "actor/grad_norm", "tokens/processed", "timing_s/gen",
                "timing_s/env", "timing_s/update", "adv/iqr"]:
        assert key in metrics, key
    assert metrics["rollout/length"] == 3.0  # untrained model: every episode runs to max_steps


def test_log_samples_shows_that_many_episodes_last_turns_a_task_group_at_a_time():
    """rl.log_samples: TensorBoard's `samples` text holds the last turn of that many episodes, one
    of each task group before a second of any."""
    from agentrl.rollout.types import StepSample, Trajectory
    from agentrl.trainer import samples_markdown

    def episode(group, i):
        turns = [StepSample([1], [2], [0.0], f"reply {group}.{i}.{k}", "go", "obs", "a", prompt=f"prompt {group}.{i}.{k}")
                 for k in range(2)]
        return Trajectory(f"task-{group}", group, "kind", turns)

    trajectories = [episode(group, i) for group in (0, 1) for i in range(3)]
    for n, shown in [(1, ["0.0"]), (3, ["0.0", "1.0", "0.1"]), (10, ["0.0", "1.0", "0.1", "1.1", "0.2", "1.2"])]:
        parts = samples_markdown(trajectories, n).split("\n\n---\n\n")
        assert [p.split("reply ")[1][:3] for p in parts] == shown
        assert all(f"prompt {s}.1" in p and f"reply {s}.1" in p for s, p in zip(shown, parts))  # the last turn


def test_steps_save_every_keep_last_and_eval_every_decide_the_checkpoints_and_evaluations(tiny_model_dir, tmp_path):
    """rl.steps steps run; a checkpoint every rl.save_every steps and at the end, the last
    rl.keep_last of them kept; an evaluation every rl.eval_every steps and at the end."""
    for keep_last, eval_every, kept, evaluated in [(3, 3, [2, 4, 5], [3, 5]), (1, 0, [5], [5])]:
        run_dir = tmp_path / f"keep{keep_last}"
        run(small_config(run_dir, 5, save_every=2, keep_last=keep_last, eval_every=eval_every), tiny_model_dir)
        assert [int(c.name[5:]) for c in list_checkpoints(run_dir)] == kept
        rows = read_metrics(run_dir / "logs" / "metrics.jsonl")
        assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
        assert [r["step"] for r in rows if "eval/l0/success" in r] == evaluated


def test_the_exported_model_is_the_last_checkpoint(tiny_model_dir, tmp_path):
    run(small_config(tmp_path / "run", 2, keep_last=2), tiny_model_dir)
    first, last = list_checkpoints(tmp_path / "run")
    weights = [folder / "model" / "model.safetensors" for folder in (tmp_path / "run", last, first)]
    exported, saved_last, saved_first = (w.read_bytes() for w in weights)
    assert exported == saved_last != saved_first


def test_shuffled_deals_whole_task_groups_or_every_sample():
    samples, groups = list(range(12)), [7, 7, 7, 3, 3, 3, 3, 9, 9, 5, 5, 5]
    plain = list(samples)
    random.Random(4).shuffle(plain)
    assert shuffled(samples, None, random.Random(4)) == plain and samples == list(range(12))  # a copy, as before
    orders = {tuple(shuffled(samples, groups, random.Random(seed))) for seed in range(20)}
    assert len(orders) > 1
    for order in orders:
        runs = [groups[s] for s in order]
        assert sorted(order) == samples and len({g for g, prev in zip(runs, [None, *runs]) if g != prev}) == 4
        assert all(list(order).index(a) < list(order).index(b) for a, b in zip(samples, samples[1:])
                   if groups[a] == groups[b])  # each group's samples in their order


def test_every_epoch_deals_whole_task_groups():
    """rl.epochs > 1: each epoch reshuffles the last one's order, and a grouped order keeps every
    task group whole and in its order in every epoch, not only the first."""
    groups = [7, 7, 7, 3, 3, 3, 3, 9, 9, 5, 5, 5]
    orders = epoch_orders(12, groups, 4, 0, 1)
    assert len({tuple(o) for o in orders}) > 1
    for order in orders:
        runs = [groups[i] for i in order]
        assert sorted(order) == list(range(12)) and len({g for g, prev in zip(runs, [None, *runs]) if g != prev}) == 4
        assert all(order.index(a) < order.index(b) for a in range(12) for b in range(a + 1, 12)
                   if groups[a] == groups[b])
    plain, rng, expected = list(range(12)), random.Random(step_seed(0, 1, "shuffle")), []
    for _ in range(4):
        rng.shuffle(plain)
        expected.append(list(plain))
    assert epoch_orders(12, None, 4, 0, 1) == expected  # shuffled: each epoch from the last, as before
    steps = [tuple(epoch_orders(12, groups, 1, 0, step)[0]) for step in range(1, 9)]
    assert len(set(steps)) > 4 and epoch_orders(12, groups, 1, 0, 3)[0] == list(steps[2])  # drawn from (seed, step)


def test_each_step_shuffles_its_samples_into_mini_batches_of_its_own(choice_model_dir, tmp_path, monkeypatch):
    """rl.mini_batch_order shuffled: the order is drawn from the run's seed and the step, so the same
    rollouts learned at step 1 and at step 2 are cut into different mini-batches, and at step 1
    again into the same ones."""
    import twostep

    from agentrl import trainer as trainer_module

    seen, split = [], trainer_module.mini_batch_split

    def recorded(samples, *args):
        chunks = split(samples, *args)
        seen.append([sorted(tuple(s.ids) for s in chunk) for chunk in chunks])
        return chunks

    monkeypatch.setattr(trainer_module, "mini_batch_split", recorded)
    trainer = RLTrainer(twostep.config(tmp_path, mini_batch_size=4), str(choice_model_dir), tmp_path)
    try:
        trajectories = trainer.rollout(1)
        for step in (1, 2, 1):
            trainer.learn(trajectories, step)
    finally:
        trainer.close()
    assert len(seen) == 3 and len(seen[0]) >= 3
    assert seen[0] != seen[1] and seen[0] == seen[2]


def test_grouped_mini_batches_compute_fewer_tokens_on_the_same_rollouts(tiny_model_dir, tmp_path):
    """Mini-batches of whole task groups keep each group's shared prompts together: the same step
    samples, fewer computed tokens."""
    computed = {}
    for order in ("shuffled", "grouped"):
        config = small_config(tmp_path / order, 1, tasks_per_step=4, mini_batch_size=9, mini_batch_order=order)
        with RLTrainer(config, str(tiny_model_dir), tmp_path / order) as trainer:
            metrics = trainer.train_step()
        computed[order] = (metrics["tokens/processed"], metrics["tokens/computed"])
    assert computed["grouped"][0] == computed["shuffled"][0]
    assert computed["grouped"][1] < computed["shuffled"][1]


def test_aux_loss_joins_the_update(tiny_model_dir, tmp_path):
    from agentrl.config import PromptConfig
    from agentrl.data import collect_expert_data
    from agentrl.envs.household import HouseholdEnv

    collect_expert_data(HouseholdEnv(), PromptConfig(template=COMPACT, history_length=1), 2, tmp_path / "j.jsonl", 0)
    judge = {"type": "chat_sft", "name": "judge", "data": str(tmp_path / "j.jsonl"), "batch_size": 4, "weight": 0.5}
    config = small_config(tmp_path, 1, epochs=2, aux=[judge])
    trainer = RLTrainer(config, str(tiny_model_dir), tmp_path)
    aux, prepared, trained = trainer.aux_losses[0], [], []
    prepare, loss = aux.prepare, aux.loss
    aux.prepare = lambda *a: prepared.append(prepare(*a)) or prepared[-1]
    aux.loss = lambda actor, batch: trained.append(batch.n_tokens) or loss(actor, batch)
    try:
        metrics = trainer.train_step()
    finally:
        trainer.close()
    assert metrics["aux/judge/loss"] > 0
    # the aux samples dealt over the mini-batches (more than one here): each trained once an epoch
    assert len(trained) > 2 and sum(trained) == 2 * sum(s.n_targets for s in prepared[0].samples)


def test_an_auxiliary_loss_is_its_weight_times_its_mean_nll_and_draws_anew_each_step(tiny_model_dir):
    """`aux_part` on a chat_sft share: weight x the summed NLL of the share's tokens over every
    rank's aux tokens of the optimiser step; the examples a step trains are drawn afresh each step,
    the same for the same step."""
    from agentrl.actor.single import SingleActor
    from agentrl.config import OptimConfig
    from agentrl.losses.aux import ChatSFTLoss, aux_part
    from agentrl.models import load_model, load_tokenizer
    from agentrl.packing import collate

    tokenizer = load_tokenizer(tiny_model_dir)
    chats = [[{"role": "user", "content": f"put the mug {i} away"}, {"role": "assistant", "content": f"go to shelf {i}"}]
             for i in range(12)]
    aux = ChatSFTLoss("judge", chats, tokenizer, batch_size=3, weight=0.25, seed=0)
    first, second = aux.prepare([], 1).samples, aux.prepare([], 2).samples
    assert first == aux.prepare([], 1).samples and first != second
    actor = SingleActor(load_model(tiny_model_dir), OptimConfig())
    batch = collate(first, tokenizer.pad_token_id)
    out = aux_part(aux, actor, n_tokens=3.0 * batch.n_tokens)(batch)  # a third of the step's aux tokens
    with torch.no_grad():
        nll = -actor.token_logprobs(batch)[0].sum() / (3.0 * batch.n_tokens)
    assert float(nll) > 0
    assert float(out.loss.detach()) == pytest.approx(0.25 * float(nll), rel=1e-5)
    assert float(out.per_update["aux/judge/loss"]) == pytest.approx(float(nll), rel=1e-5)


def test_kl_as_reward_penalty(tiny_model_dir, tmp_path):
    config = small_config(tmp_path / "run", 2, kl_in_reward=True, kl_coef=0.5, kl_estimator="k1")
    run(config, tiny_model_dir)
    rows = read_metrics(tmp_path / "run" / "logs" / "metrics.jsonl")
    assert abs(rows[0]["rollout/kl_penalty"]) < 1e-6  # step 1 samples from the reference itself (0 on CPU)
    assert rows[1]["rollout/kl_penalty"] != 0.0
    assert "actor/kl" not in rows[1]  # not also a loss term


def test_a_half_removed_checkpoint_is_not_resumed_from_and_is_saved_over(tiny_model_dir, tmp_path):
    """A checkpoint whose trainer_state.json is gone (its removal cut short) is not a checkpoint:
    the run resumes from the one before and saves that step again in its place."""
    run(small_config(tmp_path / "run", 2, keep_last=3), tiny_model_dir)
    last = list_checkpoints(tmp_path / "run")[-1]
    (last / "trainer_state.json").unlink()
    run(small_config(tmp_path / "run", 2, keep_last=3), tiny_model_dir, resume=True)
    assert [p.name for p in list_checkpoints(tmp_path / "run")] == ["step_000001", "step_000002"]


def test_ppo_critic_learns_and_resumes_exactly(tiny_model_dir, tmp_path):
    ppo = {"advantage": {"type": "ppo", "critic_lr": 1e-3}}
    straight = tmp_path / "straight"
    run(small_config(straight, 3, **ppo), tiny_model_dir)
    rows = read_metrics(straight / "logs" / "metrics.jsonl")
    assert rows[0]["critic/value_mean"] == 0.0  # zero-initialised head
    assert rows[-1]["critic/value_mean"] != 0.0
    assert all(r["critic/value_loss"] > 0 for r in rows)
    assert (list_checkpoints(straight)[-1] / "critic" / "critic.safetensors").is_file()

    split = tmp_path / "split"
    run(small_config(split, 2, **ppo), tiny_model_dir)
    run(small_config(split, 3, **ppo), tiny_model_dir, resume=True)
    critic_a = load_file(list_checkpoints(straight)[-1] / "critic" / "critic.safetensors")
    critic_b = load_file(list_checkpoints(split)[-1] / "critic" / "critic.safetensors")
    for name in critic_a:
        assert torch.equal(critic_a[name], critic_b[name]), name
    assert strip_timing(rows) == strip_timing(read_metrics(split / "logs" / "metrics.jsonl"))


def test_critic_regresses_to_its_targets(tiny_model_dir):
    import random

    from agentrl.advantages.ppo import PPOConfig
    from agentrl.critic import Critic

    critic = Critic(str(tiny_model_dir), PPOConfig(critic_lr=3e-3, value_clip=100.0))
    prompts, targets = [[5, 6, 7, 8], [9, 10, 11]], [1.0, -2.0]
    assert critic.values(prompts, 100) == [0.0, 0.0]
    for _ in range(60):
        critic.update(prompts, targets, critic.values(prompts, 100), 2, 100, random.Random(0))
    assert critic.values(prompts, 100) == pytest.approx(targets, abs=0.1)
    # Value clipping: V = 0 lies beyond V_old +- 0.05 (V_old = -1 and 1, on the far side from the
    # targets), so the clipped error dominates: 0.5 x mean(1.95^2, 2.95^2), no gradient, V stays 0.
    clipped = Critic(str(tiny_model_dir), PPOConfig(critic_lr=3e-3, value_clip=0.05))
    metrics = clipped.update(prompts, targets, [-1.0, 1.0], 2, 100, random.Random(0))
    assert metrics["value_loss"] == pytest.approx(0.5 * (1.95 ** 2 + 2.95 ** 2) / 2)
    assert metrics["value_clipfrac"] == 1.0 and metrics["grad_norm"] == 0.0
    assert clipped.values(prompts, 100) == [0.0, 0.0]
    # One prompt a mini-batch: two updates, whose metrics are averaged (each sample's own loss).
    metrics = clipped.update(prompts, targets, [-1.0, 1.0], 1, 100, random.Random(0))
    assert metrics["value_loss"] == pytest.approx(0.5 * (1.95 ** 2 + 2.95 ** 2) / 2)
    assert metrics["value_clipfrac"] == 1.0 and metrics["grad_norm"] == 0.0


def test_an_unclipped_value_update_has_the_squared_errors_whole_gradient(tiny_model_dir):
    """Where V = V_old (nothing clipped) the update's gradient is that of 0.5 x mean((V - R)^2),
    measured on an identical critic by hand: the clipped branch's max must not take half of it."""
    from agentrl.advantages.ppo import PPOConfig
    from agentrl.critic import Critic

    prompts, targets = [[5, 6, 7, 8], [9, 10, 11]], [1.0, -2.0]
    config = PPOConfig(critic_lr=3e-3, value_clip=0.2, critic_grad_clip=1e6)
    by_hand = Critic(str(tiny_model_dir), config)
    (0.5 * ((by_hand(prompts) - torch.tensor(targets)) ** 2).mean()).backward()
    norm = torch.sqrt(sum((p.grad ** 2).sum() for p in by_hand.parameters() if p.grad is not None)).item()
    critic = Critic(str(tiny_model_dir), config)
    metrics = critic.update(prompts, targets, critic.values(prompts, 100), 2, 100, random.Random(0))
    assert norm > 0.1 and metrics["value_clipfrac"] == 0.0
    assert metrics["grad_norm"] == pytest.approx(norm, rel=1e-5)


def test_each_critic_mini_batch_steps_on_its_own_gradient(tiny_model_dir):
    """One prompt a mini-batch: each optimiser step's gradient is its own mini-batch's, none carried
    from the one before (a learning rate too small to move float32 weights keeps both gradients
    those of the starting critic, measured by hand)."""
    from agentrl.advantages.ppo import PPOConfig
    from agentrl.critic import Critic

    prompts, targets = [[5, 6, 7, 8], [9, 10, 11]], [1.0, -2.0]
    config = PPOConfig(critic_lr=1e-30, value_clip=100.0, critic_grad_clip=1e6)
    norms = []
    for prompt, target in zip(prompts, targets):
        by_hand = Critic(str(tiny_model_dir), config)
        (0.5 * (by_hand([prompt]) - target) ** 2).sum().backward()
        norms.append(torch.sqrt(sum((p.grad ** 2).sum() for p in by_hand.parameters() if p.grad is not None)).item())
    critic = Critic(str(tiny_model_dir), config)
    metrics = critic.update(prompts, targets, [0.0, 0.0], 1, 100, random.Random(0))
    assert min(norms) > 0.1 and metrics["grad_norm"] == pytest.approx(sum(norms) / 2, rel=1e-5)


def test_the_critics_own_settings_each_change_its_update(tiny_model_dir):
    """critic_grad_clip and critic_weight_decay act on the critic's optimiser step, and a value
    inside the clip range is not counted as clipped."""
    from agentrl.advantages.ppo import PPOConfig
    from agentrl.critic import Critic

    prompts, targets = [[5, 6, 7, 8], [9, 10, 11]], [1.0, -2.0]
    moved = {}
    for clip in (1.0, 1e-12):  # Adam's first step is about lr x sign(g) unless g is clipped far below eps
        critic = Critic(str(tiny_model_dir), PPOConfig(critic_lr=3e-3, value_clip=100.0, critic_grad_clip=clip))
        metrics = critic.update(prompts, targets, [0.0, 0.0], 2, 100, random.Random(0))
        assert metrics["value_clipfrac"] == 0.0  # V = V_old: both errors equal, nothing clipped
        moved[clip] = max(abs(v) for v in critic.values(prompts, 100))
    assert moved[1.0] > 1e-3 and moved[1e-12] < 1e-3 * moved[1.0]
    # A clipped step has no gradient: what AdamW still does is the decay, p <- p (1 - lr x decay).
    critic = Critic(str(tiny_model_dir), PPOConfig(critic_lr=3e-3, value_clip=0.05, critic_weight_decay=0.3))
    before = {k: v.clone() for k, v in critic.body.state_dict().items()}
    critic.update(prompts, targets, [-1.0, 1.0], 2, 100, random.Random(0))
    name, weight = next((k, v) for k, v in critic.body.state_dict().items() if k.endswith("q_proj.weight"))
    torch.testing.assert_close(weight, before[name] * (1 - 3e-3 * 0.3))


def test_a_checkpoint_without_its_critic_is_named(tiny_model_dir, tmp_path):
    from agentrl.advantages.ppo import PPOConfig
    from agentrl.critic import Critic

    critic = Critic(str(tiny_model_dir), PPOConfig())
    (tmp_path / "step_000002" / "critic").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=r"checkpoint .*step_000002 has no critic .*critic.safetensors"):
        critic.load(tmp_path / "step_000002" / "critic")


def test_critic_path_is_the_critics_body(tiny_model_dir, tmp_path):
    from transformers import AutoModel

    from agentrl.components import Context
    from agentrl.critic import critic_components
    from agentrl.models import load_model, load_tokenizer
    from agentrl.recipe import load_config

    other = load_model(tiny_model_dir)
    with torch.no_grad():
        for parameter in other.parameters():
            parameter.add_(0.25)
    other.save_pretrained(tmp_path / "other")
    config = load_config(Path(__file__).resolve().parents[1] / "recipes" / "demo.yaml",
                         [f"run_dir={tmp_path / 'run'}", f"rl.advantage={{type: ppo, critic_path: {tmp_path / 'other'}}}"])
    ctx = Context(config, str(tiny_model_dir), None, None, load_tokenizer(tiny_model_dir), tmp_path / "run")
    [component] = critic_components(config.rl.advantage, ctx)
    expected = AutoModel.from_pretrained(tmp_path / "other").state_dict()
    for name, value in component.critic.body.state_dict().items():
        assert torch.equal(value, expected[name]), name


def test_the_critic_component_regresses_each_step_onto_its_own_return(tiny_model_dir):
    from agentrl.advantages.common import Advantages
    from agentrl.advantages.ppo import PPOConfig
    from agentrl.components import StepBatch
    from agentrl.critic import Critic, CriticComponent
    from agentrl.rollout.types import StepSample, Trajectory

    def step(ids):
        return StepSample(ids, [], [], "", "a", "o", "o")

    trajectories = [Trajectory("t", 0, "k", [step([5, 6, 7, 8])]),
                    Trajectory("t", 0, "k", [step([9, 10, 11]), step([4, 4])])]
    steps = [s for t in trajectories for s in t.steps]
    component = CriticComponent(Critic(str(tiny_model_dir), PPOConfig(critic_lr=3e-3, value_clip=100.0)), 3, 100, 0)
    for number in range(1, 61):
        batch = StepBatch(number, trajectories, steps, [])
        component.score(batch)
        batch.advantages = Advantages([[0.0], [0.0, 0.0]], returns=[[1.0], [-2.0, 0.5]])
        component.after_update(batch)
    assert component.critic.values([s.prompt_ids for s in steps], 100) == pytest.approx([1.0, -2.0, 0.5], abs=0.15)


def test_the_critic_update_does_not_depend_on_its_micro_batches(tiny_model_dir):
    """The token budget splits a mini-batch into micro-batches; the update (weights, metrics) is
    the same as in one piece."""
    import random

    from agentrl.advantages.ppo import PPOConfig
    from agentrl.critic import Critic

    prompts, targets = [[5, 6, 7, 8], [9, 10, 11], [5, 6, 2], [7, 7, 7, 7, 7]], [1.0, -2.0, 0.5, 3.0]
    def flat(critic):
        return torch.cat([p.detach().flatten() for p in critic.parameters()])

    runs = []
    for budget in (100, 5):
        critic = Critic(str(tiny_model_dir), PPOConfig(critic_lr=3e-3, value_clip=100.0))
        before = flat(critic)
        metrics = critic.update(prompts, targets, [0.0] * 4, 4, budget, random.Random(0))
        runs.append((metrics, flat(critic)))
    assert runs[0][0] == pytest.approx(runs[1][0], rel=1e-5)
    assert torch.allclose(runs[0][1], runs[1][1], atol=1e-6) and not torch.equal(runs[0][1], before)
    # and its values, read a chunk at a time, land on their own prompts (a head that reads the state)
    torch.manual_seed(0)
    torch.nn.init.normal_(critic.head.weight, std=0.1)
    whole, chunked = critic.values(prompts, 100), critic.values(prompts, 5)
    assert len(set(whole)) == 4 and chunked == pytest.approx(whole, abs=1e-5)


def test_the_critic_runs_each_distinct_prompt_once_with_the_same_values_and_gradients(tiny_model_dir):
    from agentrl.advantages.ppo import PPOConfig
    from agentrl.critic import Critic

    critic = Critic(str(tiny_model_dir), PPOConfig())
    torch.manual_seed(0)  # (unseeded, the head's draw followed whatever the worker ran before)
    torch.nn.init.normal_(critic.head.weight, std=0.1)  # a value head that reads the hidden state
    prompts = [[5, 6, 7, 8], [9, 10, 11], [5, 6, 7, 8], [5, 6, 7, 8]]
    weights = torch.tensor([1.0, -2.0, 0.5, 3.0])
    seen = []
    hook = critic.body.register_forward_pre_hook(lambda module, args, kwargs: seen.append(kwargs["input_ids"].shape[0]),
                                                 with_kwargs=True)
    together = critic(prompts)
    hook.remove()
    assert seen == [2]  # two distinct prompts
    (together * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in critic.named_parameters()}
    critic.zero_grad()
    alone = torch.stack([critic([p])[0] for p in prompts])
    (alone * weights).sum().backward()
    # equal up to float32 summation order (measured over 40 head draws: at most 1.1e-6 apart on
    # values of about 1, gradients 2.3e-6 of their largest element)
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-5)
    for name, param in critic.named_parameters():
        torch.testing.assert_close(grads[name], param.grad, atol=2e-5 * float(param.grad.abs().max()), rtol=0, msg=name)
    assert together[0] == together[2] == together[3] != together[1]
    with torch.no_grad():  # V(s): the head on the body's hidden state at the prompt's last token
        for ids, value in zip(prompts, together):
            last = critic.body(input_ids=torch.tensor([ids])).last_hidden_state[0, -1]
            assert critic.head(last).item() == pytest.approx(value.item(), abs=1e-5)


def test_nthr_runs_inside_the_update(tiny_model_dir, tmp_path):
    config = small_config(tmp_path, 1, components=[{"type": "nthr", "tau": 1.0, "eta": 0.5}])
    trainer = RLTrainer(config, str(tiny_model_dir), tmp_path)
    try:
        metrics = trainer.train_step()
    finally:
        trainer.close()
    assert 0.0 <= metrics["nthr/downweighted_share"] <= 1.0 and "timing_s/nthr" in metrics
    assert "timing_s/advantage" in metrics


def test_coupling_lab_metrics_join_the_step_metrics_on_its_steps(tiny_model_dir, tmp_path):
    """The coupling lab every 2 steps measures the coupling on the even steps' own labelled rollouts (here
    the household's expert and a random player, whose moves the environment labels), and its
    numbers are among the metrics the step reports (and the run logs), not only computed."""
    from agentrl.config import PromptConfig
    from agentrl.data import play
    from agentrl.envs import make_env
    from agentrl.envs.household.env import HouseholdEnvConfig
    from agentrl.prompting import encode_prompt

    env, rng = make_env(HouseholdEnvConfig()), random.Random(1)
    config = small_config(tmp_path, 2, components=[{"type": "coupling", "every": 2}], old_logprobs="actor")
    with RLTrainer(config, str(tiny_model_dir), tmp_path) as trainer:
        def played(step):
            trajectories = []
            for i, task in enumerate(env.split_tasks("train")[:4]):
                expert = i % 2 == 1
                t = play(env, task, PromptConfig(template=COMPACT, history_length=1),
                         lambda obs: env.expert_action()[1] if expert else rng.choice(obs.admissible_actions))  # noqa: B023
                t.group_id = (step - 1) * 2 + i // 2
                for s in t.steps:
                    s.response = f"<think>ok</think><action>{s.action}</action>"
                    s.prompt_ids = encode_prompt(trainer.tokenizer, s.prompt)
                    s.response_ids = trainer.tokenizer(s.response, add_special_tokens=False).input_ids
                    s.logprobs = [0.0] * len(s.response_ids)
                trajectories.append(t)
            return trajectories

        first, second = trainer.learn(played(1), 1), trainer.learn(played(2), 2)
    assert not any(k.startswith("coupling/") for k in first)
    assert {"coupling/grad_cos_pos_neg", "coupling/influence_gap", "coupling/separation"} <= set(second)
    assert -1 <= second["coupling/grad_cos_pos_neg"] <= 1


def test_vllm_sampler_without_vllm_names_the_fix(tiny_model_dir, tmp_path):
    import importlib.util
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed (tests/test_vllm.py covers it)")
    with pytest.raises(ImportError, match=r"rl\.sampler\.type: vllm needs vLLM.*make vllm-env"):
        RLTrainer(small_config(tmp_path, 1, sampler={"type": "vllm"}), str(tiny_model_dir), tmp_path)


# --- what the trainer itself decides, on the two-step task (tests/twostep.py) ----------------------
def trajectories_to_json(trajectories) -> str:
    import dataclasses
    return json.dumps([dataclasses.asdict(t) for t in trajectories])


def trajectories_from_json(text: str):
    from agentrl.rollout.types import StepSample, Trajectory
    return [Trajectory(**{**t, "steps": [StepSample(**s) for s in t["steps"]]}) for t in json.loads(text)]


def flat_weights(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def largest_change(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max((a[n] - b[n]).abs().max().item() for n in a)


@contextlib.contextmanager
def gloo_rank(rank, world, port):
    """This process as `rank` of a gloo group of `world` on 127.0.0.1:`port`, as a launcher sets it up."""
    import os

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()


@leaves_like_a_launched_rank
def two_rank_learn(rank, world, port, model_dir, out_dir, rl=None):
    import twostep

    with gloo_rank(rank, world, port):
        config = twostep.config(out_dir, **AGGREGATION_RL, **(rl or {}), actor={"backend": "fsdp2"})
        trainer = RLTrainer(config, model_dir, Path(out_dir) / f"rank{rank}")
        trajectories = trainer.rollout(1)
        (Path(out_dir) / f"trajectories{rank}.json").write_text(trajectories_to_json(trajectories))
        metrics = trainer.learn(trajectories, 1)
        state = trainer.actor.full_state_dict()
        if rank == 0:
            from safetensors.torch import save_file
            save_file({k: v.contiguous() for k, v in state.items()}, f"{out_dir}/weights.safetensors")
            (Path(out_dir) / "metrics.json").write_text(json.dumps(metrics))
        trainer.close()


# Adam's first step is lr x sign(g): float noise in a tiny gradient element can flip it, so lr is
# small and the gradient itself is compared through grad_norm. The entropy bonus and the KL term
# carry the same aggregation weights as the policy-gradient term.
AGGREGATION_RL = {"tasks_per_step": 2, "group_size": 4, "kl_coef": 0.05, "entropy_coef": 0.01,
                  "optim": {"lr": 1e-4}}


def two_ranks_against_one_process(model_dir, tmp_path, extra: dict | None = None):
    """Two FSDP2 ranks each play and learn one step; one process learns from both ranks'
    trajectories with the same settings. Asserts the weights match; returns the ranks'
    trajectories and the two processes' metrics (sharded, single)."""
    import torch.multiprocessing as mp
    import twostep
    from test_distributed import free_port

    mp.spawn(two_rank_learn, args=(2, free_port(), str(model_dir), str(tmp_path), extra), nprocs=2)
    ranks = [trajectories_from_json((tmp_path / f"trajectories{r}.json").read_text()) for r in (0, 1)]
    trainer = RLTrainer(twostep.config(tmp_path / "single", **AGGREGATION_RL, **(extra or {})), str(model_dir),
                        tmp_path / "single")
    try:
        metrics = trainer.learn(ranks[0] + ranks[1], 1)
        single = dict(trainer.model.state_dict())
    finally:
        trainer.close()
    for name, value in load_file(tmp_path / "weights.safetensors").items():
        assert torch.allclose(value, single[name], atol=2e-5, rtol=0), name
    return ranks, json.loads((tmp_path / "metrics.json").read_text()), metrics


def test_two_ranks_update_like_one_process_through_the_trainer(choice_model_dir, tmp_path):
    """Each rank plays one task group with its own token count; the loss is aggregated over the
    global counts, so the update equals one process learning from both groups."""
    ranks, sharded, metrics = two_ranks_against_one_process(choice_model_dir, tmp_path)
    tokens = [sum(len(s.response_ids) for t in share for s in t.steps) for share in ranks]
    assert tokens[0] != tokens[1]  # unequal shares: a rank-local count would weigh them differently
    for key in ("actor/grad_norm", "actor/pg_loss", "actor/entropy", "actor/kl", "tokens/response"):
        assert sharded[key] == pytest.approx(metrics[key], rel=1e-4, abs=1e-7), key


def test_an_auxiliary_loss_on_two_ranks_updates_like_one_process(choice_model_dir, tmp_path):
    """Each rank draws the same chat examples for `chat_sft`; its loss is normalised by every rank's
    tokens of it, so the update equals one process's (a rank-local count would count them twice)."""
    import twostep

    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"pick {i}"},
                                                      {"role": "assistant", "content": twostep.response("ab"[i % 2])}]})
                            + "\n" for i in range(6)))
    aux = {"aux": [{"type": "chat_sft", "data": str(data), "batch_size": 4, "weight": 1.0}]}
    _, sharded, metrics = two_ranks_against_one_process(choice_model_dir, tmp_path, aux)
    assert metrics["aux/sft/loss"] > 0.1
    for key in ("actor/grad_norm", "aux/sft/loss"):
        assert sharded[key] == pytest.approx(metrics[key], rel=1e-4), key


def test_aborted_groups_are_left_out_of_the_update(choice_model_dir, tmp_path):
    """An update with an aborted episode equals the update in which its group never ran."""
    import copy

    import twostep

    def learn(trajectories):
        trainer = RLTrainer(config, str(choice_model_dir), tmp_path)
        try:
            metrics = trainer.learn(copy.deepcopy(trajectories), 1)
            return flat_weights(trainer.model), metrics
        finally:
            trainer.close()

    config = twostep.config(tmp_path, tasks_per_step=3)
    trainer = RLTrainer(config, str(choice_model_dir), tmp_path)
    initial = flat_weights(trainer.model)
    try:
        played = trainer.rollout(1)
    finally:
        trainer.close()
    crashed = copy.deepcopy(played)
    victim = next(t for t in crashed if t.group_id == 1)
    victim.aborted, victim.steps = True, victim.steps[:1]  # its worker died after one step

    with_abort, metrics = learn(crashed)
    without_group, _ = learn([t for t in played if t.group_id != 1])
    everything, _ = learn(played)
    # Two updates on the same samples can differ in the last bits (seen: 1.9e-9, in one run of
    # three under load, the process's first update); a group more or less moves them by ~1e-3.
    assert metrics["rollout/aborted"] == 1 and metrics["rollout/dropped_groups"] == 1
    assert largest_change(with_abort, without_group) < 1e-6
    assert largest_change(with_abort, initial) > 1e-4  # the other groups trained
    assert largest_change(everything, without_group) > 1e-4  # group 1 mattered


def test_balance_task_types_draws_each_steps_tasks_a_type_at_a_time(tiny_model_dir, tmp_path):
    """rl.balance_task_types: a step's tasks are the by-type draw of the step's seed (the draw
    itself is tested on ScienceWorld's lopsided pool), the plain draw otherwise."""
    from agentrl.envs.base import sample_tasks
    from agentrl.seeding import step_seed

    for balance in (False, True):
        config = small_config(tmp_path / str(balance), 1, tasks_per_step=6, group_size=1, balance_task_types=balance)
        trainer = RLTrainer(config, str(tiny_model_dir), Path(config.run_dir))
        try:
            played = [t.task_id for t in trainer.rollout(1)]
            drawn = sample_tasks(trainer.pool.local, "train", 6, random.Random(step_seed(3, 1, "tasks")), by_type=balance)
            other = sample_tasks(trainer.pool.local, "train", 6, random.Random(step_seed(3, 1, "tasks")), by_type=not balance)
        finally:
            trainer.close()
        assert played == drawn != other


def test_differing_groups_are_those_with_unequal_returns_and_no_aborted_episode():
    from agentrl.rollout.types import StepSample, Trajectory, differing_groups

    def episode(group, reward, aborted=False):
        return Trajectory("t", group, "k", [StepSample([], [], [], "", "a", "o", "o", reward=reward)], aborted=aborted)

    played = [episode(4, 1.0), episode(4, 0.0), episode(5, 1.0), episode(5, 0.0, aborted=True),
              episode(6, 1.0), episode(6, 1.0), episode(2, 0.0), episode(2, 0.1 + 0.2 - 0.3 + 1e-12)]
    assert differing_groups(played) == [4]


def test_every_round_of_tasks_is_drawn_apart_and_by_type_when_balanced(tiny_model_dir, tmp_path):
    """A step's rounds of tasks (rl.rollout.filter_groups draws more): each from (seed, step,
    round, rank), round 0 shared by the ranks, and every round by type with rl.balance_task_types."""
    from agentrl.envs.base import sample_tasks
    from agentrl.envs.household import HouseholdEnv
    from agentrl.rollout.collect import draw_tasks

    env = HouseholdEnv()
    for balance in (False, True):
        config = small_config(tmp_path, 1, balance_task_types=balance)
        rounds = [draw_tasks(env, config, 5, draw, 1, 6) for draw in range(4)]
        assert len({tuple(r) for r in rounds}) == 4 and draw_tasks(env, config, 5, 0, 0, 6) == rounds[0]
        assert draw_tasks(env, config, 5, 2, 0, 6) != rounds[2]  # a later round: the rank's own
        for draw, tasks in enumerate(rounds):
            key = "tasks" if draw == 0 else f"tasks:{draw}:1"
            assert tasks == sample_tasks(env, "train", 6, random.Random(step_seed(3, 5, key)), by_type=balance) \
                != sample_tasks(env, "train", 6, random.Random(step_seed(3, 5, key)), by_type=not balance)


def test_filter_groups_draws_more_tasks_and_trains_only_groups_whose_returns_differ(choice_model_dir, tmp_path):
    """rl.rollout.filter_groups (DAPO's dynamic sampling): the step draws rounds of tasks until
    tasks_per_step groups differ in return; its update equals the update on the first
    tasks_per_step of those alone, and a step where none differs leaves the weights as they were."""
    import copy

    import twostep

    from agentrl.rollout.types import differing_groups

    filtering = {"rollout": {"filter_groups": {"max_draws": 6}}}

    def learn(trajectories, **rl):
        trainer = RLTrainer(twostep.config(tmp_path, tasks_per_step=2, **rl), str(choice_model_dir), tmp_path)
        try:
            metrics = trainer.learn(copy.deepcopy(trajectories), 1)
            return flat_weights(trainer.model), metrics
        finally:
            trainer.close()

    trainer = RLTrainer(twostep.config(tmp_path, tasks_per_step=2, **filtering), str(choice_model_dir), tmp_path)
    initial = flat_weights(trainer.model)
    try:
        played = trainer.rollout(3)  # a step (of this seed) whose draws show both
        draws = trainer.draws
    finally:
        trainer.close()
    differing = differing_groups(played)
    groups = {t.group_id for t in played}
    assert draws > 1 and len(groups) > 2  # the first draw had a group whose returns were all the same
    assert len(differing) > 2  # and the last draw overshot: only the first 2 may train
    first = [t for t in played if t.group_id in differing[:2]]

    filtered, metrics = learn(played, **filtering)
    alone, _ = learn(first)
    assert metrics["rollout/uniform_groups"] == len(groups) - len(differing) > 0
    assert largest_change(filtered, alone) < 1e-6
    assert largest_change(filtered, initial) > 1e-4

    uniform = [t for t in played if t.group_id not in differing]
    untouched, metrics = learn(uniform, **filtering)
    assert metrics["rollout/uniform_groups"] == len(groups) - len(differing)
    assert largest_change(untouched, initial) == 0


def test_the_counts_of_a_rollout_by_hand():
    """Of three groups, one has differing returns, one the same return throughout and one an
    aborted episode: one uniform group (no group-relative advantage) and one dropped; the
    dropped one is not also counted uniform, whatever its returns. Success is a rate per task
    type, and the response length a mean over step samples of their own tokens."""
    from agentrl.rollout.types import StepSample, Trajectory
    from agentrl.trainer import rollout_metrics

    def episode(group, reward, aborted=False, kind="pick", response=(2,)):
        step = StepSample([1, 1], list(response), [0.0] * len(response), response="look", action="look",
                          observation="o", anchor="o", reward=reward)
        return Trajectory(f"train-{group}", group, kind, [step], success=reward > 0, aborted=aborted)

    played = [episode(0, 1.0, kind="clean"), episode(0, 0.0, kind="clean", response=(2, 3, 4, 5)),
              episode(1, 0.0), episode(1, 0.0), episode(2, 0.0), episode(2, 0.0, aborted=True)]
    metrics = rollout_metrics(played)
    assert (metrics["rollout/uniform_groups"], metrics["rollout/dropped_groups"]) == (1.0, 1.0)
    assert (metrics["rollout/success/clean"], metrics["rollout/success/pick"]) == (0.5, 0.0)
    assert metrics["rollout/success"] == pytest.approx(1 / 6)
    assert metrics["rollout/response_tokens"] == pytest.approx(9 / 6)


def test_advantage_metrics_by_hand():
    from agentrl.trainer import advantage_metrics

    metrics = advantage_metrics([3.0, -1.0, 0.0, 1.0, -2.0])
    # quartiles at ranks 1.5 and 4.5 of the sorted five (-2, -1, 0, 1, 3): -1.5 and 2
    assert metrics["adv/iqr"] == pytest.approx(3.5) and metrics["adv/mean"] == pytest.approx(0.2)
    assert metrics["adv/std"] == pytest.approx(math.sqrt(14.8 / 4)) and metrics["adv/frac_abs_gt1"] == 0.4
    assert advantage_metrics([1.0]) == {}

def test_kl_in_reward_adds_each_actions_kl_to_its_penalty(choice_model_dir, tmp_path):
    """kl_coef x the summed per-token k3 KL(sampler || reference) joins the step's penalty, so
    within a task group (equal episode rewards) a step with more KL gets a lower advantage."""
    import twostep

    from agentrl.packing import TrainSample, collate
    from agentrl.forward import response_logprobs
    from agentrl.losses.policy import kl_k3

    config = twostep.config(tmp_path, temperature=0.8, kl_coef=0.5, kl_in_reward=True, kl_estimator="k3")
    trainer = RLTrainer(config, str(choice_model_dir), tmp_path)
    try:
        trajectories = played_off_reference(trainer)
        invalid = {id(s): 0.0 if s.valid else config.prompt.invalid_penalty for t in trajectories for s in t.steps}
        metrics = trainer.learn(trajectories, 1)
        penalties = []
        for t in trajectories:
            for s in t.steps:
                batch = collate([TrainSample.from_turn(s.prompt_ids, s.response_ids)], trainer.tokenizer.pad_token_id)
                with torch.no_grad():
                    ref, _ = response_logprobs(trainer.component("ref").reference, batch, config.sampling.temperature)
                kl = kl_k3(torch.tensor(s.logprobs), ref).sum().item()
                assert kl > 0
                assert s.penalty == pytest.approx(invalid[id(s)] + 0.5 * kl, rel=1e-4)
                penalties.append(0.5 * kl)
    finally:
        trainer.close()
    assert metrics["rollout/kl_penalty"] == pytest.approx(sum(penalties) / len(penalties), rel=1e-4)  # per action
    for group in {t.group_id for t in trajectories}:
        for reward in {t.episode_reward for t in trajectories}:
            steps = sorted((s for t in trajectories if t.group_id == group and t.episode_reward == reward
                            for s in t.steps), key=lambda s: s.penalty)
            assert [s.advantage for s in steps] == sorted((s.advantage for s in steps), reverse=True)


def test_a_kl_in_the_loss_is_not_also_a_reward_penalty(choice_model_dir, tmp_path):
    """rl.kl_in_reward: false puts the KL in the loss only: the steps keep their own penalties."""
    import twostep

    config = twostep.config(tmp_path, temperature=0.8, kl_coef=0.5, kl_in_reward=False, kl_estimator="k3")
    trainer = RLTrainer(config, str(choice_model_dir), tmp_path)
    try:
        trajectories = played_off_reference(trainer)
        metrics = trainer.learn(trajectories, 1)
    finally:
        trainer.close()
    for s in (s for t in trajectories for s in t.steps):
        assert s.penalty == (0.0 if s.valid else config.prompt.invalid_penalty)
    assert "rollout/kl_penalty" not in metrics and metrics["actor/kl"] > 0


def test_the_reported_entropy_is_the_policys_mean_over_the_trained_tokens(choice_model_dir, tmp_path):
    """actor/entropy is the mean per-token entropy of the policy (at the sampling temperature) over
    the step's response tokens, whatever weights the loss gives them (one mini-batch, one epoch: the
    weights that scored them are the ones that sampled)."""
    import twostep

    from agentrl.forward import response_logprobs
    from agentrl.packing import TrainSample, collate

    config = twostep.config(tmp_path, temperature=0.8, loss_agg="seq-mean-token-mean")
    trainer = RLTrainer(config, str(choice_model_dir), tmp_path)
    try:
        trajectories = trainer.rollout(1)
        total, tokens = 0.0, 0
        for s in (s for t in trajectories for s in t.steps):
            batch = collate([TrainSample.from_turn(s.prompt_ids, s.response_ids)], trainer.tokenizer.pad_token_id)
            with torch.no_grad():
                _, entropy = response_logprobs(trainer.model, batch, 0.8, entropy=True)
            total, tokens = total + entropy.sum().item(), tokens + len(s.response_ids)
        metrics = trainer.learn(trajectories, 1)
    finally:
        trainer.close()
    assert tokens > 20 and metrics["actor/entropy"] == pytest.approx(total / tokens, rel=1e-4)


def test_a_steps_token_counts_and_generation_throughput_by_hand(choice_model_dir, tmp_path):
    """With 2 epochs: tokens/response is the step's response tokens once, tokens/processed every
    token of every epoch, and generation throughput the generated tokens over the time of `gen`."""
    import twostep

    config = twostep.config(tmp_path, epochs=2)
    trainer = RLTrainer(config, str(choice_model_dir), tmp_path)
    try:
        trajectories = trainer.rollout(1)
        metrics = trainer.learn(trajectories, 1, {"gen": 4.0, "env": 1.0})
    finally:
        trainer.close()
    steps = [s for t in trajectories for s in t.steps]
    responses = sum(len(s.response_ids) for s in steps)
    assert metrics["tokens/response"] == responses
    assert metrics["tokens/processed"] == 2 * sum(len(s.prompt_ids) + len(s.response_ids) for s in steps)
    assert metrics["throughput/gen_tokens_per_s"] == pytest.approx(responses / 4.0)


def test_a_part_timed_twice_in_a_step_counts_both_times():
    """A component's hooks (the critic's score and after_update) add up in its timing_s entry."""
    import time

    from agentrl.components import timed

    timing = {"critic": 1.0}
    for seconds in (0.05, 0.1):
        with timed(timing, "critic"):
            time.sleep(seconds)
    assert timing["critic"] >= 1.15


def test_the_kl_reference_is_loaded_in_the_runs_dtype(choice_model_dir, tmp_path):
    """A bfloat16 run starts with its reference equal to its policy, log-prob for log-prob: a
    float32 reference would differ from it by bfloat16's rounding, a KL made by the dtype."""
    import twostep

    from agentrl.forward import response_logprobs
    from agentrl.packing import TrainSample, collate

    config = twostep.config(tmp_path, kl_coef=0.5)
    config.model = config.model.model_copy(update={"dtype": "bfloat16"})
    with RLTrainer(config, str(choice_model_dir), tmp_path) as trainer:
        prompt = trainer.tokenizer(twostep.first_prompt()).input_ids
        answer = trainer.tokenizer(twostep.response(twostep.GOOD)).input_ids
        batch = collate([TrainSample.from_turn(prompt, answer)], trainer.tokenizer.pad_token_id)
        with torch.no_grad():
            policy, _ = response_logprobs(trainer.model, batch, 1.0)
            reference, _ = response_logprobs(trainer.component("ref").reference, batch, 1.0)
    assert torch.equal(policy, reference)


def test_the_kl_reference_under_lora_is_the_frozen_base_model(choice_model_dir, tmp_path):
    """With LoRA there is no second copy: the reference is the policy with its adapters off. The
    KL penalty is measured against the base model as loaded, not against the adapted policy."""
    import twostep

    from agentrl.packing import TrainSample, collate
    from agentrl.forward import response_logprobs
    from agentrl.losses.policy import kl_k3
    from agentrl.models import load_model

    config = twostep.config(tmp_path, temperature=0.8, kl_coef=0.5, kl_in_reward=True, kl_estimator="k3",
                            actor={"lora": {"r": 4, "alpha": 8}})
    base = load_model(str(choice_model_dir)).eval()
    with RLTrainer(config, str(choice_model_dir), tmp_path) as trainer:
        torch.manual_seed(0)
        with torch.no_grad():  # the adapters leave B = 0: the policy leaves its base
            for name, p in trainer.model.named_parameters():
                if "lora_B" in name:
                    p.add_(0.5 * torch.randn_like(p))
        trajectories = trainer.rollout(1)
        invalid = {id(s): 0.0 if s.valid else config.prompt.invalid_penalty for t in trajectories for s in t.steps}
        trainer.learn(trajectories, 1)
    kls = []
    for s in (s for t in trajectories for s in t.steps):
        batch = collate([TrainSample.from_turn(s.prompt_ids, s.response_ids)], 0)
        with torch.no_grad():
            ref, _ = response_logprobs(base, batch, config.sampling.temperature)
        kls.append(kl_k3(torch.tensor(s.logprobs), ref).sum().item())
        assert s.penalty == pytest.approx(invalid[id(s)] + 0.5 * kls[-1], rel=1e-4, abs=1e-6)
    assert sum(kls) / len(kls) > 1e-3  # the adapted policy is measurably away from its base


def test_entropy_bonus_raises_the_entropy(choice_model_dir, tmp_path):
    """With every advantage zero (one rollout per task, trajectory-level GRPO), the entropy
    bonus alone drives the update, and it must make the policy less certain."""
    import twostep

    from agentrl.packing import TrainSample, collate
    from agentrl.forward import response_logprobs

    config = twostep.config(tmp_path, group_size=1, tasks_per_step=4, entropy_coef=0.5,
                            advantage={"type": "grpo", "level": "trajectory"})
    trainer = RLTrainer(config, str(choice_model_dir), tmp_path)

    def entropy() -> float:
        with torch.no_grad():
            _, ent = response_logprobs(trainer.model, batch, 1.0, entropy=True)
        return ent.mean().item()

    try:
        trajectories = trainer.rollout(1)
        batch = collate([TrainSample.from_turn(s.prompt_ids, s.response_ids) for t in trajectories for s in t.steps],
                        trainer.tokenizer.pad_token_id)
        before = entropy()
        trainer.learn(trajectories, 1)
        after = entropy()
    finally:
        trainer.close()
    assert all(s.advantage == 0.0 for t in trajectories for s in t.steps)
    assert after > before + 1e-3, (before, after)


def test_kl_loss_term_pulls_the_policy_back_to_its_reference(choice_model_dir, tmp_path):
    """With every advantage zero and the policy moved off its reference, the KL loss term alone
    drives the update, and it must bring the policy closer to the reference."""
    import twostep

    from agentrl.packing import TrainSample, collate
    from agentrl.forward import response_logprobs
    from agentrl.losses.policy import kl_k3

    # Adam's first step moves every weight by lr: small, so the first-order pull dominates.
    config = twostep.config(tmp_path, group_size=1, tasks_per_step=4, kl_coef=1.0, kl_estimator="k3",
                            advantage={"type": "grpo", "level": "trajectory"}, optim={"lr": 1e-5})
    trainer = RLTrainer(config, str(choice_model_dir), tmp_path)
    reference = trainer.component("ref").reference

    def kl() -> float:
        with torch.no_grad():
            logp, _ = response_logprobs(trainer.model, batch)
            ref, _ = response_logprobs(reference, batch)
        return kl_k3(logp, ref).mean().item()

    try:
        trajectories = played_off_reference(trainer)
        batch = collate([TrainSample.from_turn(s.prompt_ids, s.response_ids) for t in trajectories for s in t.steps],
                        trainer.tokenizer.pad_token_id)
        before = kl()
        metrics = trainer.learn(trajectories, 1)
        after = kl()
    finally:
        trainer.close()
    assert all(s.advantage == 0.0 for t in trajectories for s in t.steps)
    assert metrics["actor/kl"] > 0
    assert after < 0.98 * before, (before, after)


def test_steps_carry_the_environments_anchor_and_the_sampled_tokens(choice_model_dir, tmp_path):
    """GiGPO / GAGPO group steps by the environment's anchor state (the rendered prompt holds
    history, so two routes into one room would never share a prompt); the trained response is
    the sampled token ids with their end-of-turn token, the prompt the encoded prompt text."""
    import twostep

    from agentrl.prompting import encode_prompt

    trainer = RLTrainer(twostep.config(tmp_path), str(choice_model_dir), tmp_path)
    try:
        trajectories = trainer.rollout(1)
    finally:
        trainer.close()
    steps = [s for t in trajectories for s in t.steps]
    for s in steps:
        room = s.observation.removeprefix("You are in the ").removesuffix(".")
        assert s.anchor == f"room:{room}"
        assert s.prompt_ids == encode_prompt(trainer.tokenizer, s.prompt)
        assert len(s.logprobs) == len(s.response_ids)
        assert trainer.tokenizer.decode(s.response_ids, skip_special_tokens=True) == s.response
    assert {s.anchor for s in steps} >= {"room:hall", "room:corridor", "room:cellar"}
    # The fine-tuned model ends its answers: the end-of-turn token is part of what is trained.
    assert sum(s.response_ids[-1] == trainer.tokenizer.eos_token_id for s in steps) >= len(steps) // 2


def test_finished_episodes_stop_playing(choice_model_dir, tmp_path):
    """An episode the environment ends is never stepped again, though the step limit allows more."""
    from typing import Literal

    import twostep

    from agentrl.config import Section
    from agentrl.envs.base import StepResult
    from agentrl.registry import ENVIRONMENTS

    class OneStepConfig(Section):
        type: Literal["onestep"] = "onestep"

    class OneStepEnv(twostep.TwoStepEnv):
        max_steps = 3

        def step(self, action):
            self.steps += 1
            return StepResult(self._observation(), 10.0 if action == twostep.GOOD else 0.0, True, action == twostep.GOOD)

    if "onestep" not in ENVIRONMENTS.names():
        ENVIRONMENTS.register("onestep", OneStepConfig, OneStepEnv)
    config = twostep.config(tmp_path)
    config.env = OneStepConfig()
    with RLTrainer(config, str(choice_model_dir), tmp_path) as trainer:
        trajectories = trainer.rollout(1)
    assert [t.length for t in trajectories] == [1] * 8
    assert {t.success for t in trajectories} == {True, False}


def test_ppo_critic_regresses_onto_the_step_returns(choice_model_dir, tmp_path):
    """The critic's targets are the GAE returns (A + V): after fitting one batch, its value of the
    corridor (half the answers there succeed: return about 5) is far above the cellar's (0);
    fitted to the whitened advantages instead, neither would leave [-2, 2]."""
    import twostep

    from agentrl.prompting import encode_prompt

    config = twostep.config(tmp_path, advantage={"type": "ppo", "critic_lr": 3e-3, "critic_epochs": 30,
                                                 "value_clip": 100.0, "lam": 1.0, "gamma": 1.0})
    trainer = RLTrainer(config, str(choice_model_dir), tmp_path)
    try:
        trajectories = trainer.rollout(1)
        trainer.learn(trajectories, 1)
        steps = {s.anchor: s for t in trajectories for s in t.steps}
        corridor, cellar = trainer.component("critic").critic.values([encode_prompt(trainer.tokenizer, steps[room].prompt)
                                                  for room in ("room:corridor", "room:cellar")], 10**4)
    finally:
        trainer.close()
    returns = [t.episode_reward for t in trajectories if t.steps[0].action == twostep.GOOD]
    assert 0 < sum(returns) < 10 * len(returns)  # both outcomes from the corridor
    assert corridor > 2.5 and abs(cellar) < 1.0, (corridor, cellar)


class OverconfidentSampler:
    """The trainer's real sampler, reporting every sampled token `shift` nats more likely than it
    was (what a sampler with other numerics, or a stale copy of the weights, looks like)."""

    def __init__(self, sampler, shift: float = 0.5):
        self.sampler, self.shift = sampler, shift

    def generate(self, prompts, params):
        generations = self.sampler.generate(prompts, params)
        for g in generations:
            g.logprobs = [x + self.shift for x in g.logprobs]
        return generations

    def update_weights(self, weights):
        self.sampler.update_weights(weights)

    def sleep(self):
        self.sampler.sleep()


@leaves_like_a_launched_rank
def two_rank_gap(rank, world, port, model_dir, out_dir):
    """rl.old_logprobs: actor on 2 ranks whose samplers differ: rank 1's overstates its tokens by
    0.5 nats, rank 0's is honest."""
    import twostep

    with gloo_rank(rank, world, port):
        config = twostep.config(out_dir, 2, temperature=0.8, old_logprobs="actor", actor={"backend": "fsdp2"})
        trainer = RLTrainer(config, model_dir, Path(out_dir) / f"rank{rank}")
        trainer.sampler = OverconfidentSampler(trainer.sampler, 0.5 * rank)
        trajectories = trainer.rollout(1)
        tokens = sum(len(s.response_ids) for t in trajectories for s in t.steps)
        metrics = trainer.learn(trajectories, 1)
        (Path(out_dir) / f"gap{rank}.json").write_text(json.dumps({"tokens": tokens, **metrics}))
        trainer.close()


def test_the_gap_of_actor_old_logprobs_is_every_ranks(choice_model_dir, tmp_path):
    """With the actor's old log-probs the gap is taken over every rank's sampled tokens: each rank
    reports the token-weighted mean of both ranks' gaps and the largest of either."""
    import torch.multiprocessing as mp
    from test_distributed import free_port

    mp.spawn(two_rank_gap, args=(2, free_port(), str(choice_model_dir), str(tmp_path)), nprocs=2)
    ranks = [json.loads((tmp_path / f"gap{r}.json").read_text()) for r in (0, 1)]
    expected = 0.5 * ranks[1]["tokens"] / (ranks[0]["tokens"] + ranks[1]["tokens"])
    for metrics in ranks:
        assert metrics["rollout/logprob_diff_mean"] == pytest.approx(expected, abs=1e-4)
        assert metrics["rollout/logprob_diff_max"] == pytest.approx(0.5, abs=1e-4)


def test_the_sampler_actor_gap_is_measured_before_the_weights_move(choice_model_dir, tmp_path):
    """With 4 mini-batches the weights move within the step: the gap, measured in the first
    optimiser step's forward passes (no pass of its own), stays at float noise, while the later
    mini-batches' ratios see the moved weights."""
    import twostep

    config = twostep.config(tmp_path, 1, mini_batch_size=4, optim={"lr": 5e-2})
    with RLTrainer(config, str(choice_model_dir), Path(config.run_dir)) as trainer:
        metrics = trainer.train_step()
    assert metrics["rollout/logprob_diff_max"] < 1e-4 and metrics["rollout/kl_sampler_actor"] < 1e-6
    assert abs(metrics["actor/kl_old"]) > 1e-3, metrics["actor/kl_old"]  # the later mini-batches moved
    assert "timing_s/actor_logprobs" not in metrics


def test_sampler_actor_gap_is_measured_and_old_logprobs_and_tis_follow_the_choice(choice_model_dir, tmp_path):
    import twostep

    def first_step(**rl):
        config = twostep.config(tmp_path / str(len(rl)), 2, temperature=0.8, **rl)  # scored at T 0.8
        with RLTrainer(config, str(choice_model_dir), Path(config.run_dir)) as trainer:
            honest = trainer.learn(trainer.rollout(1), 1)
            trainer.sampler = OverconfidentSampler(trainer.sampler)
            return honest, trainer.learn(trainer.rollout(2), 2)

    honest, off = first_step()
    assert honest["rollout/logprob_diff_max"] < 1e-4 and honest["rollout/kl_sampler_actor"] < 1e-6
    two_epochs, _ = first_step(epochs=2)  # measured before the first optimiser step only, not after it
    assert two_epochs["rollout/logprob_diff_max"] < 1e-4 and two_epochs["actor/grad_norm"] > 1e-3
    assert off["rollout/logprob_diff_mean"] == pytest.approx(0.5, abs=1e-4)
    assert off["rollout/kl_sampler_actor"] == pytest.approx(math.exp(-0.5) - 1 + 0.5, abs=1e-4)
    assert off["actor/kl_old"] == pytest.approx(0.5, abs=1e-3)  # the PPO ratio sees the gap

    honest_actor, actor_old = first_step(old_logprobs="actor")
    assert abs(actor_old["actor/kl_old"]) < 1e-4  # recomputed old log-probs: ratio 1 again
    assert actor_old["rollout/logprob_diff_mean"] == pytest.approx(0.5, abs=1e-4)  # the actor against the sampler
    assert actor_old["rollout/kl_sampler_actor"] == pytest.approx(math.exp(-0.5) - 1 + 0.5, abs=1e-4)
    honest_tis, _ = first_step(old_logprobs="actor", tis_cap=0.3)  # the same rollouts: weights min(1, 0.3)
    assert honest_actor["actor/grad_norm"] > 1e-3  # one update: its gradient is scaled by exactly 0.3
    assert honest_tis["actor/grad_norm"] == pytest.approx(0.3 * honest_actor["actor/grad_norm"], rel=1e-3)
    with pytest.raises(ValueError, match="tis_cap"):
        small_config(tmp_path, 1, tis_cap=2.0)


def test_tis_weights_are_p_actor_over_p_sampler_capped_from_above(choice_model_dir, tmp_path):
    """A sampler that over- or under-states its tokens' probabilities by a constant: every token's
    weight is then p_actor / p_sampler = exp(-shift), and the update's gradient scales by exactly
    that (or by the cap where it binds). The weights the wrong way round give exp(+shift)."""
    import twostep

    def off_step(shift, **rl):
        config = twostep.config(tmp_path / f"{shift}-{len(rl)}", 2, temperature=0.8, old_logprobs="actor", **rl)
        with RLTrainer(config, str(choice_model_dir), Path(config.run_dir)) as trainer:
            trainer.learn(trainer.rollout(1), 1)
            trainer.sampler = OverconfidentSampler(trainer.sampler, shift)
            return trainer.learn(trainer.rollout(2), 2)["actor/grad_norm"]

    over = off_step(0.5)
    assert over > 1e-3
    assert off_step(0.5, tis_cap=2.0) == pytest.approx(math.exp(-0.5) * over, rel=1e-3)  # the cap does not bind
    under = off_step(-0.5)
    assert off_step(-0.5, tis_cap=1.2) == pytest.approx(1.2 * under, rel=1e-3)  # exp(0.5) = 1.65, capped at 1.2


def sampled_and_trained(config, model_dir):
    """One RL step on the trainer's real sampler and actor, watching both ends: what the sampler
    was given and returned, and what the update's policy loss read. Each a sorted list of
    (prompt ids, response ids, response log-probs); also the step's trajectories and tokenizer."""
    sampled, trained = [], []
    with RLTrainer(config, str(model_dir), Path(config.run_dir)) as trainer:
        generate, optimizer_step = trainer.sampler.generate, trainer.actor.optimizer_step

        def watch_generate(prompts, params):
            generations = generate(prompts, params)
            sampled.extend((tuple(p), tuple(g.token_ids), tuple(g.logprobs)) for p, g in zip(prompts, generations))
            return generations

        def watch_update(parts):
            for batch in parts[0][0]:  # the policy loss's micro-batches
                offset = 0
                for row in range(len(batch.input_ids)):
                    # (prompt, response) columns of the row's samples: a plain row holds one, a
                    # packed row (rl.pack_prefixes) a prefix tree, each response a chain of
                    # trained columns below its prompt (the columns it descends from).
                    real = batch.attention_mask[row].bool()
                    columns = torch.arange(len(real))
                    if batch.subtree_end is None:
                        first = int(batch.mask[row].nonzero()[0])
                        units = [(columns[:first], columns[first:][real[first:]])]
                    else:
                        end, trained_column = batch.subtree_end[row], batch.mask[row]

                        def ancestors(c):
                            return columns[:c][end[:c] > c]

                        units = [(ancestors(c), columns[c:int(end[c])]) for c in columns[real].tolist()
                                 if trained_column[c] and not trained_column[ancestors(c)[-1]]]
                    for prompt, response in units:
                        assert batch.mask[row][response].all() and not batch.mask[row][prompt].any()
                        n = len(response)
                        trained.append((tuple(batch.input_ids[row][prompt].tolist()),
                                        tuple(batch.input_ids[row][response].tolist()),
                                        tuple(batch.old_logprobs[offset:offset + n].tolist())))
                        offset += n
                assert offset == batch.n_tokens
            return optimizer_step(parts)

        trainer.sampler.generate, trainer.actor.optimizer_step = watch_generate, watch_update
        trajectories = trainer.rollout(1)
        trainer.learn(trajectories, 1)
    return sorted(sampled), sorted(trained), trajectories, trainer.tokenizer


def assert_round_trip(config, model_dir):
    """The token ids trained are exactly those the sampler saw and produced, turn after turn: no
    response re-tokenised, no token lost at a turn boundary, the chat template applied once, the
    same way, and the sampler's log-probs travelling with their own tokens."""
    from agentrl.prompting import encode_prompt

    sampled, trained, trajectories, tokenizer = sampled_and_trained(config, model_dir)
    steps = [s for t in trajectories for s in t.steps]
    assert len(sampled) == len(trained) == len(steps) > len(trajectories)  # several turns each
    for (p, r, logp), (tp, tr, tlogp) in zip(sampled, trained):
        assert (tp, tr) == (p, r)
        torch.testing.assert_close(torch.tensor(tlogp), torch.tensor(logp, dtype=torch.float32), atol=1e-6, rtol=0)
    for t in trajectories:
        for turn, (s, after) in enumerate(zip(t.steps, t.steps[1:] + [None])):
            assert s.prompt_ids == encode_prompt(tokenizer, s.prompt), turn  # one template, at both ends
            assert tokenizer.decode(s.response_ids, skip_special_tokens=True) == s.response
            if after is not None:  # the next turn shows this turn's action in its history
                assert f"Action: {s.action or '(no valid action)'}" in after.prompt


def test_trained_tokens_are_the_sampled_tokens_with_the_hf_sampler(tiny_model_dir, tmp_path):
    """The untrained model samples token sequences no tokenizer would produce from their text,
    so decoding and re-encoding a response would change it."""
    import twostep

    assert_round_trip(twostep.config(tmp_path, 1, temperature=0.8), tiny_model_dir)
