"""`agentrl plan`: its arithmetic on the papers' recipes, and its estimates against the peak
memory of real SFT steps on CPU (single process and 2 gloo ranks)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.plan import GIB, architecture, memory_plan
from agentrl.recipe import load_config

ROOT = Path(__file__).resolve().parents[1]
AGENTRL = str(Path(sys.executable).parent / "agentrl")


def test_the_7b_recipe_fits_8_gpus_with_fsdp2_and_not_one_with_single():
    config = load_config(ROOT / "recipes" / "alfworld-qwen2.5-7b.yaml")
    assert architecture(config).params == pytest.approx(7.62e9, rel=0.01)  # Qwen2.5-7B's published size
    eight = memory_plan(config, 8, 80)
    assert eight["sft"]["backend"] == eight["rl"]["backend"] == "fsdp2"
    assert eight["sft"]["fits"] and eight["rl"]["fits"]
    # 16 bytes a parameter (fp32 master weights, gradients, moments) over 8 ranks, plus bf16 copies
    # of the root (embeddings, head) and of two decoder layers gathered for computing
    arch = architecture(config)
    state = sum(eight["sft"]["parts_gib"][k] for k in ("weights", "gradients", "optimizer"))
    assert state * GIB == pytest.approx(16 * arch.params / 8 + 2 * (2 * arch.layer_params + arch.root_params))
    one = memory_plan(load_config(ROOT / "recipes" / "alfworld-qwen2.5-7b.yaml",
                                  ["rl.actor.backend=single", "sft.actor.backend=single"]), 1, 80)
    assert not one["sft"]["fits"] and not one["rl"]["fits"]
    assert one["sft"]["parts_gib"]["optimizer"] == pytest.approx(8 * 7.62e9 / GIB, rel=0.01)  # fp32 moments


def test_plan_command_prints_a_table_and_refuses_an_unknown_model(tmp_path):
    done = subprocess.run([AGENTRL, "plan", str(ROOT / "recipes" / "alfworld-qwen2.5-7b.yaml"), "--gpus", "8"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "sft (fsdp2)" in done.stdout and "fits" in done.stdout and "7.62B parameters" in done.stdout
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model: {path: someone/unknown-model}\nsft: {}\n")
    done = subprocess.run([AGENTRL, "plan", str(recipe)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "model.path: someone/unknown-model" in done.stderr


@pytest.mark.parametrize("backend,ranks,checkpointing", [
    pytest.param("single", 1, False, id="single", marks=pytest.mark.slow),  # (the checkpointing case plans the same parts)
    pytest.param("single", 1, True, id="single-checkpointing"),
    pytest.param("fsdp2", 2, False, id="fsdp2-2-ranks")])
def test_estimates_are_within_25_percent_of_measured_peaks(tmp_path, backend, ranks, checkpointing):
    """Live peak memory of SFT steps of a 35M-parameter model (fp32, 4096-token micro-batch)
    above the process's memory before the model was built, per rank (deterministic: glibc maps
    every large tensor on its own and returns it when freed)."""
    script = [str(ROOT / "benchmarks" / "memory_plan.py"), "--backend", backend, "--micro-batch-tokens", "4096",
              "--json", str(tmp_path / "rows.json"), *(["--activation-checkpointing"] if checkpointing else [])]
    if ranks > 1:
        from test_distributed import free_port
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks), "--master_port",
                   str(free_port()), *script]
    else:
        command = [sys.executable, *script]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert len(rows) == ranks
    for row in rows:
        assert 0.8 <= row["ratio"] <= 1.25, row


def test_full_history_plans_each_live_episodes_kept_cache():
    """With `prompt.full_history` the HF sampler keeps every live episode's keys and values between
    turns, up to `keep_cache_mib`: Qwen2.5-7B (28 layers, 4 key-value heads of 128) in bf16 holds
    28 x 2 x 512 x 2 bytes a token, 112 MiB an episode at 2,048 tokens."""
    recipe = ROOT / "recipes" / "alfworld-qwen2.5-7b.yaml"
    window = memory_plan(load_config(recipe), 8, 80)
    assert "kept cache" not in window["rl"]["parts_gib"]
    full = memory_plan(load_config(recipe, ["prompt.full_history=true", "prompt.history_length=0"]), 8, 80)
    assert full["rl"]["episode_mib"] == pytest.approx(112.0)
    assert full["rl"]["parts_gib"]["kept cache"] == pytest.approx(1.0)  # 1,024 MiB: the budget, below 16 episodes' 1.75 GiB
    kept = load_config(recipe, ["prompt.full_history=true", "prompt.history_length=0", "rl.sampler.keep_cache_mib=256"])
    assert memory_plan(kept, 8, 80)["rl"]["parts_gib"]["kept cache"] == pytest.approx(0.25)
    # the HF sampler beside a sharded actor: a full bf16 copy, and the rank's 16 live episodes' caches
    sampler = architecture(load_config(recipe)).params * 2 / GIB + 16 * 112 / 1024
    assert full["rl"]["parts_gib"]["sampler"] == pytest.approx(sampler)


def test_the_samplers_prefill_is_planned_bounded_by_the_shared_decoders_forward():
    """The HF sampler's largest prefill forward: with the shared decoder at most `PREFILL_TOKENS`
    padded tokens whatever the number of episodes; with `generate` (share_prefixes false) every
    rank's episode at once. Qwen2.5-7B in bf16, 16 episodes a rank of 2,048 tokens: 4 rows in the
    shared decoder's forward, its keys and values 8,192 x 28 x 2 x 512 x 2 bytes (0.44 GiB), the
    tree mask 4 x 2,048^2 bytes, and the MLP's peak 8,192 x (2 x 3,584 + 3 x 18,944) x 2 bytes."""
    from agentrl.plan import prefill_bytes

    recipe = ROOT / "recipes" / "alfworld-qwen2.5-7b.yaml"
    arch = architecture(load_config(recipe))
    tokens = 4 * 2048
    expected = tokens * 28 * 2 * 512 * 2 + 4 * 2048 ** 2 + tokens * (2 * 3584 + 3 * 18944) * 2
    shared = memory_plan(load_config(recipe), 8, 80)["rl"]["parts_gib"]["sampler prefill"]
    assert shared == pytest.approx(expected / GIB)
    assert prefill_bytes(arch, 64, 2048, 2, 8192) == prefill_bytes(arch, 4, 2048, 2, 8192)  # bounded
    plain = memory_plan(load_config(recipe, ["rl.sampler.share_prefixes=false"]), 8, 80)["rl"]["parts_gib"]
    assert plain["sampler prefill"] == pytest.approx(prefill_bytes(arch, 16, 2048, 2, None) / GIB) and \
        plain["sampler prefill"] > 3 * shared  # 16 episodes at once
    # attention's peak (the mask as a bias, q and the repeated keys and values) where rows are long
    assert prefill_bytes(arch, 1, 8192, 2, 8192) > 8192 * (28 * 2 * 512 * 2 + 8192) + 8192 ** 2 * 2


