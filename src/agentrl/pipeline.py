"""The standard pipeline of one recipe: [init a tiny model] -> eval -> [expert data -> SFT -> eval]
-> [RL -> eval], and the phase functions the CLI's single commands call.

Provenance (`agentrl.provenance`): each phase records the settings it depended on in
`<run_dir>/phases.json`; a rerun reuses a phase only when they are unchanged, and otherwise redoes
it and every phase after it, saying why in one line per phase. RL records its settings when it
starts, so a stopped run with the same settings resumes from its last checkpoint; `rl.steps`,
`eval_every`, `save_every`, `keep_last`, worker counts and time limits are not among them
(raising `rl.steps` continues the run). The resolved `config.yaml` is written when the pipeline
completes, so it never claims values a phase did not use.
"""

from __future__ import annotations

import json
import os
import shutil
from datetime import timedelta
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from agentrl import distributed
from agentrl.actor import SingleActorConfig, check_launch, shards_on_load
from agentrl.checkpoint import latest_checkpoint, read_state
from agentrl.components import timed
from agentrl.config import Config, ConfigError, SFTConfig
from agentrl.data import collect_expert_data, read_chat_dataset
from agentrl.envs import make_env
from agentrl.envs.pool import EnvPool
from agentrl.evaluate import evaluate
from agentrl.files import write_atomic
from agentrl.gcd.data import collect_judgment_data
from agentrl.models import init_tiny_model, load_model, load_tokenizer, resolve_model
from agentrl.prompting import prompt_differences, save_prompt
from agentrl.provenance import Phases, config_settings, folder_fingerprint, plugin_fingerprints
from agentrl.recipe import save_config
from agentrl.sampler import keep_cache_mib
from agentrl.sampler.hf import HFSampler
from agentrl.sft import train_sft
from agentrl.tracking import Tracker
from agentrl.trainer import RLTrainer, check_ranks

console = Console()

PIPELINE_WAIT = timedelta(hours=24)
"""How long the other ranks wait for rank 0's phases before RL (init, evaluations, expert data, SFT)."""
RL_CONTINUABLE = ("rl.steps", "rl.eval_every", "rl.save_every", "rl.keep_last", "rl.env_pool",
                  "rl.max_aborted_share", "rl.max_skipped_updates",
                  "rl.check_logprobs_every", "rl.save_rollouts", "rl.log_samples",
                  "rl.overlap.backend", "rl.overlap.ray")
"""RL settings that do not change what the steps already taken did."""
SFT_CONTINUABLE = ("sft.save_every",)
"""SFT settings that do not change what the steps taken did."""
EVAL_GUARDS = ("eval.max_aborted_share", "eval.initial")
"""Evaluation settings that do not change a result (whether it is an error, whether it is made)."""


def _replace(tmp: Path, final: Path) -> None:
    """Move a finished output into place (folders: the old one is removed first)."""
    if final.is_dir():
        shutil.rmtree(final)
    os.replace(tmp, final)


# --- phases (the CLI's single commands call these too) -------------------------------------------
def make_tiny_model(config: Config, out: str | Path) -> Path:
    out = Path(out)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    env = make_env(config.env)
    try:
        init_tiny_model(tmp, config.init, env, config.prompt, config.seed, expert_workers(config), config.env)
    finally:
        env.close()
    _replace(tmp, out)
    return out


def expert_workers(config: Config) -> int:
    """Expert episodes (SFT data, the tokenizer's corpus) are played by as many processes as the
    recipe's RL environment pool has workers (the same examples where the environment is
    deterministic)."""
    return config.rl.env_pool.workers if config.rl else 0


