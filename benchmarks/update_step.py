"""End-to-end effect of masking prompt tokens out of the output projection, on one update step.

Agent step samples are mostly prompt (task, history, observation, admissible actions) and a short
response. "before" runs the model's own head over every position (`model(...).logits`, (B, L, V)),
then log_softmax and a gather at the response positions; "after" is the actor's path
(`response_logprobs`): only the response positions' hidden states reach the lm_head, through the
fused log-prob (no (N, V) logits either). Both do forward + backward of the same loss on the same
random-init Qwen2 model, side by side in one run; rows are appended to
benchmarks/results/update_step.csv.

    python benchmarks/update_step.py                      # CPU: vocab 32k, hidden 256, 2 layers
    python benchmarks/update_step.py --vocab 151936 --hidden 1536 --layers 4 --samples 32   # GPU
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from agentrl.forward import response_logprobs
from agentrl.packing import TrainSample, collate
from results_csv import append_rows, commit


def before(model, batch):
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits  # (B, L, V)
    logp = torch.log_softmax(logits[:, :-1].float(), -1)
    return logp.gather(-1, batch.input_ids[:, 1:, None])[..., 0][batch.mask[:, 1:]]  # (N,)


def after(model, batch):
    return response_logprobs(model, batch)[0]  # (N,)


def timed(fn, model, batch, repeats: int) -> float:
    times = []
    for _ in range(repeats + 1):  # the first run warms up
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        fn(model, batch).sum().backward()
        if batch.input_ids.is_cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return min(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=600, help="prompt tokens per step sample")
    parser.add_argument("--response", type=int, default=40, help="response tokens per step sample")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "update_step.csv"))
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
                         intermediate_size=4 * args.hidden, num_attention_heads=args.hidden // 64,
                         num_key_value_heads=1, tie_word_embeddings=True)
    model = Qwen2ForCausalLM(config).to(device)
    g = torch.Generator().manual_seed(0)
    samples = [TrainSample.from_turn(torch.randint(0, args.vocab, (args.prompt,), generator=g).tolist(),
                                     torch.randint(0, args.vocab, (args.response,), generator=g).tolist())
               for _ in range(args.samples)]
    batch = collate(samples)
    batch.input_ids, batch.attention_mask, batch.mask = (t.to(device) for t in
                                                          (batch.input_ids, batch.attention_mask, batch.mask))
    torch.testing.assert_close(before(model, batch), after(model, batch), atol=1e-3, rtol=1e-3)
    projected = {"before": batch.input_ids.numel(), "after": batch.n_tokens}
    seconds = {name: timed(fn, model, batch, args.repeats) for name, fn in (("before", before), ("after", after))}
    rows = [{"device": device, "torch": torch.__version__, "commit": commit(), "vocab": args.vocab,
             "hidden": args.hidden, "layers": args.layers, "samples": args.samples, "prompt": args.prompt,
             "response": args.response, "method": name, "tokens_projected": projected[name],
             "seconds": round(seconds[name], 4), "time_vs_before": round(seconds[name] / seconds["before"], 3)}
            for name in ("before", "after")]
    for row in rows:
        print(row)
    append_rows(args.out, rows)


if __name__ == "__main__":
    main()