@pytest.mark.parametrize("family,shared", [({"model_type": "qwen2"}, True), ({"model_type": "llama"}, True),
                                           ({"model_type": "qwen2", "use_sliding_window": True}, False),
                                           ({"model_type": "mistral"}, False),
                                           ({"model_type": "qwen2", "layer_types": ["full_attention", "sliding_attention"]}, False)])
def test_a_family_the_shared_decoder_does_not_run_is_planned_as_generates_prefill(tmp_path, family, shared):
    """The HF sampler falls back to `generate` for a model the shared decoder does not run exactly
    (`shared_decode.supports`): the plan then prefills every episode at once, as with
    share_prefixes false."""
    from agentrl.plan import KNOWN_MODELS, prefill_bytes

    (tmp_path / "config.json").write_text(json.dumps({**KNOWN_MODELS["Qwen/Qwen2.5-7B-Instruct"], **family}))
    config = load_config(ROOT / "recipes" / "alfworld-qwen2.5-7b.yaml", [f"model.path={tmp_path}"])
    arch = architecture(config)
    planned = memory_plan(config, 8, 80)["rl"]["parts_gib"]["sampler prefill"]
    assert planned == pytest.approx(prefill_bytes(arch, 16, 2048, 2, 8192 if shared else None) / GIB)


@pytest.mark.parametrize("prompts,length,intermediate", [(16, 512, 1536), (2, 4096, 512)],
                         ids=["mlp-peak", "attention-peak"])
