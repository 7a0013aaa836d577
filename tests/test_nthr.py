"""NTHR: the coupling score is the lm_head gradient inner product, and only negative tokens
coupled to positive ones are down-weighted."""

import pytest
import torch

from agentrl.advantages.nthr import coupling, nthr_token_weights


def head_gradients(h, y, weight, temperature):
    """Per-token gradient of log p(y | h) w.r.t. the lm_head weight, flattened, by autograd."""
    grads = []
    for hi, yi in zip(h, y):
        w = weight.clone().requires_grad_(True)
        torch.log_softmax(hi @ w.T / temperature, -1)[yi].backward()
        grads.append(w.grad.flatten())
    return torch.stack(grads)


def test_coupling_equals_the_head_gradient_inner_product():
    torch.manual_seed(0)
    weight, temperature = torch.randn(11, 5, dtype=torch.float64), 0.7
    h_a, h_b = torch.randn(4, 5, dtype=torch.float64), torch.randn(3, 5, dtype=torch.float64)
    y_a, y_b = torch.tensor([1, 3, 3, 0]), torch.tensor([3, 7, 1])
    p_a = torch.softmax(h_a @ weight.T / temperature, -1)
    p_b = torch.softmax(h_b @ weight.T / temperature, -1)
    expected = head_gradients(h_a, y_a, weight, temperature) @ head_gradients(h_b, y_b, weight, temperature).T
    assert torch.allclose(coupling(h_a, y_a, p_a, h_b, y_b, p_b) / temperature ** 2, expected)


def test_only_tokens_coupled_to_positives_are_downweighted():
    torch.manual_seed(1)
    weight = torch.randn(16, 8)
    h_pos, y_pos = torch.randn(3, 8), torch.tensor([2, 5, 9])
    # Negative token 0 repeats a positive token exactly (the strongest coupling there is);
    # token 1 has a hidden state orthogonal to every positive one (no coupling at all).
    q, _ = torch.linalg.qr(torch.cat([h_pos.T, torch.randn(8, 1)], 1))
    orthogonal = q[:, 3] * 5
    h_neg, y_neg = torch.stack([h_pos[1], orthogonal]), torch.tensor([5, 5])
    weights = nthr_token_weights(h_pos, y_pos, h_neg, y_neg, weight, 1.0, tau=0.3, eta=0.25)
    assert weights.tolist() == [0.25, 1.0]
    p = torch.softmax(h_neg @ weight.T, -1)
    p_pos = torch.softmax(h_pos @ weight.T, -1)
    assert coupling(h_neg, y_neg, p, h_pos, y_pos, p_pos)[1].abs().max() < 1e-4


def test_nthr_scales_only_negative_samples_of_mixed_groups(tiny_model_dir):
    from agentrl.packing import TrainSample
    from agentrl.advantages.nthr import NTHRConfig, nthr_scales
    from agentrl.models import load_model

    model = load_model(str(tiny_model_dir))
    samples = [TrainSample.from_turn([5, 6, 7], response) for response in ([8, 9], [8, 9], [10, 11, 12], [8, 9])]
    advantages, groups = [1.0, -1.0, -2.0, -1.0], [0, 0, 0, 1]  # group 1: no positive sample
    # tau very low: every negative token of group 0 counts as coupled.
    scales, metrics = nthr_scales(model, samples, advantages, groups, NTHRConfig(tau=-1e9, eta=0.5), 1.0, 0, 10_000)
    assert scales == {1: [0.5, 0.5], 2: [0.5, 0.5, 0.5]}
    assert metrics == {"nthr/negative_tokens": 5.0, "nthr/downweighted_share": 1.0}
    # tau very high: nothing is coupled enough.
    scales, metrics = nthr_scales(model, samples[:2], [1.0, -1.0], [0, 0], NTHRConfig(tau=1e9, eta=0.5), 1.0, 0,
                                  10_000)
    assert scales == {1: [1.0, 1.0]} and metrics["nthr/downweighted_share"] == 0.0
    # A sample of advantage 0 is not positive: a group of it and a negative one is untouched.
    scales, metrics = nthr_scales(model, samples[:2], [0.0, -1.0], [0, 0], NTHRConfig(tau=-1e9, eta=0.5), 1.0, 0,
                                  10_000)
    assert scales == {} and metrics == {"nthr/negative_tokens": 0.0, "nthr/downweighted_share": 0.0}