def expert_data(config: Config, out: str | Path, episodes: int, judgments: int = 0, split: str = "train") -> dict:
    """Expert episodes (and GCD judgment examples) of the recipe's environment as a JSONL chat dataset."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    sft_config = config.sft or SFTConfig()  # a recipe without an SFT phase: the expert's data as it plays
    env = make_env(config.env)
    try:
        stats = collect_expert_data(env, config.prompt, episodes, tmp, config.seed, split, sft_config.detours,
                                    sft_config.keep_failed, expert_workers(config), config.env)
        if judgments:
            stats.update(collect_judgment_data(env, config.prompt, judgments, tmp, config.seed))
    finally:
        env.close()
    os.replace(tmp, out)
    return stats


def text_settings(config: Config) -> dict[str, object]:
    """What the expert's episodes (and a tokenizer learnt from their text) depend on: the seed,
    the environment and the prompt, less their fields that change only the reward (each
    section's `reward_only`: ScienceWorld's failure_penalty, the prompt's invalid_penalty)."""
    reward_only = tuple(f"{section}.{name}" for section in ("env", "prompt")
                        for name in getattr(getattr(config, section), "reward_only", ()))
    return config_settings(config, "seed", "env", "prompt", exclude=reward_only)


def expert_data_once(config: Config, out: str | Path, episodes: int, judgments: int = 0, split: str = "train",
                     say=print) -> dict | None:
    """`expert_data` (`agentrl data`), unless `out` holds what the same settings made (recorded in
    its folder's phases.json): then None. Settings elsewhere in the recipe do not remake it."""
    out = Path(out)
    sft_config = config.sft or SFTConfig()
    settings = {**text_settings(config), **plugin_fingerprints(config),
                "episodes": episodes, "judgments": judgments, "split": split,
                "sft.detours": sft_config.detours, "sft.keep_failed": sft_config.keep_failed}
    phases, name = Phases(out.parent, say), f"expert data {out.name}"
    if phases.reusable(name, settings, out.is_file()):
        return None
    stats = expert_data(config, out, episodes, judgments, split)
    phases.complete(name, settings)
    return stats


def sft(config: Config, model_path: str, data: str | Path, out: str | Path, log_dir: str | Path | None = None,
        settings: dict | None = None) -> Path:
    """SFT of `model_path` on `data` into the HF folder `out` (logs: `log_dir`, default out/logs),
    on every rank of a launch when `sft.actor` is sharded. The work happens in `out`.tmp, with its
    checkpoints: a stopped SFT rerun with the same `settings` (default: the model's and data's
    fingerprints and the sft section) continues from its last checkpoint, otherwise it starts over."""
    out = Path(out)
    read_chat_dataset(data)  # a missing or malformed dataset fails before the model loads
    tmp = out.with_name(out.name + ".tmp")
    if settings is None:
        settings = {"model.path": model_path, "model.fingerprint": folder_fingerprint(model_path),
                    "model.dtype": config.model.dtype, "sft.data": str(data),
                    "sft.data.fingerprint": _file_fingerprint(Path(data)),
                    **config_settings(config, "seed", "sft", exclude=SFT_CONTINUABLE)}
    resume = distributed.on_main(lambda: _sft_resume_point(tmp, settings))
    tracker = None
    if distributed.is_main():
        log_dir = tmp / "logs" if log_dir is None else Path(log_dir)
        if resume is None:
            shutil.rmtree(log_dir, ignore_errors=True)
        tracker = Tracker(log_dir, resume_step=resume[1] if resume else 0, config=config, name="sft")
    try:
        actor = config.sft.actor or SingleActorConfig()
        model = load_model(model_path, config.model.dtype, empty=shards_on_load(actor))
        train_sft(model, load_tokenizer(model_path), data, config.sft,
                  config.seed, tmp, tracker, resume=Path(resume[0]) if resume else None,
                  settings=settings, base=model_path)
        if distributed.is_main():
            save_prompt(config.prompt, tmp)
    finally:
        if tracker is not None:
            tracker.close()
    if distributed.is_main():
        _replace(tmp, out)
    distributed.barrier()
    return out


def sft_phase(config: Config, model_path: str, data: str | Path, out: str | Path, settings: dict,
              seconds: dict[str, float]) -> None:
    """SFT on the expert `data`, then the DAgger rounds `sft.dagger` asks for (`agentrl.dagger`);
    the final model in `out`. Each round's labels, aggregate and model are kept in
    <out's folder>/dagger with the settings they were made with, so a rerun continues after the
    last complete one."""
    out = Path(out)
    dagger = config.sft.dagger
    if dagger is None:
        sft(config, model_path, data, out, out.parent / "logs", settings)
        return
    work = out.parent / "dagger"
    current, sources = work / "model0", [Path(data)]
    cloning = {key: value for key, value in settings.items() if not key.startswith(("sft.dagger.", "dagger."))}
    step = distributed.on_main(lambda: _dagger_step(work, "sft 0", cloning, current))
    if step["train"]:  # behaviour cloning, the same whatever the rounds after it
        sft(config, model_path, data, current, out.parent / "logs", cloning)
        distributed.on_main(lambda: _phases(work).complete("sft 0", cloning))
    round_config = config.model_copy(update={"sft": config.sft.model_copy(update={"epochs": dagger.epochs})})
    for number in range(1, dagger.rounds + 1):
        labels, aggregate, trained = work / f"labels{number}.jsonl", work / f"aggregate{number}.jsonl", work / f"model{number}"
        with timed(seconds, "dagger"):
            played = distributed.on_main(lambda: _dagger_labels(config, current, number, labels, settings))
        sources.append(labels)
        round_settings = {**settings, "dagger.round": number, "dagger.labels": played}
        step = distributed.on_main(lambda: _dagger_step(work, f"sft {number}", round_settings, trained, sources, aggregate))
        if step["train"]:
            with timed(seconds, "dagger"):
                sft(round_config, str(current), aggregate, trained, work / f"logs{number}", round_settings)
            distributed.on_main(lambda: _phases(work).complete(f"sft {number}", round_settings))
        current = trained
    if distributed.is_main():
        tmp = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(current, tmp)
        _replace(tmp, out)
    distributed.barrier()


def _dagger_labels(config: Config, model_path: Path, number: int, out: Path, settings: dict) -> str:
    """Round `number`'s labelled states in `out`, played by `model_path` (reused when made with the
    same settings from the same model); the labels' fingerprint."""
    from agentrl.dagger import dagger_data

    phases = _phases(out.parent)
    label_settings = {**settings, "dagger.round": number, "dagger.model": folder_fingerprint(model_path)}
    if not phases.reusable(f"labels {number}", label_settings, out.is_file()):
        torch.manual_seed(config.seed * 1000 + number)
        with EnvPool(config.env, config.rl.env_pool if config.rl else None) as pool:
            tokenizer = load_tokenizer(model_path)
            sampler = HFSampler(load_model(model_path, config.model.dtype), tokenizer, keep_mib=keep_cache_mib(config))
            stats = dagger_data(pool, sampler, tokenizer, config, number, out)
        console.print(f"[bold]dagger[/] round {number}: {stats}", soft_wrap=True)
        with (out.parent / "rounds.jsonl").open("a") as f:
            f.write(json.dumps({"round": number, **vars(stats)}) + "\n")
        phases.complete(f"labels {number}", label_settings)
    return _file_fingerprint(out)


def _dagger_step(work: Path, name: str, settings: dict, model: Path, sources: list[Path] = (),
                 aggregate: Path | None = None) -> dict:
    """Whether the round's SFT must run (its model is missing or was made with other settings);
    when it must, its aggregate dataset is written first (the sources, concatenated)."""
    work.mkdir(parents=True, exist_ok=True)
    if _phases(work).reusable(name, settings, (model / "config.json").exists()):
        return {"train": False}
    if aggregate is not None:
        write_atomic(aggregate, "".join(source.read_text() for source in sources))
    return {"train": True}


def _sft_resume_point(tmp: Path, settings: dict) -> tuple[str, int] | None:
    """(checkpoint, step) of a stopped SFT in `tmp` made with `settings`; otherwise None, and
    `tmp` emptied (a leftover of other settings is never continued)."""
    ckpt = latest_checkpoint(tmp)
    if ckpt is not None:
        state = read_state(ckpt)
        if json.dumps(state.get("settings"), sort_keys=True) == json.dumps(settings, sort_keys=True):
            console.print(f"[bold]sft[/] continuing from {ckpt.name}")
            return str(ckpt), state["step"]
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return None


def train_rl(config: Config, model_path: str, run_dir: Path, resume: bool, baseline: dict | None = None) -> dict:
    """RL to `rl.steps` in `run_dir` (resuming from its last checkpoint when asked); the final
    evaluation. `baseline`: the starting model's evaluation, logged as step 0."""
    with RLTrainer(config, model_path, run_dir) as trainer:
        return trainer.run(resume=resume, baseline=baseline)


def evaluate_checkpoint(config: Config, model_path: str, out_dir: Path, settings: dict | None = None) -> dict:
    """`evaluate` of the model at `model_path` (`settings`: splits a stopped run finished with them are reused)."""
    differ = prompt_differences(config.prompt, model_path)
    if differ:
        console.print(f"[yellow]warning[/] {model_path} was trained with other prompt settings "
                      f"({', '.join('prompt.' + k for k in differ)}): evaluating with the recipe's", soft_wrap=True)
    tokenizer = load_tokenizer(model_path)
    model = load_model(model_path, config.model.dtype)
    with EnvPool(config.env, config.rl.env_pool if config.rl else None) as pool:
        sampler = HFSampler(model, tokenizer, keep_mib=keep_cache_mib(config))
        return evaluate(pool, sampler, tokenizer, config.eval, config.prompt, config.seed, out_dir, settings=settings)


def rl_settings(config: Config) -> dict:
    """What an RL run's steps depend on (its starting model aside)."""
    return {**config_settings(config, "seed", "model.dtype", "env", "prompt", "sampling", "rl", exclude=RL_CONTINUABLE),
            **plugin_fingerprints(config)}


# --- the pipeline ---------------------------------------------------------------------------------
def run_pipeline(config: Config, restart: bool = False) -> dict:
    """The recipe's phases; the summary (an empty dict on ranks other than 0). Under torchrun /
    accelerate launch, SFT and RL run on every rank (sharded as `sft.actor` and `rl.actor` say);
    the other phases (init, evaluations, expert data) run on rank 0 while the other ranks wait (up
    to PIPELINE_WAIT); rank 0 writes the summary."""
    distributed.init_from_env(timeout=PIPELINE_WAIT)
    world = distributed.world()
    if config.rl is not None and config.rl.steps > 0:
        check_ranks(config.rl, world)  # before any phase: nothing is redone in vain
    if config.sft is not None:
        check_launch(config.sft.actor, "sft.actor", world)
    plan = distributed.on_main(lambda: _until_sft(config, restart))
    if plan["train_sft"]:
        with timed(plan["seconds"], "sft"):  # with its DAgger rounds
            sft_phase(config, plan["model_path"], plan["sft_data"], plan["sft_out"], plan["sft_settings"],
                      plan["seconds"])
        _record_seconds(config, plan["seconds"], "sft", "dagger")
    plan = distributed.on_main(lambda: _until_rl(config, plan))
    results, seconds = plan["results"], plan["seconds"]
    if plan["train_rl"]:
        rl_dir = Path(config.run_dir) / "rl"
        with timed(seconds, "rl"):  # with its evaluations
            results["rl"] = train_rl(config, plan["model_path"], rl_dir, resume=True,
                                     baseline=results.get("sft", results.get("initial")))
        if distributed.is_main():  # over every run that continued it: its last checkpoint's record
            seconds["rl"] = read_state(latest_checkpoint(rl_dir)).get("seconds", seconds["rl"])
            _record_seconds(config, seconds, "rl")
    if not distributed.is_main():
        distributed.shutdown()
        return {}
    run_dir = Path(config.run_dir)
    if plan["train_rl"]:
        (run_dir / "eval" / "rl").mkdir(parents=True, exist_ok=True)
        write_atomic(run_dir / "eval" / "rl" / "results.json", json.dumps(results["rl"], indent=2))
        Phases(run_dir).complete("eval rl", plan["eval_settings"])
    if "rl" in results:
        _print_phase("rl", results["rl"])
    summary = {"run_dir": str(run_dir), "splits": config.eval.splits, "episodes": config.eval.episodes,
               "phases": results, "seconds": _phase_log(config, seconds, results)}
    write_atomic(run_dir / "summary.json", json.dumps(summary, indent=2))
    save_config(config, run_dir / "config.yaml")
    print_summary(summary)
    distributed.shutdown()
    return summary


def _until_sft(config: Config, restart: bool) -> dict:
    """The phases before SFT (rank 0) and what SFT is to do. The plan: {results, seconds,
    model_path (the next phase's starting model), upstream (the settings it depends on),
    train_sft (False: no SFT, or its model is reusable), sft_data, sft_out, sft_settings}."""
    run_dir = Path(config.run_dir)
    if config.model.path is None:
        raise ConfigError("model.path: the pipeline needs a model (a local folder or hub id) or an `init` section")
    if config.init is None:
        resolve_model(config.model.path)  # a wrong path fails now, not after a phase
    if config.sft is not None and config.sft.data is not None and not Path(config.sft.data).is_file():
        raise ConfigError(f"sft.data: {config.sft.data} does not exist")
    if config.init is not None and config.init.corpus is not None and not Path(config.init.corpus).is_file():
        raise ConfigError(f"init.corpus: {config.init.corpus} does not exist")
    if restart:
        (run_dir / "phases.json").unlink(missing_ok=True)
        for path in [run_dir / "sft", run_dir / "rl", run_dir / "eval",
                     *([Path(config.model.path)] if config.init is not None else [])]:
            shutil.rmtree(path, ignore_errors=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    phases = _phases(run_dir)
    torch.manual_seed(config.seed)

    model_path, plugins = config.model.path, plugin_fingerprints(config)
    seconds: dict[str, float] = {}  # of the phases run now
    if config.init is not None:
        settings = {**text_settings(config), **config_settings(config, "init"), **plugins, "model.path": model_path}
        if config.init.corpus is not None:
            settings["init.corpus.fingerprint"] = _file_fingerprint(Path(config.init.corpus))
        if not phases.reusable("init", settings, (Path(model_path) / "config.json").exists()):
            with timed(seconds, "init"):
                make_tiny_model(config, model_path)
            _record_seconds(config, seconds, "init")
            phases.complete("init", settings)
    upstream = {"model.path": model_path, "model.fingerprint": folder_fingerprint(model_path),
                "model.dtype": config.model.dtype, **plugins}
    results = {"initial": _eval_phase(config, phases, "initial", model_path, upstream, seconds)} \
        if config.eval.initial else {}
    plan = {"results": results, "seconds": seconds, "model_path": model_path, "upstream": upstream,
            "train_sft": False}
    if config.sft is None:
        return plan

    sft_dir = run_dir / "sft"
    if config.sft.data is not None:
        data = Path(config.sft.data)
        data_settings = {"sft.data": str(data), "sft.data.fingerprint": _file_fingerprint(data)}
    else:
        data = sft_dir / "data.jsonl"
        data_settings = {**text_settings(config), **config_settings(config, "sft.episodes", "sft.judgments",
                                                                      "sft.detours", "sft.keep_failed"),
                         **plugins}
        if not phases.reusable("expert data", data_settings, data.exists()):
            data.parent.mkdir(parents=True, exist_ok=True)
            with timed(seconds, "expert data"):
                stats = expert_data(config, data, config.sft.episodes, config.sft.judgments)
            _record_seconds(config, seconds, "expert data")
            console.print(f"[bold]expert data[/] {stats} -> {data}", soft_wrap=True)
            phases.complete("expert data", data_settings)
    settings = {**upstream, **data_settings, **config_settings(config, "seed", "sft", exclude=SFT_CONTINUABLE)}
    if config.sft.dagger is not None:  # the rounds play in the environment, with the prompt
        settings.update({f"dagger.{key}": value for key, value in config_settings(config, "env", "prompt").items()})
    plan.update(sft_data=str(data), sft_out=str(sft_dir / "model"), sft_settings=settings,
                train_sft=not phases.reusable("sft", settings, (sft_dir / "model" / "config.json").exists()))
    return plan


def _until_rl(config: Config, plan: dict) -> dict:
    """SFT's evaluation and the plan of RL (rank 0), after `_until_sft`'s `plan`: adds train_rl
    (False: no RL, or its results are reusable) and eval_settings; model_path is RL's start."""
    run_dir = Path(config.run_dir)
    phases = _phases(run_dir)
    results, seconds, upstream = plan["results"], plan["seconds"], plan["upstream"]
    if config.sft is not None:
        if plan["train_sft"]:
            phases.complete("sft", plan["sft_settings"])
        model_path = plan["sft_out"]
        upstream = {**plan["sft_settings"], "sft.fingerprint": folder_fingerprint(model_path)}
        results["sft"] = _eval_phase(config, phases, "sft", model_path, upstream, seconds)
        plan["model_path"] = model_path

    plan.update(train_rl=False, eval_settings=None)
    if config.rl is not None and config.rl.steps > 0:
        rl_dir = run_dir / "rl"
        settings = {**upstream, **rl_settings(config)}
        if not phases.same("rl", settings):
            phases.reusable("rl", settings, rl_dir.exists())  # says why it runs
            shutil.rmtree(rl_dir, ignore_errors=True)  # steps taken with other settings
            phases.complete("rl", settings)  # before training: a stopped run resumes only with these
        plan["eval_settings"] = {**settings, "rl.steps": config.rl.steps,
                                 **config_settings(config, "eval", exclude=EVAL_GUARDS)}
        done = run_dir / "eval" / "rl" / "results.json"
        if phases.reusable("eval rl", plan["eval_settings"], done.exists()):
            results["rl"] = json.loads(done.read_text())
        else:
            ckpt = latest_checkpoint(rl_dir)
            if ckpt is not None:
                console.print(f"[bold]rl[/] continuing from {ckpt.name} to step {config.rl.steps}")
            plan["train_rl"] = True
    return plan


def _phases(run_dir: Path) -> Phases:
    return Phases(run_dir, say=lambda line: console.print(f"[bold]phase[/] {line}"))


def _record_seconds(config: Config, seconds: dict[str, float], *phases: str) -> None:
    """The `phases`' seconds written into run_dir/logs/phase_seconds.json as soon as they end (rank
    0), so a later phase that stops or fails does not lose them."""
    if not distributed.is_main():
        return
    path = Path(config.run_dir) / "logs" / "phase_seconds.json"
    recorded = json.loads(path.read_text()) if path.exists() else {}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps({**recorded, **{p: seconds[p] for p in phases if p in seconds}}, indent=2))


def _phase_log(config: Config, now: dict[str, float], results: dict[str, dict]) -> dict[str, float]:
    """Seconds per phase, the phases run now merged into those of earlier runs of the folder (a
    reused phase keeps its time), written with each phase's evaluation to run_dir/logs: scalars
    phase_s/<phase> and phase_eval/<split>/success at step 0, 1, 2 for the initial,
    post-SFT and post-RL models (the first one evaluated also carries the times). Returns the seconds."""
    run_dir = Path(config.run_dir)
    path = run_dir / "logs" / "phase_seconds.json"
    seconds = {**(json.loads(path.read_text()) if path.exists() else {}), **now}
    shutil.rmtree(run_dir / "logs", ignore_errors=True)  # written anew: one point per phase
    tracker = Tracker(run_dir / "logs", config=config, name="phases")
    for number, (phase, split_results) in enumerate(results.items()):
        metrics = {f"phase_eval/{split}/success": r["success"] for split, r in split_results.items()}
        times = {f"phase_s/{name}": value for name, value in seconds.items()} if number == 0 else {}
        tracker.log(("initial", "sft", "rl").index(phase), {**times, **metrics})
    tracker.close()
    write_atomic(path, json.dumps(seconds, indent=2))
    return seconds


def _eval_phase(config: Config, phases: Phases, name: str, model_path: str, upstream: dict,
                seconds: dict[str, float]) -> dict:
    out_dir = Path(config.run_dir) / "eval" / name
    settings = {**upstream, **config_settings(config, "seed", "env", "prompt", "eval", exclude=EVAL_GUARDS)}
    if phases.reusable(f"eval {name}", settings, (out_dir / "results.json").exists()):
        results = json.loads((out_dir / "results.json").read_text())
    else:
        with timed(seconds, f"eval {name}"):
            results = evaluate_checkpoint(config, model_path, out_dir, settings)
        _record_seconds(config, seconds, f"eval {name}")
        phases.complete(f"eval {name}", settings)
    _print_phase(name, results)
    return results


def _file_fingerprint(path: Path) -> str | None:
    if not path.is_file():
        return None
    stat = path.stat()
    return f"{stat.st_size}:{stat.st_mtime_ns}"


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
            aborted = f" ({r['aborted']} aborted)" if r.get("aborted") else ""
            cells.append(f"{r['success'] * 100:5.1f}% [{low * 100:.0f}-{high * 100:.0f}]{aborted}")
        table.add_row(phase, *cells)
    console.print(table)


def print_task_types(results: dict) -> None:
    """Successes / episodes per task type (rows) and split (columns)."""
    kinds = sorted({kind for r in results.values() for kind in r.get("per_task_type_counts", {})})
    table = Table(title="Successes per task type")
    table.add_column("task type")
    for split in results:
        table.add_column(split.upper(), justify="right")
    for kind in kinds:
        cells = []
        for r in results.values():
            count = r.get("per_task_type_counts", {}).get(kind)
            cells.append(f"{count['success']}/{count['episodes']}" if count else "-")
        table.add_row(kind, *cells)
    console.print(table)
