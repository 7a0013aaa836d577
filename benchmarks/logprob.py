"""Peak memory and time of log p(target) forward + backward, side by side in one run:

  naive      log_softmax over materialised (N, V) logits, then gather
  selective  gather minus logsumexp on materialised logits (no (N, V) log-prob tensor)
  chunked    agentrl's PyTorch path: row chunks, backward recomputes (no (N, V) tensor kept)
  liger      Liger-Kernel's fused linear cross entropy, if it imports (GPU)
  ours       agentrl's Triton kernel (GPU; skipped on CPU where only the interpreter runs it)

    python benchmarks/logprob.py                      # CPU-sized shapes
    python benchmarks/logprob.py --n 2048 8192 16384 --h 1536 3584 --v 151936   # on a GPU

Rows are appended to benchmarks/results/logprob.csv with device, versions and commit; ratios
are to naive. On a GPU the achieved TFLOP/s counts the 2*N*H*V forward floor x 3 (fwd + bwd), and
peak_fraction divides it by the device's dense bf16 peak (bf16 runs on known devices).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import torch

from agentrl.kernels.linear_logprob import linear_logprob_torch, linear_logprob_triton, triton
from results_csv import append_rows, commit


def naive(h, w, t):
    return torch.log_softmax((h @ w.T).float(), -1).gather(-1, t[:, None])[:, 0]


def selective(h, w, t):
    logits = (h @ w.T).float()
    return logits.gather(-1, t[:, None])[:, 0] - torch.logsumexp(logits, -1)


def methods(device: str) -> dict:
    out = {"naive": naive, "selective": selective, "chunked": lambda h, w, t: linear_logprob_torch(h, w, t)[0]}
    if device == "cuda":
        if triton is not None:
            out["ours"] = lambda h, w, t: linear_logprob_triton(h, w, t)[0]
        try:
            from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy
            out["liger"] = lambda h, w, t: -liger_fused_linear_cross_entropy(h, w, t, reduction="none")
        except ImportError:
            pass
    return out


def measure(fn, h, w, t, device: str, repeats: int) -> tuple[float, float]:
    """(seconds per forward+backward, peak extra memory in GiB)."""
    def once():
        h.grad = w.grad = None
        fn(h, w, t).sum().backward()
    once()  # warm-up (and Triton compilation)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    start = time.perf_counter()
    for _ in range(repeats):
        once()
    if device == "cuda":
        torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated() - base) / 2**30
    else:
        peak = float("nan")  # filled in by cpu_peak_gib
    return (time.perf_counter() - start) / repeats, peak


def cpu_peak_gib(method: str, n: int, hdim: int, v: int, dtype: str) -> float:
    """Peak resident memory growth of one forward + backward, in a fresh process (CPU has no
    allocator statistics): the process high-water mark (VmHWM, which unlike ru_maxrss is not
    inherited from the parent) minus the resident size after creating the inputs."""
    code = (f"import torch, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import logprob as b; "
            f"h, w, t = b.inputs({n}, {hdim}, {v}, 'cpu', torch.{dtype}); "
            "before = b.status_kib('VmRSS'); "
            f"b.methods('cpu')[{method!r}](h, w, t).sum().backward(); "
            "print(b.status_kib('VmHWM') - before)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return int(out.split()[-1]) / 2**20


def status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def inputs(n: int, hdim: int, v: int, device: str, dtype):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(n, hdim, generator=g).to(device, dtype).requires_grad_()
    w = (torch.randn(v, hdim, generator=g) / hdim ** 0.5).to(device, dtype).requires_grad_()
    return h, w, torch.randint(0, v, (n,), generator=g).to(device)


PEAK_BF16_TFLOPS = {"H100": 989.4, "H200": 989.4, "A100": 312.0}
"""Dense bf16 tensor-core peak by device name (SXM parts), for the fraction of peak reached."""


def peak_tflops(name: str) -> float | None:
    return next((peak for key, peak in PEAK_BF16_TFLOPS.items() if key in name), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, nargs="+", default=[512, 2048])
    parser.add_argument("--h", type=int, nargs="+", default=[256])
    parser.add_argument("--v", type=int, default=32768)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--csv", default=str(Path(__file__).parent / "results" / "logprob.csv"))
    args = parser.parse_args()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = getattr(torch, args.dtype)
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    rows = []
    for n in args.n:
        for hdim in args.h:
            h, w, t = inputs(n, hdim, args.v, device, dtype)
            base_time = None
            for method, fn in methods(device).items():
                seconds, peak = measure(fn, h, w, t, device, args.repeats)
                if device == "cpu":
                    peak = cpu_peak_gib(method, n, hdim, args.v, args.dtype)
                base_time = base_time or seconds
                tflops = 3 * 2 * n * hdim * args.v / seconds / 1e12
                device_peak = peak_tflops(name) if args.dtype == "bfloat16" else None
                rows.append({"device": name, "torch": torch.__version__, "triton": getattr(triton, "__version__", ""),
                             "commit": commit(), "dtype": args.dtype, "N": n, "H": hdim, "V": args.v, "method": method,
                             "ms": round(seconds * 1e3, 2), "peak_gib": round(peak, 3),
                             "time_vs_naive": round(seconds / base_time, 3), "tflops": round(tflops, 3),
                             "peak_fraction": round(tflops / device_peak, 3) if device_peak else ""})
                print(rows[-1])
    append_rows(args.csv, rows)


if __name__ == "__main__":
    main()
