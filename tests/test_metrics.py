"""An update's metrics: each kind reduced its own way over micro-batches, optimiser steps and ranks;
the sampler check by hand."""

import json
import math
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import leaves_like_a_launched_rank

from agentrl.losses.step import sampler_check, sampler_gap
from agentrl.metrics import LossOutputs, Tally


def outputs(per_token, per_update, counts, largest) -> LossOutputs:
    return LossOutputs(torch.zeros(()), per_token=per_token, per_update=per_update, counts=counts, largest=largest)


def test_each_kind_reduces_its_own_way():
    tally = Tally()
    tally.add(outputs({"pg": torch.tensor(3.0)}, {"lr": 0.1}, {"skipped": 1.0}, {"gap": torch.tensor(0.5)}))
    tally.add(outputs({"pg": torch.tensor(5.0)}, {"lr": 0.3}, {"skipped": 0.0}, {"gap": torch.tensor(0.2)}))
    report = tally.report(n_tokens=4, n_updates=2)
    assert report == pytest.approx({"pg": 2.0, "lr": 0.2, "skipped": 1.0, "gap": 0.5})


def test_parts_add_their_losses_and_keep_their_metrics():
    a = LossOutputs(torch.tensor(1.5), per_token={"pg": 2.0})
    b = LossOutputs(torch.tensor(-0.5), per_token={"entropy": 3.0}, largest={"gap": 1.0})
    total = a + b
    assert float(total.loss) == 1.0 and total.per_token == {"pg": 2.0, "entropy": 3.0} and total.largest == {"gap": 1.0}


def test_the_sampler_gap_by_hand():
    actor, sampler = torch.tensor([-1.0, -2.5, -0.5]), torch.tensor([-1.0, -1.5, -1.0])
    log_ratio = [0.0, -1.0, 0.5]  # log p_actor / p_sampler; the largest gap is below 0
    tally = Tally().add(sampler_check(actor[:2] - sampler[:2])).add(sampler_check(actor[2:] - sampler[2:]))
    gap = sampler_gap(tally)
    assert gap["rollout/logprob_diff_mean"] == pytest.approx(1.5 / 3)
    assert gap["rollout/logprob_diff_max"] == pytest.approx(1.0)
    # KL(sampler || actor) from tokens the sampler drew: mean of p_a/p_s - 1 - log(p_a/p_s)
    assert gap["rollout/kl_sampler_actor"] == pytest.approx(sum(math.exp(r) - 1 - r for r in log_ratio) / 3)
    assert not tally.counts and not tally.largest  # taken out of the update's other metrics
    assert sampler_gap(Tally()) == {}  # a step without the check reports none


def on_two_ranks(rank_fn, out_dir) -> None:
    """`rank_fn(rank, world, port, out_dir)` on 2 spawned gloo ranks."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(rank_fn, args=(2, port, out_dir), nprocs=2)


@leaves_like_a_launched_rank
def ranks_tally(rank, world, port, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        mine = ([outputs({"pg": 1.0}, {"aux": 0.25}, {}, {"gap": 0.1})] if rank == 0 else
                [outputs({"pg": 2.0}, {"aux": 0.5}, {"tokens": 5.0}, {"gap": 0.7}),
                 outputs({"pg": 4.0}, {}, {}, {"gap": 0.3})])
        tally = Tally()
        for out in mine:
            tally.add(out)
        total = tally.over_ranks()
        (out_dir / f"rank{rank}.json").write_text(json.dumps(total.__dict__))
    finally:
        dist.destroy_process_group()


def test_ranks_sum_their_sums_and_take_the_largest_maximum(tmp_path):
    on_two_ranks(ranks_tally, tmp_path)
    for rank in (0, 1):  # every rank holds the same totals; a metric rank 0 lacked counts as 0 there
        total = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert total == {"per_token": {"pg": 7.0}, "per_update": {"aux": 0.75}, "counts": {"tokens": 5.0},
                         "largest": {"gap": pytest.approx(0.7)}}


@leaves_like_a_launched_rank
def ranks_helpers(rank, world, port, out_dir):
    from agentrl import distributed

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        logged = {"a": 1.0, "b": 2.0} if rank == 0 else {"a": 3.0, "c": 5.0}  # each rank lacks one key
        found = {"mean": distributed.mean_metrics(logged), "gather": distributed.gather([f"r{rank}a", f"r{rank}b"]),
                 "union": distributed.union(list(logged)), "max": distributed.all_max(-rank * 2.0 + 1.0),
                 "sum": distributed.all_sum([rank + 1.0, 10.0, 2.0**24 + rank]), "main": distributed.on_main(lambda: rank + 7)}
        try:  # rank 0's work fails: it raises its error, every other rank stops too
            distributed.on_main(lambda: 1 / 0)
        except Exception as err:
            found["failed"] = f"{type(err).__name__}: {err}"
        (out_dir / f"rank{rank}.json").write_text(json.dumps(found))
    finally:
        dist.destroy_process_group()


def test_rank_helpers_average_each_key_over_the_ranks_that_logged_it_and_gather_in_rank_order(tmp_path):
    on_two_ranks(ranks_helpers, tmp_path)
    for rank in (0, 1):
        found = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert found["mean"] == {"a": 2.0, "b": 2.0, "c": 5.0}  # b and c: the one rank that logged them
        assert found["gather"] == (["r0a", "r0b", "r1a", "r1b"] if rank == 0 else [])
        assert found["union"] == ["a", "b", "c"]
        assert found["max"] == 1.0 and found["sum"] == [3.0, 20.0, 2.0**25 + 1] and found["main"] == 7
        failed = "ZeroDivisionError: division by zero"
        assert found["failed"] == (failed if rank == 0 else f"RunError: rank 0 stopped ({failed})")


def test_a_resumed_tracker_replaces_what_was_logged_after_its_checkpoint(tmp_path):
    """Steps logged after the checkpoint a run resumes from are logged again: metrics.jsonl and
    TensorBoard then hold each step once, with the resumed run's values, and the config panel
    once, from the start."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from agentrl.recipe import validate_config
    from agentrl.tracking import Tracker, read_metrics

    config = validate_config({"env": {"type": "household"}})
    first = Tracker(tmp_path, config=config)
    for step in range(1, 5):
        first.log(step, {"loss": float(step)})
    first.close()
    resumed = Tracker(tmp_path, resume_step=2, config=config)
    for step in (3, 4):
        resumed.log(step, {"loss": 10.0 * step})
    resumed.close()
    expected = [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0)]
    assert [(r["step"], r["loss"]) for r in read_metrics(tmp_path / "metrics.jsonl")] == expected
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss")] == expected
    assert [e.step for e in events.Tensors("config/text_summary")] == [0]  # the config once, from the start


