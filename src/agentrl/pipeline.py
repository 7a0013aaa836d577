"""The standard pipeline of one recipe: [init a tiny model] -> eval -> SFT -> eval -> RL -> eval.

Each phase writes into the run directory and is skipped when its output is already there, so a
pipeline stopped at any point continues where it stopped (RL resumes from its last checkpoint).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from agentrl.config import Config, save_config
from agentrl.data import collect_expert_data, collect_judgment_data
from agentrl.envs.pool import EnvPool
from agentrl.evaluate import evaluate
from agentrl.models import init_tiny_model, load_model, load_tokenizer
from agentrl.sampler.hf import HFSampler
from agentrl.sft import train_sft
from agentrl.tracking import Tracker
from agentrl.trainer import RLTrainer

console = Console()


def evaluate_checkpoint(config: Config, model_path: str, out_dir: Path, workers: int = 0) -> dict:
    tokenizer = load_tokenizer(model_path)
    model = load_model(model_path, config.model.dtype)
    with EnvPool(config.env, workers) as pool:
        return evaluate(pool, HFSampler(model, tokenizer), tokenizer, config.eval, config.prompt,
                        config.seed, out_dir)


def _cached_eval(config: Config, model_path: str, out_dir: Path) -> dict:
    done = out_dir / "results.json"
    if done.exists():
        return json.loads(done.read_text())
    return evaluate_checkpoint(config, model_path, out_dir, config.rl.workers if config.rl else 0)


def run_pipeline(config: Config, resume: bool = True) -> dict:
    run_dir = Path(config.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    save_config(config, run_dir / "config.yaml")
    torch.manual_seed(config.seed)
    model_path = config.model.path

    if config.init is not None and not (Path(model_path) / "config.json").exists():
        from agentrl.envs import make_env
        console.print(f"[bold]init[/] tiny model -> {model_path}")
        env = make_env(config.env)
        try:
            init_tiny_model(model_path, config.init, env, config.prompt, config.seed)
        finally:
            env.close()

    phases = {"initial": _cached_eval(config, model_path, run_dir / "eval" / "initial")}
    _print_phase("initial", phases["initial"])

    if config.sft is not None:
        sft_dir = run_dir / "sft"
        sft_model = sft_dir / "model"
        if not (sft_model / "config.json").exists():
            data = config.sft.data
            if data is None:
                from agentrl.envs import make_env
                data = sft_dir / "data.jsonl"
                env = make_env(config.env)
                try:
                    stats = collect_expert_data(env, config.prompt, config.sft.episodes, data, config.seed)
                    if config.sft.judgments:
                        stats.update(collect_judgment_data(env, config.prompt, config.sft.judgments, data,
                                                           config.seed))
                finally:
                    env.close()
                console.print(f"[bold]expert data[/] {stats} -> {data}")
            tracker = Tracker(sft_dir / "logs")
            try:
                train_sft(load_model(model_path, config.model.dtype), load_tokenizer(model_path), data,
                          config.sft, config.seed, sft_model, tracker)
            finally:
                tracker.close()
        model_path = str(sft_model)
        phases["sft"] = _cached_eval(config, model_path, run_dir / "eval" / "sft")
        _print_phase("sft", phases["sft"])

    if config.rl is not None and config.rl.steps > 0:
        done = run_dir / "eval" / "rl" / "results.json"
        if done.exists():
            phases["rl"] = json.loads(done.read_text())
        else:
            trainer = RLTrainer(config, model_path, run_dir / "rl")
            try:
                phases["rl"] = trainer.run(resume=resume)
            finally:
                trainer.close()
            done.parent.mkdir(parents=True, exist_ok=True)
            done.write_text(json.dumps(phases["rl"], indent=2))
        _print_phase("rl", phases["rl"])

    summary = {"run_dir": str(run_dir), "splits": config.eval.splits, "episodes": config.eval.episodes,
               "phases": phases}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    print_summary(summary)
    return summary


def _print_phase(name: str, results: dict) -> None:
    line = "  ".join(f"{split.upper()} {r['success'] * 100:.1f}%" for split, r in results.items())
    console.print(f"[bold]eval[/] {name}: {line}")


def print_summary(summary: dict) -> None:
    table = Table(title=f"Success rate ({summary['episodes']} episodes per split, 95% Wilson interval)")
    table.add_column("phase")
    for split in summary["splits"]:
        table.add_column(split.upper(), justify="right")
    for phase, results in summary["phases"].items():
        cells = []
        for split in summary["splits"]:
            r = results[split]
            low, high = r["ci95"]
            cells.append(f"{r['success'] * 100:5.1f}% [{low * 100:.0f}-{high * 100:.0f}]")
        table.add_row(phase, *cells)
    console.print(table)
