"""The learning direction: on a task whose right answer is known (tests/twostep.py), a few RL
steps raise the probability of the rewarded action and lower that of the penalised one, for
every advantage estimator with both policy losses. A sign error anywhere between the reward and
the optimiser (an estimator, a loss, the trainer) turns one of these around."""

import pytest
import torch

from agentrl.forward import response_logprobs
from agentrl.packing import TrainSample, collate
from agentrl.prompting import encode_prompt
from agentrl.trainer import RLTrainer

import twostep

ESTIMATORS = [{"type": "grpo"}, {"type": "grpo", "level": "trajectory"}, {"type": "rloo"}, {"type": "gigpo"},
              {"type": "gagpo"}, {"type": "rlvmr"}, {"type": "ppo", "critic_lr": 1e-3}]


def choice_logprobs(model, tokenizer, temperature: float) -> dict[str, float]:
    """log p(whole response | first prompt) of each action's response."""
    prompt = encode_prompt(tokenizer, twostep.first_prompt())
    out = {}
    for action in (twostep.GOOD, twostep.BAD):
        ids = tokenizer(twostep.response(action), add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
        with torch.no_grad():
            logp, _ = response_logprobs(model, collate([TrainSample.from_turn(prompt, ids)], tokenizer.pad_token_id),
                                        temperature)
        out[action] = logp.sum().item()
    return out


@pytest.mark.parametrize("loss", ["ppo_clip", "seq_ratio"])
@pytest.mark.parametrize("advantage", ESTIMATORS, ids=lambda a: "-".join(str(v) for v in a.values() if v != 1e-3))
def test_rl_raises_the_rewarded_action_and_lowers_the_penalised_one(choice_model_dir, tmp_path, advantage, loss):
    config = twostep.config(tmp_path, steps=3, temperature=0.8, advantage=advantage, loss={"type": loss})
    trainer = RLTrainer(config, str(choice_model_dir), tmp_path)
    try:
        before = choice_logprobs(trainer.model, trainer.tokenizer, 0.8)
        rows = [trainer.train_step() for _ in range(config.rl.steps)]
        after = choice_logprobs(trainer.model, trainer.tokenizer, 0.8)
    finally:
        trainer.close()
    # One mini-batch, one epoch: the update starts on-policy, so the actor scores the sampled
    # tokens exactly as the sampler did (at the sampling temperature).
    assert all(abs(r["actor/kl_old"]) < 1e-4 for r in rows)
    assert 0 < rows[0]["rollout/success"] < 1  # both outcomes were sampled
    assert after[twostep.GOOD] > before[twostep.GOOD] + 0.1, (before, after)
    assert after[twostep.BAD] < before[twostep.BAD] - 0.1, (before, after)
