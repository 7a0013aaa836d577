"""Reviewer's pass 21 (issue 45): single breakages written apart from the suite, each with the
verdict predicted before the run, on the modules with the fewest mutants per line: the FSDP2 and
DeepSpeed actors, the vLLM sampler and its weight push, the samplers' registry, and the model
loading that shards read per rank. Run on a clone with .venv-vllm (`make vllm-env`; test_vllm.py
runs there):
    PYTEST_ADDOPTS="-n 2" .venv/bin/python tests/review_pass.py --root ../pass
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutants import MUTANTS, Mutant, run  # noqa: E402

DIST = ["test_distributed.py"]
FSDP = "src/agentrl/actor/fsdp.py"
DS = "src/agentrl/actor/deepspeed.py"
VLLM = "src/agentrl/sampler/vllm.py"

# (mutant, predicted verdict)
PASS = [
    # the FSDP2 actor
    (Mutant("fsdp2: gradients averaged over the ranks instead of summed", FSDP,
            "(loss * self.world).backward()", "loss.backward()", DIST), "killed"),
    (Mutant("fsdp2: a rank's padding repeats of a micro-batch weighted as real ones", FSDP,
            "return work + [(work[0][0], work[0][1], 0.0)]", "return work + [(work[0][0], work[0][1], 1.0)]", DIST),
     "killed"),
    (Mutant("fsdp2: activation checkpointing ignored", FSDP,
            "        if activation_checkpointing:\n            model.gradient_checkpointing_enable()\n        options",
            "        if activation_checkpointing:\n            pass\n        options", DIST + ["test_actor.py"]),
     "survived"),
    (Mutant("fsdp2: the buffers of a model loaded empty left uninitialised", FSDP,
            "                b.copy_(buffers[name])", "                pass", DIST), "killed"),
    # the DeepSpeed actor
    (Mutant("zero: gradients averaged over the ranks instead of summed", DS,
            "self.engine.backward(loss * self.world)", "self.engine.backward(loss)", DIST), "killed"),
    (Mutant("zero3: the output embedding not registered as an external parameter", DS,
            "            deepspeed.zero.register_external_parameter(self.engine.module, model.get_output_embeddings().weight)",
            "            pass", DIST), "survived"),
    # the vLLM sampler
    (Mutant("vllm: LoRA merged without its alpha / r scale", VLLM,
            "base + (lora_scale * (b.float() @ a.float())).to(base.dtype)", "base + (b.float() @ a.float()).to(base.dtype)",
            ["test_lora.py"]), "killed"),
    (Mutant("vllm: a tied model's head not pushed", VLLM,
            "    if tied and not seen_head and embed is not None:", "    if False:", ["test_lora.py"]),
     "survived"),
    (Mutant("vllm: the sampled tokens' log-probs before temperature", VLLM,
            'logprobs_mode="processed_logprobs"', 'logprobs_mode="raw_logprobs"', ["test_vllm.py"]), "survived"),
    (Mutant("vllm: generation not stopped at the end-of-sequence token", VLLM,
            "stop_token_ids=[self.eos_id],", "stop_token_ids=[],", ["test_vllm.py"]), "killed"),
    # the samplers' registry
    (Mutant("sampler: no kept cache by default with full history", "src/agentrl/sampler/__init__.py",
            "(1024 if run.prompt.full_history else 0)", "0", ["test_full_history.py", "test_config.py"]), "survived"),
    (Mutant("sampler: vLLM seeded with 0 whatever the run's seed", "src/agentrl/sampler/__init__.py",
            "run.model.dtype, run.seed, getattr(", "run.model.dtype, 0, getattr(", ["test_vllm.py"]), "survived"),
    (Mutant("sampler: vLLM given no LoRA settings", "src/agentrl/sampler/__init__.py",
            'getattr(run.rl.actor, "lora", None))', "None)", ["test_vllm.py"]), "survived"),
    # model loading
    (Mutant("models: a model loaded empty keeps its tied head as a parameter of its own", "src/agentrl/models.py",
            "        model.tie_weights()  # from_config", "        pass  # from_config", DIST), "killed"),
    (Mutant("models: a safetensors read ignores where the rank's rows start", "src/agentrl/models.py",
            "meta[\"data_offsets\"][0] + start * dtype.itemsize", "meta[\"data_offsets\"][0]",
            DIST + ["test_models.py"]), "killed"),
    (Mutant("models: a sharded checkpoint's index ignored (model.safetensors only)", "src/agentrl/models.py",
            'names = set(json.loads(index.read_text())["weight_map"].values()) if index.exists() else {"model.safetensors"}',
            'names = {"model.safetensors"}', DIST + ["test_models.py"]), "survived"),
]


def unbroken(mutant: Mutant, root: Path) -> None:
    """The breakage's line is one no mutant in the table touches, and it applies once."""
    for known in MUTANTS:
        if known.path == mutant.path and (mutant.old in known.old or known.old in mutant.old):
            raise SystemExit(f"{mutant.name}: the table's '{known.name}' breaks the same line")
    count = (root / mutant.path).read_text().count(mutant.old)
    if count != 1:
        raise SystemExit(f"{mutant.name}: the line occurs {count} times")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--check", action="store_true", help="only check each breakage applies")
    args = parser.parse_args()
    root = args.root.resolve()
    for mutant, _ in PASS:
        unbroken(mutant, root)
    if args.check:
        return 0
    killed = right = 0
    for mutant, predicted in PASS:
        status, seconds, detail = run(mutant, root, 1200)
        verdict = "killed" if status.startswith("killed") else status
        killed += verdict == "killed"
        right += verdict == predicted
        print(f"{verdict:>10} (predicted {predicted:>8})  {seconds:5.0f} s  {mutant.name}  {detail}", flush=True)
    print(f"killed {killed} of {len(PASS)}; {right} predicted right")
    return 0


if __name__ == "__main__":
    sys.exit(main())