def test_the_plot_panels_draw_the_metrics_they_name():
    """Each figure of `agentrl plot` draws the series its legend names, the evaluation band spans
    each step's interval, and the step-time bars stack into the step's seconds."""
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from agentrl import plot

    rows = [{"step": 0, "eval/l0/success": 0.5, "eval/l0/ci95_low": 0.3, "eval/l0/ci95_high": 0.7},
            {"step": 1, "rollout/success": 0.25, "rollout/episode_reward": 2.5, "actor/entropy": 1.5, "actor/kl": 0.01,
             "rollout/logprob_diff_mean": 1e-3, "rollout/logprob_diff_max": 1e-2, "rollout/kl_sampler_actor": 1e-4,
             "timing_s/step": 10.0, "timing_s/gen": 4.0, "timing_s/update": 3.0},
            {"step": 2, "rollout/success": 0.5, "rollout/episode_reward": 5.0, "actor/entropy": 1.25, "actor/kl": 0.02,
             "eval/l0/success": 0.6, "eval/l0/ci95_low": 0.4, "eval/l0/ci95_high": 0.8}]

    def drawn(draw, data):
        fig, ax = plt.subplots()
        draw(ax, data)
        lines = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for a in fig.axes for line in a.lines}
        bands = {tuple(map(float, xy)) for c in ax.collections for path in c.get_paths() for xy in path.vertices}
        bars = {c.get_label(): [p.get_height() for p in c] for c in ax.containers}
        plt.close(fig)
        return lines, bands, bars

    lines, bands, _ = drawn(plot._eval_success, rows)
    assert lines == {"L0": ([0, 2], [0.5, 0.6])}
    assert {(0.0, 0.3), (0.0, 0.7), (2.0, 0.4), (2.0, 0.8)} <= bands
    assert drawn(plot._rollout, rows)[0] == {"success": ([1, 2], [0.25, 0.5]), "episode reward": ([1, 2], [2.5, 5.0])}
    assert drawn(plot._kl_entropy, rows)[0] == {"entropy": ([1, 2], [1.5, 1.25]), "KL to reference": ([1, 2], [0.01, 0.02])}
    assert drawn(plot._sampler_gap, rows)[0] == {"mean |log p diff|": ([1], [1e-3]), "max |log p diff|": ([1], [1e-2]),
                                                 "KL(sampler || actor)": ([1], [1e-4])}
    assert drawn(plot._step_time, rows)[2] == {"gen": [4.0], "update": [3.0], "other": [3.0]}
    assert drawn(plot._sft_loss, [{"step": 5, "sft/loss": 0.7}])[0] == {"loss": ([5], [0.7])}