def test_the_prefill_estimate_is_within_10_percent_of_its_measured_peak(tmp_path, prompts, length, intermediate):
    """The shared decoder's prefill of 8,192 tokens on CPU (fp32, a 6-layer model of hidden 512):
    short rows peak in the MLP, long rows in attention. Measured 0.98-1.02 of the estimate."""
    command = [sys.executable, str(ROOT / "benchmarks" / "prefill_memory.py"), "--prompts", str(prompts), "--length",
               str(length), "--intermediate", str(intermediate), "--json", str(tmp_path / "row.json")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    row = json.loads((tmp_path / "row.json").read_text())
    assert 0.9 <= row["ratio"] <= 1.1, row


def test_the_parameter_count_is_the_models_own(tiny_model_dir):
    """The tiny Qwen2 (tied embeddings, q/k/v biases) counted from its config.json: what torch
    counts in the model itself."""
    from agentrl.models import load_model
    from agentrl.plan import Architecture

    arch = Architecture.from_config(json.loads((Path(tiny_model_dir) / "config.json").read_text()))
    assert arch.tied and arch.params == load_model(str(tiny_model_dir)).num_parameters()


def test_a_tiny_model_is_planned_as_init_builds_it_with_kv_heads_capped_by_its_heads(tmp_path):
    """`init.kv_heads` above hidden_size / 64: init builds as many key/value heads as heads, and the
    plan counts what it builds (the vocabulary aside: a small corpus trains fewer tokens)."""
    import dataclasses

    from agentrl.models import init_tiny_model
    from agentrl.plan import Architecture

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"go to shelf {i}"}]}) + "\n"
                              for i in range(20)))
    config = load_config(ROOT / "recipes" / "demo.yaml", ["init.hidden_size=128", "init.kv_heads=8", "init.layers=1",
                                                          f"init.corpus={corpus}", "init.vocab_size=300"])
    built = Architecture.from_config(json.loads((init_tiny_model(tmp_path / "m", config.init, None, config.prompt)
                                                 / "config.json").read_text()))
    planned = architecture(config)
    assert (planned.heads, planned.kv_heads) == (2, 2)
    assert dataclasses.replace(planned, vocab=built.vocab) == built

@pytest.mark.parametrize("targets", [None, ["q_proj", "v_proj"], ["down_proj", "k_proj"]])
def test_the_lora_parameter_count_is_pefts(tiny_model_dir, targets):
    """The adapters the plan counts (r x (in + out) for each adapted linear layer) are the
    trainable parameters peft adds to the tiny model."""
    from agentrl.actor import LoRAConfig
    from agentrl.models import add_lora, load_model
    from agentrl.plan import Architecture

    lora = LoRAConfig(r=4, **({"target_modules": targets} if targets else {}))
    arch = Architecture.from_config(json.loads((Path(tiny_model_dir) / "config.json").read_text()))
    model = add_lora(load_model(str(tiny_model_dir)), lora)
    assert arch.lora_params(lora) == sum(p.numel() for p in model.parameters() if p.requires_grad)

def test_lora_plans_no_reference_copy_and_bf16_plans_fp32_masters():
    """With LoRA the KL reference is the frozen base with its adapters off (no copy); a single
    process's bf16 trained weights keep fp32 master copies (4 bytes a trained parameter)."""
    recipe = ROOT / "recipes" / "alfworld-qwen2.5-7b.yaml"
    single = ["rl.actor.backend=single", "sft.actor.backend=single"]
    full = memory_plan(load_config(recipe, single), 1, 80)["rl"]["parts_gib"]
    lora = memory_plan(load_config(recipe, [*single, "rl.actor.lora={r: 16, alpha: 32}"]), 1, 80)["rl"]["parts_gib"]
    params = architecture(load_config(recipe)).params
    assert full["reference"] == pytest.approx(params * 2 / GIB) and "reference" not in lora
    assert full["weights"] == pytest.approx(params * (2 + 4) / GIB)


