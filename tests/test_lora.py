"""LoRA via peft: only adapters train, the KL reference is the base with adapters off, adapter
checkpoints resume exactly and export merges into a plain HF folder."""

from pathlib import Path

import pytest
import torch

pytest.importorskip("peft")

from test_trainer import run, small_config, strip_timing  # noqa: E402

from agentrl.checkpoint import list_checkpoints  # noqa: E402
from agentrl.cli import main  # noqa: E402
from agentrl.models import load_model  # noqa: E402
from agentrl.tracking import read_metrics  # noqa: E402

# KL as a reward penalty from the sampler's log-probs: exactly 0 while the adapters are still the
# identity (step 1), so it checks that the reference really is the base with adapters off.
LORA = {"actor": {"lora": {"r": 4, "alpha": 8}}, "entropy_coef": 0.05, "optim": {"lr": 1e-2},
        "kl_in_reward": True, "kl_estimator": "k1"}


def test_lora_trains_only_adapters_and_resumes_exactly(tiny_model_dir, tmp_path):
    straight = tmp_path / "straight"
    run(small_config(straight, 3, **LORA), tiny_model_dir)
    rows = read_metrics(straight / "logs" / "metrics.jsonl")
    assert rows[0]["rollout/kl_penalty"] == pytest.approx(0.0, abs=1e-6)
    assert rows[-1]["rollout/kl_penalty"] != 0 and all(r["actor/grad_norm"] > 0 for r in rows)
    final = list_checkpoints(straight)[-1] / "model"
    assert (final / "adapter_model.safetensors").is_file() and not (final / "model.safetensors").exists()

    split = tmp_path / "split"
    run(small_config(split, 2, **LORA), tiny_model_dir)
    run(small_config(split, 3, **LORA), tiny_model_dir, resume=True)
    assert strip_timing(read_metrics(split / "logs" / "metrics.jsonl")) == strip_timing(rows)

    # Export: the merged plain model computes what base + adapters computed.
    out = tmp_path / "export"
    assert main(["export", str(final.parent), "--out", str(out), "--base", str(tiny_model_dir)]) == 0
    from peft import PeftModel
    merged = load_model(str(out))
    with_adapters = PeftModel.from_pretrained(load_model(str(tiny_model_dir)), final)
    base = load_model(str(tiny_model_dir))
    ids = torch.tensor([[5, 17, 33, 2, 9, 40]], device=merged.device)
    with torch.no_grad():
        expected = with_adapters(input_ids=ids).logits
        assert torch.allclose(merged(input_ids=ids).logits, expected, atol=1e-4)
        assert not torch.allclose(base(input_ids=ids).logits, expected, atol=1e-4)
    assert not any("lora" in k for k in merged.state_dict())
    # The run's own final model is that plain merged folder too, not the adapters.
    own = straight / "model"
    assert not (own / "adapter_config.json").exists()
    with torch.no_grad():
        assert torch.allclose(load_model(str(own))(input_ids=ids).logits, expected, atol=1e-4)


def test_a_checkpoint_of_other_adapters_is_refused(tiny_model_dir, tmp_path):
    """Adapters saved on every linear layer do not load into adapters on two of them: an error
    naming the checkpoint, not a policy resumed with half its adapters."""
    from agentrl.actor import LoRAConfig
    from agentrl.actor.single import SingleActor
    from agentrl.config import OptimConfig
    from agentrl.models import add_lora

    everywhere = SingleActor(add_lora(load_model(str(tiny_model_dir)), LoRAConfig(r=4)), OptimConfig())
    everywhere.save(tmp_path)
    two = add_lora(load_model(str(tiny_model_dir)), LoRAConfig(r=4, target_modules=["q_proj", "v_proj"]))
    with pytest.raises(ValueError, match="does not match the adapters"):
        SingleActor(two, OptimConfig()).load(tmp_path)


def test_export_of_a_plain_checkpoint_and_bad_input(tiny_model_dir, tmp_path):
    assert main(["export", str(tiny_model_dir), "--out", str(tmp_path / "plain")]) == 0
    assert (Path(tmp_path / "plain") / "config.json").is_file()
    (tmp_path / "empty").mkdir()
    assert main(["export", str(tmp_path / "empty"), "--out", str(tmp_path / "x")]) == 2


def test_export_merges_adapters_into_the_base_given_with_base(tiny_model_dir, tmp_path):
    """`agentrl export --base`: adapters whose recorded base has moved merge into the base named,
    with peft's own merge; without it the recorded base is looked for and the export refused."""
    import json

    from agentrl.actor import LoRAConfig
    from agentrl.models import add_lora

    model = add_lora(load_model(str(tiny_model_dir)), LoRAConfig(r=4, alpha=8))
    with torch.no_grad():  # non-zero adapters (B starts at zero)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.1)
    model.save_pretrained(tmp_path / "adapters")
    settings = tmp_path / "adapters" / "adapter_config.json"
    settings.write_text(json.dumps({**json.loads(settings.read_text()),
                                    "base_model_name_or_path": str(tmp_path / "moved")}))
    assert main(["export", str(tmp_path / "adapters"), "--out", str(tmp_path / "none")]) == 2
    assert main(["export", str(tmp_path / "adapters"), "--out", str(tmp_path / "merged"),
                 "--base", str(tiny_model_dir)]) == 0
    merged, expected = load_model(str(tmp_path / "merged")).state_dict(), model.merge_and_unload().state_dict()
    assert set(merged) == set(expected)
    for name, tensor in expected.items():
        torch.testing.assert_close(merged[name], tensor, atol=1e-6, rtol=1e-6)


def test_merged_weights_for_vllm_equal_peft_merge(tiny_model_dir):
    """What the vLLM sampler receives from a LoRA actor: plain HF names, W + (alpha / r) B A per
    adapted layer, and the tied lm_head named explicitly."""
    from agentrl.actor import LoRAConfig
    from agentrl.models import add_lora
    from agentrl.sampler.vllm import merged_weights

    lora = LoRAConfig(r=4, alpha=8)
    model = add_lora(load_model(str(tiny_model_dir)), lora)
    with torch.no_grad():  # non-zero adapters (B starts at zero)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.1)
    pushed = dict(merged_weights(model.named_parameters(), lora.alpha / lora.r, tied=True))
    expected = model.merge_and_unload().state_dict()
    assert set(pushed) == set(expected)
    for name, tensor in expected.items():
        torch.testing.assert_close(pushed[name], tensor, atol=1e-6, rtol=1e-6)