def test_the_step_batch_writes_each_advantage_once_times_its_token_scales():
    from agentrl.advantages.common import Advantages
    from agentrl.components import StepBatch
    from agentrl.packing import TrainSample
    from agentrl.rollout.types import StepSample, Trajectory

    steps = [StepSample([1, 2], [3, 4], [-0.1, -0.1], "r", "a", "o", "k") for _ in range(3)]
    trajectories = [Trajectory("a", 0, "t", steps[:2]), Trajectory("b", 0, "t", steps[2:])]
    samples = [TrainSample.from_turn([1, 2], [3, 4]) for _ in steps]
    batch = StepBatch(1, trajectories, steps, samples)
    batch.set_advantages(Advantages(values=[[1.0, 2.0], [-3.0]]))
    batch.scale_advantages(2, [0.5, 1.0])
    batch.scale_advantages(2, [0.5, 0.0])
    batch.attach_advantages()
    assert [s.advantage for s in steps] == [1.0, 2.0, -3.0]
    assert [s.advantages for s in samples] == [[1.0, 1.0], [2.0, 2.0], [-0.75, 0.0]]
    with pytest.raises(ValueError):  # an estimator's values for fewer steps than the batch holds
        batch.set_advantages(Advantages(values=[[1.0], [-3.0]]))


def test_the_nthr_step_couples_at_the_sampling_temperature(tiny_model_dir, tmp_path):
    """The step's NTHR scores the coupling at `sampling.temperature`, where the policy sampled and
    the update trains: its token scales are those at that temperature, at a tau where temperature
    1's differ (so a step that scores at 1 fails)."""
    from agentrl.advantages.common import Advantages
    from agentrl.advantages.nthr import NTHR, token_hidden
    from agentrl.components import Context, StepBatch
    from agentrl.models import load_model, load_tokenizer
    from agentrl.packing import TrainSample
    from agentrl.recipe import validate_config
    from agentrl.rollout.types import StepSample, Trajectory

    model, tokenizer = load_model(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    responses, advantages = ([8, 9], [8, 10], [10, 11, 12]), [1.0, -1.0, -2.0]
    samples = [TrainSample.from_turn([5, 6, 7], r) for r in responses]
    (h_pos, y_pos), *negatives = token_hidden(model, samples, tokenizer.pad_token_id, 10_000)
    h_neg, y_neg = (torch.cat(parts) for parts in zip(*negatives))
    head = model.get_output_embeddings().weight.detach().float()

    def weights(temperature, tau):
        return nthr_token_weights(h_pos, y_pos, h_neg, y_neg, head, temperature, tau, 0.5).tolist()

    tau = next(t / 64 for t in range(-256, 257) if weights(0.3, t / 64) != weights(1.0, t / 64))
    config = validate_config({"sampling": {"temperature": 0.3},
                              "rl": {"components": [{"type": "nthr", "tau": tau, "eta": 0.5}]}})
    nthr = NTHR(config.rl.components[0], Context(config, str(tiny_model_dir), model, None, tokenizer, tmp_path))
    steps = [StepSample([5, 6, 7], r, [0.0] * len(r), "r", "a", "o", "k") for r in responses]
    batch = StepBatch(1, [Trajectory("t", 0, "x", steps)], steps, samples)
    batch.set_advantages(Advantages(values=[advantages]))
    nthr.shape(batch)
    batch.attach_advantages()
    expected = weights(0.3, tau)
    assert [s.advantages for s in samples[1:]] == [[-1.0 * w for w in expected[:2]], [-2.0 * w for w in expected[2:]]]