def test_mixed_precision_and_cpu_offload_are_what_a_sharded_actor_plans():
    """On GPUs a ZeRO actor with mixed_precision computes in bf16 (its gradient partitions at 2 bytes
    a parameter, beside fp32 master partitions); without it, in the model's dtype (fp32 here: 4
    bytes, no master copy). cpu_offload takes the optimiser state off the GPU, and FSDP2's shards too."""
    recipe = ROOT / "recipes" / "alfworld-qwen2.5-7b.yaml"
    fp32 = ["model.dtype=float32", "sft.actor.backend=zero2"]
    params = architecture(load_config(recipe)).params

    def parts(*overrides):
        return memory_plan(load_config(recipe, [*fp32, *overrides]), 8, 80)["rl"]["parts_gib"]

    mixed, full = parts("rl.actor.backend=zero2"), parts("rl.actor.backend=zero2", "rl.actor.mixed_precision=false")
    assert mixed["gradients"] == pytest.approx(params * 2 / 8 / GIB) and full["gradients"] == pytest.approx(params * 4 / 8 / GIB)
    assert mixed["weights"] == pytest.approx(params * (2 + 4 / 8) / GIB) and full["weights"] == pytest.approx(params * 4 / GIB)
    offloaded = parts("rl.actor.backend=zero2", "rl.actor.cpu_offload=true")
    assert offloaded["optimizer"] == 0 < mixed["optimizer"]
    sharded, off = parts("rl.actor.backend=fsdp2"), parts("rl.actor.backend=fsdp2", "rl.actor.cpu_offload=true")
    assert off["optimizer"] == off["gradients"] == 0 < sharded["optimizer"] and off["weights"] < sharded["weights"]


def test_a_vllm_sampler_plans_its_copy_of_the_weights_and_its_cache_or_its_share_of_the_gpu():
    """A colocated vLLM engine holds its own copy of the weights (in the model's dtype) and, with
    `kv_cache_gib`, that much cache; without it, `gpu_memory_utilization` of each GPU."""
    recipe = ROOT / "recipes" / "alfworld-qwen2.5-7b.yaml"
    bf16_weights = architecture(load_config(recipe)).params * 2 / GIB

    def sampler(setting):
        return memory_plan(load_config(recipe, [f"rl.sampler={{type: vllm, {setting}}}"]), 8, 80)["rl"]["parts_gib"]["sampler"]

    assert sampler("kv_cache_gib: 6") == pytest.approx(bf16_weights + 6)
    assert sampler("gpu_memory_utilization: 0.3") == pytest.approx(0.3 * 80)


def test_the_plan_commands_context_sizes_the_samplers_cache(capsys):
    """`agentrl plan --context N`: the RL sampler's KV cache grows with the tokens of a sequence."""
    from agentrl.cli import main

    recipe = str(ROOT / "recipes" / "alfworld-qwen2.5-7b.yaml")
    sampler = {}
    for context in (2048, 8192):
        assert main(["plan", recipe, "--gpus", "8", "--json", "--context", str(context)]) == 0
        rl = json.loads(capsys.readouterr().out)["rl"]
        assert rl["context"] == context
        sampler[context] = rl["parts_gib"]["sampler"]
    assert sampler[8192] > sampler[2048]


def test_ppos_critic_and_a_base_models_hub_id_are_planned():
    """PPO's critic is a second model trained beside the actor (weights, gradients and two AdamW
    moments in the model's dtype); a base model's hub id has its -Instruct sibling's shape."""
    recipe = ROOT / "recipes" / "alfworld-qwen2.5-7b.yaml"
    params = architecture(load_config(recipe)).params
    single = ["rl.actor.backend=single"]  # (the critic runs in one process)
    grpo = memory_plan(load_config(recipe, single), 1, 80)["rl"]["parts_gib"]
    ppo = memory_plan(load_config(recipe, [*single, "rl.advantage={type: ppo}"]), 1, 80)["rl"]["parts_gib"]
    assert "critic" not in grpo and ppo["critic"] == pytest.approx(4 * params * 2 / GIB)
    base = load_config(recipe, ["model.path=Qwen/Qwen2.5-7B"])
    assert architecture(base) == architecture(load_config(recipe))


@pytest.mark.parametrize("flags", [["--gpus", "0"], ["--gpu-memory", "0"], ["--gpu-memory", "-8"]])
def test_the_plan_command_refuses_no_gpu_and_no_memory(flags, capsys):
    from agentrl.cli import main

    assert main(["plan", str(ROOT / "recipes" / "alfworld-qwen2.5-7b.yaml"), *flags]) == 2
    assert capsys.readouterr().err.strip() == "plan: --gpus must be at least 1 and --gpu-memory positive"
