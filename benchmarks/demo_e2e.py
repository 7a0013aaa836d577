"""`make demo` end to end, before and after shared prefixes: the demo recipe's whole pipeline
twice, at the same time (so that other jobs on the machine slow both alike), once with prefix
packing, tree prefill and grouped mini-batches off (`rl.pack_prefixes=false`,
`rl.sampler.share_prefixes=false`, `rl.mini_batch_order=shuffled`: the update as it was before
them) and once as the recipe stands. Per run: wall-clock seconds, each phase's seconds (the run's
logs/phase_seconds.json), peak resident memory and the final success per split; rows are appended
to benchmarks/results/demo_e2e.csv.

    python benchmarks/demo_e2e.py
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from results_csv import append_rows, commit

MODES = {"before": ["rl.pack_prefixes=false", "rl.sampler.share_prefixes=false", "rl.mini_batch_order=shuffled"],
         "now": []}


def main() -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        started, procs = time.perf_counter(), {}
        for mode, sets in MODES.items():
            command = [sys.executable, "-m", "agentrl.cli", "run", "recipes/demo.yaml", "--set", f"run_dir={tmp}/{mode}",
                       *(arg for item in sets for arg in ("--set", item))]
            procs[mode] = subprocess.Popen(command, stdout=subprocess.DEVNULL)
        modes = {proc.pid: mode for mode, proc in procs.items()}
        for _ in procs:  # in the order they finish
            pid, status, usage = os.wait4(-1, 0)
            mode = modes[pid]
            if os.waitstatus_to_exitcode(status) != 0:
                raise SystemExit(f"the {mode} run failed")
            run = Path(tmp) / mode
            summary = json.loads((run / "summary.json").read_text())
            phases = json.loads((run / "logs" / "phase_seconds.json").read_text())
            rows.append({"mode": mode, "wall_s": round(time.perf_counter() - started, 1),
                         **{f"{name.replace(' ', '_')}_s": round(s, 1) for name, s in phases.items()},
                         "peak_rss_mib": usage.ru_maxrss // 1024,
                         **{f"rl_{split}": r["success"] for split, r in summary["phases"]["rl"].items()},
                         "cpu": platform.processor() or platform.machine(), "commit": commit()})
    rows.sort(key=lambda row: list(MODES).index(row["mode"]))
    for row in rows:
        row["wall_ratio"] = round(row["wall_s"] / rows[0]["wall_s"], 3)
        row["rl_ratio"] = round(row["rl_s"] / rows[0]["rl_s"], 3)
        print(row)
    append_rows(Path(__file__).resolve().parent / "results" / "demo_e2e.csv", rows)


if __name__ == "__main__":
    main()
