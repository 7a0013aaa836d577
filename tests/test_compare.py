"""`agentrl compare` and its statistics: hand-computed values, pairing by seed, and a real two-method,
two-seed comparison in which one method is better by construction."""

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as scipy_stats

from agentrl import stats
from agentrl.cli import main
from agentrl.compare import Run, markdown, paired, plot_curves, read_run, summarize, train_methods, write_report
from agentrl.config import ConfigError
from agentrl.rollout.records import read_trajectories

import twostep


# --- statistics, by hand ---------------------------------------------------------------------------
def test_two_seed_bootstrap_interval_is_the_two_values_not_a_pooled_episode_interval():
    # Resampling 2 seeds gives means a, (a+b)/2, b with probabilities 1/4, 1/2, 1/4: the 2.5% and
    # 97.5% percentiles are a and b. Pooling their 200 episodes would give about [0.43, 0.57].
    assert stats.interval([0.2, 0.8]) == pytest.approx((0.2, 0.8))
    assert stats.interval([0.5]) == (0.5, 0.5)


def test_probability_of_improvement_counts_ties_half():
    # 0.6 beats 0.5, ties 0.6: 1.5; 0.7 beats 0.5 and 0.6, ties 0.7: 2.5; 0.8 beats all: 3 -> 7/9.
    assert stats.probability_of_improvement([0.6, 0.7, 0.8], [0.5, 0.7, 0.6]) == pytest.approx(7 / 9)
    low, high = stats.improvement_interval([0.6, 0.7, 0.8], [0.5, 0.7, 0.6])
    assert 0 <= low <= 7 / 9 <= high <= 1


def test_intervals_are_the_same_on_every_call_and_the_band_holds_the_mean():
    """The report is reproducible (its bootstrap resamples seeded), and the curves' band has both
    edges: below and above the mean where the seeds differ."""
    values = [0.1, 0.35, 0.2, 0.6, 0.45, 0.13, 0.77, 0.52, 0.29, 0.41]
    assert stats.interval(values) == stats.interval(values)
    assert stats.improvement_interval(values, values[::-1]) == stats.improvement_interval(values, values[::-1])
    curves = np.array([[0.0, 0.2, 0.5], [0.1, 0.4, 0.6], [0.3, 0.3, 0.9]])
    low, high = stats.band(curves)
    assert np.all(low < curves.mean(axis=0)) and np.all(curves.mean(axis=0) < high)
    again = stats.band(curves)
    assert np.array_equal(again[0], low) and np.array_equal(again[1], high)
    one = stats.band(curves[:1])  # one seed: no spread to resample, both edges the curve itself
    assert np.array_equal(one[0], curves[0]) and np.array_equal(one[1], curves[0])


def test_the_band_is_per_step_over_seeds_seeded_and_as_wide_as_its_confidence_asks():
    """Each step's edges are the seeded bootstrap percentiles over the seeds at the confidence
    asked: a pair of edges per step, the same on every call, the 95% band holding the 50% one
    strictly (8 seeds of 2 steps: too many resamples for the percentiles to repeat by chance)."""
    curves = np.random.default_rng(3).uniform(size=(8, 2))
    wide, narrow = stats.band(curves), stats.band(curves, confidence=0.5)
    assert wide[0].shape == wide[1].shape == (2,)
    assert np.all(wide[0] < narrow[0]) and np.all(narrow[1] < wide[1])
    assert np.all(narrow[0] < curves.mean(axis=0)) and np.all(curves.mean(axis=0) < narrow[1])
    again = stats.band(curves)
    assert np.array_equal(again[0], wide[0]) and np.array_equal(again[1], wide[1])


def test_iqm_is_the_mean_of_the_middle_half():
    assert stats.iqm([0, 1, 2, 3, 4, 5, 6, 100]) == pytest.approx(3.5)  # 2, 3, 4, 5
    assert stats.iqm([9, 1, 5, 3]) == pytest.approx(4.0)  # 3, 5


def test_variance_components_by_hand():
    seeds = [[1.0] * 50 + [0.0] * 50, [1.0] * 70 + [0.0] * 30]  # 100 episodes each: 0.5, 0.7
    parts = stats.components([0.5, 0.7], seeds)
    within_var = (0.25 * 100 / 99 + 0.21 * 100 / 99) / 2 / 100  # sample variance / n, averaged
    assert parts.total_sd == pytest.approx(math.sqrt(0.02))
    assert parts.within_sd == pytest.approx(math.sqrt(within_var))
    assert parts.between_sd == pytest.approx(math.sqrt(0.02 - within_var))
    assert parts.episodes == 100
    uneven = stats.components([0.5, 0.7], [[1.0] * 5 + [0.0] * 5, [1.0] * 21 + [0.0] * 9])
    assert uneven.episodes == 20  # the mean over seeds of their episodes (10 and 30)


def test_detectable_difference_by_hand():
    parts = stats.Components(total_sd=0.1, within_sd=0.0, between_sd=0.1, episodes=100)
    # two-sided 5% paired t-test, 80% power, 5 seeds: (t_.975,4 + t_.8,4) * sd / sqrt(5)
    assert stats.detectable_difference(parts, 5) == pytest.approx((2.7764 + 0.9410) * 0.1 / math.sqrt(5), rel=1e-3)
    assert stats.detectable_difference(parts, 1) == math.inf
    noisy = stats.Components(total_sd=0.1, within_sd=0.08, between_sd=0.06, episodes=100)
    # 4x the episodes divides the evaluation variance by 4 and leaves the training variance
    expected = (scipy_stats.t.ppf(0.975, 4) + scipy_stats.t.ppf(0.8, 4)) * math.sqrt((0.06 ** 2 + 0.08 ** 2 / 4) / 5)
    assert stats.detectable_difference(noisy, 5, 400) == pytest.approx(expected)
    needed = stats.seeds_needed(parts, 0.05)
    assert stats.detectable_difference(parts, needed) <= 0.05 < stats.detectable_difference(parts, needed - 1)
    assert stats.seeds_needed(parts, stats.detectable_difference(parts, 2)) == 2  # the fewest a t-test can use


def test_t_interval_by_hand_and_wider_than_the_bootstrap_at_five_seeds():
    # randkey's GiGPO - GRPO on L0 per seed (points): mean 7.2, sd 5.98; t_.975,4 = 2.7764.
    diffs = [0.11, 0.07, 0.10, 0.11, -0.03]
    half = 2.7764 * np.std(diffs, ddof=1) / math.sqrt(5)
    assert stats.t_interval(diffs) == pytest.approx((0.072 - half, 0.072 + half), abs=1e-4)
    low, high = stats.interval(diffs)
    assert stats.t_interval(diffs)[0] < low and high < stats.t_interval(diffs)[1]
    assert stats.t_pvalue(diffs) == pytest.approx(scipy_stats.ttest_1samp(diffs, 0).pvalue)
    assert 0.05 < stats.t_pvalue(diffs) < 0.06  # the bootstrap excludes 0, the t-test does not
    assert stats.t_interval([0.03] * 5) == (0.03, 0.03) and stats.t_pvalue([0.03] * 5) is None
    # Two seeds, the fewest with a spread: t_.975,1 = 12.706, sd 0.28284: half 12.706 x 0.28284 / sqrt(2).
    assert stats.t_interval([0.2, 0.6]) == pytest.approx((0.4 - 2.54124, 0.4 + 2.54124), abs=1e-4)


# --- pairing ---------------------------------------------------------------------------------------
def _runs(rates_by_seed: dict[int, float], bonus: int = 0, tasks: int = 100) -> list[Run]:
    """Runs whose task t succeeds when t < rate * tasks (+ `bonus` more tasks)."""
    return [Run(Path(f"seed{seed}"), seed, {"l0": {f"l0-{t}": float(t < round(rate * tasks) + bonus)
                                                   for t in range(tasks)}})
            for seed, rate in rates_by_seed.items()]


def test_paired_difference_sees_a_small_gain_that_seed_spread_hides():
    # Seeds differ by up to 60 points (training luck); method A solves 3 more tasks at every seed.
    seed_luck = {1: 0.2, 2: 0.8, 3: 0.5, 4: 0.3, 5: 0.65}
    a, b = _runs(seed_luck, bonus=3), _runs(seed_luck)
    summary = summarize({"a": a, "b": b})
    pair = summary["pairs"]["a - b"]["l0"]
    assert pair["difference"] == pytest.approx(0.03) and pair["ci95"] == pytest.approx((0.03, 0.03))
    assert pair["seeds_a_better"] == 5 and pair["p_improvement"] == pytest.approx(0.6)  # unpaired: 15 of 25
    low_a, high_a = summary["methods"]["a"]["l0"]["ci95"]
    low_b, high_b = summary["methods"]["b"]["l0"]["ci95"]
    assert low_a < high_b and low_b < high_a  # the unpaired intervals overlap widely


def test_pairs_are_matched_by_seed_whatever_the_order():
    luck = {1: 0.2, 2: 0.8, 3: 0.5}
    forward = paired(_runs(luck, bonus=2), _runs(luck), ["l0"])
    shuffled = paired(_runs(luck, bonus=2), list(reversed(_runs(luck))), ["l0"])
    assert forward["l0"]["per_seed"] == shuffled["l0"]["per_seed"] == pytest.approx([0.02] * 3)
    missing = paired(_runs(luck, bonus=2), _runs({1: 0.2, 3: 0.5, 9: 0.1}), ["l0"])
    assert missing["seeds"] == [1, 3]
    # P(A>B) over the paired seeds only: A's 0.22 / 0.52 against B's 0.2 / 0.5 wins 3 of 4 (with
    # B's unpaired seed 9 at 0.1 it would be 5 of 6).
    assert missing["l0"]["p_improvement"] == pytest.approx(3 / 4)


def test_paired_difference_is_taken_task_by_task_on_the_tasks_both_played():
    a = [Run(Path("a"), 1, {"l0": {"x": 1.0, "y": 0.0, "z": 1.0}})]
    b = [Run(Path("b"), 1, {"l0": {"x": 0.0, "y": 0.0}})]  # z aborted for b: left out of the pair
    assert paired(a, b, ["l0"])["l0"]["per_seed"] == pytest.approx([0.5])


# --- the report, by hand ---------------------------------------------------------------------------
def _row(report: str, pair: str) -> list[str]:
    [line] = [row for row in report.splitlines() if row.startswith(f"| {pair} | L0 |")]
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_report_states_every_column_by_hand_in_both_directions():
    # 10 tasks; seed by seed A wins 8 / 6 / 9 and B 6 / 5 / 5 (the first k tasks): paired
    # differences +0.2 / +0.1 / +0.4. Resampling 3 seeds, the lowest mean 0.1 (1 in 27) and the
    # highest 0.4 (1 in 27) lie beyond the 2.5% tails: the bootstrap interval is [0.1, 0.4], it
    # excludes 0. The t-interval, mean 0.2333 +- t(.975, 2) x sd 0.1528 / sqrt(3), holds 0.
    def runs(wins):
        return [Run(Path(f"seed{seed}"), seed, {"l0": {f"t{t}": float(t < k) for t in range(10)}})
                for seed, k in enumerate(wins)]

    diffs = np.array([0.2, 0.1, 0.4])
    mean, sd = diffs.mean(), diffs.std(ddof=1)
    half = scipy_stats.t.ppf(0.975, 2) * sd / math.sqrt(3)
    p_value = 2 * scipy_stats.t.sf(mean / (sd / math.sqrt(3)), 2)
    within_var = np.mean([np.var([1.0] * d + [0.0] * (10 - d), ddof=1) / 10 for d in (2, 1, 4)])
    between_var = sd ** 2 - within_var

    def mdd(seeds, episodes_factor=1):
        quantiles = scipy_stats.t.ppf(0.975, seeds - 1) + scipy_stats.t.ppf(0.8, seeds - 1)
        return quantiles * math.sqrt((between_var + within_var / episodes_factor) / seeds)

    def seeds_for(difference):
        return next(n for n in range(2, 1000) if mdd(n) <= difference)

    a, b = runs([8, 6, 9]), runs([6, 5, 5])
    p_a = (3 + 2.5 + 3) / 9  # A's 0.8 and 0.9 beat every B rate; its 0.6 beats two and ties one
    for first, second, sign in (("a", "b", 1), ("b", "a", -1)):
        summary = summarize({first: a if sign == 1 else b, second: b if sign == 1 else a})
        cells = _row(markdown(summary), f"{first} - {second}")
        low, high = sorted((sign * 0.1, sign * 0.4))
        t_low, t_high = sorted((sign * (mean - half), sign * (mean + half)))
        poi = p_a if sign == 1 else 1 - p_a
        poi_low, poi_high = summary["pairs"][f"{first} - {second}"]["l0"]["p_improvement_ci95"]
        assert cells[2] == "3"
        assert cells[3] == f"{sign * mean * 100:.1f} [{low * 100:.1f}, {high * 100:.1f}] *"
        assert cells[4] == f"[{t_low * 100:.1f}, {t_high * 100:.1f}], {p_value:.3f}"  # no mark: it holds 0
        assert cells[5] == f"{poi:.2f} [{poi_low:.2f}, {poi_high:.2f}]"
        assert poi_low <= poi <= poi_high
        assert cells[6] == ("3/3" if sign == 1 else "0/3")
        assert cells[7] == f"{math.sqrt(between_var) * 100:.1f} / {math.sqrt(within_var) * 100:.1f}"
        assert cells[8] == f"{mdd(3) * 100:.1f}"
        assert cells[9] == " / ".join(f"{mdd(n) * 100:.1f}" for n in (5, 10, 20))
        assert cells[10] == f"{mdd(3, 4) * 100:.1f}"
        assert cells[11] == f"{seeds_for(mean)} / {seeds_for(0.05)}"
    # The methods' own rows: A's rates 0.8 / 0.6 / 0.9 (bootstrap [0.6, 0.9], as above; the IQM of
    # 3 seeds trims none), and the same training / evaluation split of their spread.
    report = markdown(summarize({"a": a, "b": b})).splitlines()
    a_sd = np.std([0.8, 0.6, 0.9], ddof=1)
    a_within = np.mean([np.var([1.0] * k + [0.0] * (10 - k), ddof=1) / 10 for k in (8, 6, 9)])
    assert "| a | 3 | 76.7 [60.0, 90.0] (76.7) |" in report
    assert f"| a | 0, 1, 2 | 80 / 60 / 90 | {math.sqrt(a_sd ** 2 - a_within) * 100:.1f} / {math.sqrt(a_within) * 100:.1f} |" \
        in report
    forward = summarize({"a": a, "b": b})["pairs"]["a - b"]["l0"]["p_improvement_ci95"]
    backward = summarize({"b": b, "a": a})["pairs"]["b - a"]["l0"]["p_improvement_ci95"]
    assert backward == pytest.approx((1 - forward[1], 1 - forward[0]))
    assert forward[1] - forward[0] > 0.05  # an interval, not a point that would read the same both ways


def test_report_marks_a_t_interval_only_where_it_excludes_0():
    # The same gain at every seed but one: both intervals exclude 0 (a mark on each); one seed: no mark.
    def runs(wins):
        return [Run(Path(f"seed{seed}"), seed, {"l0": {f"t{t}": float(t < k) for t in range(10)}})
                for seed, k in enumerate(wins)]

    report = markdown(summarize({"a": runs([8, 7, 8, 7, 8]), "b": runs([5, 5, 5, 5, 6])}))
    cells = _row(report, "a - b")
    assert cells[3].endswith("] *") and cells[4].split(",")[1].endswith("] *")
    single = _row(markdown(summarize({"a": runs([8]), "b": runs([5])})), "a - b")
    assert not single[3].endswith("*") and "*" not in single[4]


def test_a_pair_without_spread_shows_a_dash_where_nothing_can_be_sized():
    # One seed, or every seed the same difference: no t-test p-value, no MDD, no seeds to detect.
    def runs(wins):
        return [Run(Path(f"seed{seed}"), seed, {"l0": {f"t{t}": float(t < k) for t in range(10)}})
                for seed, k in enumerate(wins)]

    for a, b in ((runs([8]), runs([5])), (runs([8, 7]), runs([5, 4]))):
        cells = _row(markdown(summarize({"a": a, "b": b})), "a - b")
        assert cells[3].startswith("30.0 [30.0, 30.0]")
        assert cells[4].startswith("[30.0, 30.0]") and cells[4].endswith(", -")
        assert cells[8:12] == ["-", "- / - / -", "-", "- / -"]


def test_a_tied_seed_is_counted_as_tied_not_as_a_win():
    # Seed by seed A - B: 0 (5 wins each), +0.2, -0.1: A is better at 1 of 3 seeds, B at 1, one tie.
    def runs(wins):
        return [Run(Path(f"seed{seed}"), seed, {"l0": {f"t{t}": float(t < k) for t in range(10)}})
                for seed, k in enumerate(wins)]

    a, b = runs([5, 6, 4]), runs([5, 4, 5])
    pair = summarize({"a": a, "b": b})["pairs"]["a - b"]["l0"]
    assert (pair["seeds_a_better"], pair["seeds_tied"]) == (1, 1)
    assert _row(markdown(summarize({"a": a, "b": b})), "a - b")[6] == "1/3"
    assert _row(markdown(summarize({"b": b, "a": a})), "b - a")[6] == "1/3"


def test_methods_without_a_common_seed_are_not_paired():
    a, b = _runs({1: 0.2, 2: 0.8}), _runs({3: 0.5})
    assert paired(a, b, ["l0"]) == {"seeds": []}
    assert not [row for row in markdown(summarize({"a": a, "b": b})).splitlines() if row.startswith("| a - b |")]


def test_runs_without_a_common_evaluation_task_are_refused():
    a = [Run(Path("a"), 1, {"l0": {"x": 1.0}})]
    b = [Run(Path("b"), 1, {"l0": {"y": 0.0}})]
    with pytest.raises(ConfigError, match="a and b: no evaluation task of l0 in common"):
        paired(a, b, ["l0"])


def test_each_pair_of_methods_is_reported_once_in_the_order_given():
    luck = {1: 0.2, 2: 0.8}
    summary = summarize({"a": _runs(luck, bonus=1), "b": _runs(luck), "c": _runs(luck, bonus=2)})
    assert list(summary["pairs"]) == ["a - b", "a - c", "b - c"]


def test_a_zero_difference_is_reported_as_0_not_as_a_dash():
    luck = {1: 0.2, 2: 0.8}
    assert _row(markdown(summarize({"a": _runs(luck), "b": _runs(luck)})), "a - b")[3].startswith("0.0 [0.0, 0.0]")


def test_the_curves_plot_the_steps_every_seed_logged_and_only_curves_of_two_points(tmp_path):
    pytest.importorskip("matplotlib")

    def run(seed, steps):
        return Run(Path(f"seed{seed}"), seed, {}, metrics=[{"step": s, "rollout/success": 0.1 * s} for s in steps])

    path = tmp_path / "curves.png"
    assert plot_curves({"a": [run(1, [1, 2, 3]), run(2, [1, 2])]}, path) == path and path.stat().st_size > 0
    once = tmp_path / "once.png"  # one logged point per seed: no curve, so no plot
    assert plot_curves({"a": [run(1, [1]), run(2, [1])]}, once) is None and not once.exists()


def test_p_improvement_resamples_seeds_in_pairs():
    # A's rates 0.3 / 0.7 over B's 0.2 / 0.6, seed by seed. Seeds resampled in pairs, every resample
    # holds some A run above its own B run: P(A>B) is 1 (one seed twice) or 3/4 (both), never below.
    # Resampled apart, A's 0.3 twice against B's 0.6 twice (1 in 16) gives 0.
    def runs(wins):
        return [Run(Path(f"seed{seed}"), seed, {"l0": {f"t{t}": float(t < k) for t in range(10)}})
                for seed, k in enumerate(wins)]

    pair = summarize({"a": runs([3, 7]), "b": runs([2, 6])})["pairs"]["a - b"]["l0"]
    assert pair["p_improvement"] == pytest.approx(3 / 4)
    assert pair["p_improvement_ci95"] == pytest.approx((0.75, 1.0))


def test_p_improvements_interval_is_the_95_percent_one_of_every_paired_resample():
    """At 4 seeds every paired resample (4^4, equally likely) can be enumerated: the interval's lower
    end is the 2.5% quantile of P(A>B) over them (0.1875; the 5% quantile is 0.25). The level falls
    between the cumulative 0.8% and 3.9%, far from an edge for 10,000 resamples."""
    import itertools

    a_wins, b_wins = [6, 10, 14, 8], [4, 12, 10, 9]  # of 20 tasks

    def runs(wins):
        return [Run(Path(f"seed{seed}"), seed, {"l0": {f"t{t}": float(t < k) for t in range(20)}})
                for seed, k in enumerate(wins)]

    def p_better(x, y):
        return sum((u > v) + 0.5 * (u == v) for u in x for v in y) / (len(x) * len(y))

    every = sorted(p_better([a_wins[i] for i in pick], [b_wins[i] for i in pick])
                   for pick in itertools.product(range(4), repeat=4))
    assert np.quantile(every, 0.025) == 0.1875 and np.quantile(every, 0.05) == 0.25
    pair = summarize({"a": runs(a_wins), "b": runs(b_wins)})["pairs"]["a - b"]["l0"]
    assert pair["p_improvement"] == p_better(a_wins, b_wins)
    assert pair["p_improvement_ci95"][0] == pytest.approx(0.1875)


def test_an_rl_run_is_read_only_once_finished(tmp_path):
    """An RL run folder whose last evaluation is not at its rl.steps is a stopped run, not a result."""
    from agentrl.rollout.records import write_trajectories
    from agentrl.rollout.types import Trajectory

    run = tmp_path / "seed0"
    folder = run / "eval" / "step_000002"
    folder.mkdir(parents=True)
    write_trajectories(folder / "trajectories_l0.jsonl", [Trajectory("l0-0", 0, "t", [], success=True)])
    (folder / "results.json").write_text(json.dumps({"l0": {"success": 1.0}}))
    (run / "config.yaml").write_text("seed: 0\nrl: {steps: 4}\n")
    with pytest.raises(ConfigError, match="not finished"):
        read_run(run)
    folder.rename(run / "eval" / "step_000004")
    assert read_run(run).outcomes["l0"] == {"l0-0": 1.0}


def one_step_run(run: Path) -> None:
    """A finished one-step RL run folder (seed 0): one won L0 episode at its final evaluation."""
    from agentrl.rollout.records import write_trajectories
    from agentrl.rollout.types import Trajectory

    folder = run / "eval" / "step_000001"
    folder.mkdir(parents=True)
    write_trajectories(folder / "trajectories_l0.jsonl", [Trajectory("l0-0", 0, "t", [], success=True)])
    (folder / "results.json").write_text(json.dumps({"l0": {"success": 1.0}}))
    (run / "config.yaml").write_text("seed: 0\nrl: {steps: 1}\n")


def test_a_method_named_twice_is_refused(tmp_path, capsys):
    """Two `--runs` of one name would silently keep only the second."""
    for name in ("x", "y"):
        one_step_run(tmp_path / name / "seed0")
    assert main(["compare", "--runs", f"a={tmp_path / 'x'}", "--runs", f"a={tmp_path / 'y'}",
                 "--out", str(tmp_path / "o")]) == 2
    assert "named twice" in capsys.readouterr().err and not (tmp_path / "o").exists()


def test_a_methods_folder_is_found_beside_files_that_are_not_runs(tmp_path):
    """`--runs DIR`: each folder of DIR that holds run folders is a method, whatever else it holds
    (a notes file, a scratch folder); a folder holding no run is none."""
    from agentrl.compare import find_runs

    for name in ("x", "y"):
        one_step_run(tmp_path / name / "seed0")
    (tmp_path / "x" / "notes.txt").write_text("lr 1e-5\n")
    (tmp_path / "y" / "scratch").mkdir()
    (tmp_path / "plots").mkdir()
    found = find_runs([str(tmp_path)])
    assert sorted(found) == ["x", "y"] and [len(runs) for runs in found.values()] == [1, 1]


def test_a_folder_named_that_is_a_run_is_one_run_and_one_holding_none_is_refused(tmp_path, capsys):
    """`--runs name=DIR`: DIR itself when it is a run folder (one seed); a DIR that holds no run
    folder is an error naming it, not a method without runs."""
    from agentrl.compare import find_runs

    one_step_run(tmp_path / "seed0")
    assert [r.path for r in find_runs([f"a={tmp_path / 'seed0'}"])["a"]] == [tmp_path / "seed0"]
    (tmp_path / "empty").mkdir()
    assert main(["compare", "--runs", f"a={tmp_path / 'seed0'}", "--runs", f"b={tmp_path / 'empty'}",
                 "--out", str(tmp_path / "o")]) == 2
    assert f"no run folders in {tmp_path / 'empty'}" in capsys.readouterr().err and not (tmp_path / "o").exists()


def test_a_phase_is_refused_for_an_rl_run_folder(tmp_path):
    """Phases belong to `agentrl run` folders: asking an RL run folder for its SFT phase is an error,
    not its RL result read under another name."""
    one_step_run(tmp_path / "seed0")
    assert read_run(tmp_path / "seed0", "rl").outcomes["l0"] == {"l0-0": 1.0}
    with pytest.raises(ConfigError, match="has no sft phase"):
        read_run(tmp_path / "seed0", "sft")


def test_a_methods_judge_accuracy_is_the_mean_over_its_seeds():
    def run(seed, accuracy):
        return Run(Path(f"s{seed}"), seed, {"l0": {"t0": 1.0}}, {"l0": {"judge_accuracy": accuracy}})

    summary = summarize({"gcd": [run(0, 0.5), run(1, 0.7), run(2, 0.9)]})
    assert summary["methods"]["gcd"]["l0"]["judge_accuracy"] == pytest.approx(0.7)
    assert "(100.0), judge 70.0 |" in markdown(summary)


def test_only_the_splits_every_run_has_are_compared():
    both = {"l0": {"t0": 1.0}, "l1": {"t0": 0.0}}
    summary = summarize({"a": [Run(Path("a0"), 0, both), Run(Path("a1"), 1, {"l0": {"t0": 0.0}})],
                         "b": [Run(Path("b0"), 0, both), Run(Path("b1"), 1, both)]})
    assert summary["splits"] == ["l0"] and "l1" not in summary["pairs"]["a - b"]


def test_two_runs_of_one_seed_are_refused(tmp_path):
    """Two runs of one method at the same seed would each be paired with the other method's run of
    that seed, counting it twice: the report refuses them, naming both."""
    def run(name, seed):
        return Run(Path(name), seed, {"l0": {"t0": 1.0, "t1": 0.0}})

    with pytest.raises(ConfigError, match="two runs of the same seed.*a0.*a1"):
        write_report({"a": [run("a0", 0), run("a1", 0)], "b": [run("b0", 0)]}, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    write_report({"a": [run("a0", 0), run("a1", 1)], "b": [run("b0", 0)]}, tmp_path / "out")
    assert (tmp_path / "out" / "summary.md").is_file()


# --- a real comparison -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def good_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model fine-tuned to take GOOD in every two-step state (success about 1)."""
    from agentrl.config import SFTConfig
    from agentrl.models import load_model, load_tokenizer
    from agentrl.sft import train_sft

    out = tmp_path_factory.mktemp("good")
    twostep.write_choice_data(out / "data.jsonl", actions=(twostep.GOOD,))
    train_sft(load_model(tiny_model_dir), load_tokenizer(tiny_model_dir), out / "data.jsonl",
              SFTConfig(epochs=15, batch_size=8, optim={"lr": 3e-3}), 0, out / "model")
    return out / "model"


def _success_from_files(run_dir: Path, split: str) -> float:
    [final] = sorted(run_dir.glob("eval/step_*"))[-1:]
    trajectories = read_trajectories(final / f"trajectories_{split}.jsonl")
    return sum(t.success for t in trajectories) / len(trajectories)


def _twostep_recipe(tmp_path) -> Path:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(json.dumps({
        "imports": ["twostep"], "env": {"type": "twostep"},
        "prompt": {"template": twostep.TEMPLATE, "history_length": 1}, "sampling": {"max_new_tokens": 24},
        "rl": {"steps": 2, "tasks_per_step": 2, "group_size": 2, "optim": {"lr": 1e-7}},
        "eval": {"episodes": 4, "splits": ["l0", "l1"]}}))
    return recipe


def test_two_methods_two_seeds_end_to_end(good_model_dir, tmp_path, capsys):
    recipe = _twostep_recipe(tmp_path)
    out = tmp_path / "cmp"
    # "mute" is worse by construction: 2 new tokens cannot hold an <action> tag, so it never acts.
    # A method's own override wins over the common ones (--set): mute stays mute.
    command = ["compare", str(recipe), "--model", str(good_model_dir), "--seeds", "1", "2", "--out", str(out),
               "--set", "eval.sampling.max_new_tokens=24", "--method", "good:",
               "--method", "mute:eval.sampling.max_new_tokens=2"]
    assert main(command) == 0
    summary = json.loads((out / "summary.json").read_text())
    for split in ("l0", "l1"):
        good = [_success_from_files(out / "good" / f"seed{s}", split) for s in (1, 2)]
        mute = [_success_from_files(out / "mute" / f"seed{s}", split) for s in (1, 2)]
        assert mute == [0.0, 0.0] and min(good) > 0
        assert summary["methods"]["good"][split]["per_seed"] == pytest.approx(good)
        pair = summary["pairs"]["good - mute"][split]
        assert pair["per_seed"] == pytest.approx(good) and pair["difference"] == pytest.approx(np.mean(good))
        assert pair["ci95"][0] > 0  # the paired interval excludes 0
        assert pair["seeds_a_better"] == 2 and pair["p_improvement"] == 1.0
        episodes = [[float(t.success) for t in read_trajectories(sorted((out / "good" / f"seed{s}").glob(
            "eval/step_*"))[-1] / f"trajectories_{split}.jsonl")] for s in (1, 2)]  # mute's are all 0
        parts = stats.components(good, episodes)
        if parts.total_sd > 0:
            assert pair["mdd"] == pytest.approx(stats.detectable_difference(parts, 2)) and pair["mdd"] < math.inf
        else:  # every seed gave the same difference: nothing to size a detectable difference by
            assert pair["mdd"] is None and pair["mdd_at_seeds"]["5"] is None
        assert set(pair["mdd_at_seeds"]) == {"5", "10", "20"}
    text = (out / "summary.md").read_text()
    assert "| good - mute | L0 | 2 |" in text and "MDD" in text
    assert (out / "curves.png").stat().st_size > 0

    def eval_stamps(method):
        return [p.stat().st_mtime_ns for s in (1, 2) for p in sorted((out / method / f"seed{s}").rglob("eval/*/*"))]

    stamps = {m: eval_stamps(m) for m in ("good", "mute")}
    capsys.readouterr()
    assert main(command) == 0  # finished runs are reused, not retrained
    assert capsys.readouterr().out.count("run: done earlier with the same settings, reused") == 4
    assert {m: eval_stamps(m) for m in stamps} == stamps
    # One method's settings changed: its runs are trained and evaluated again, the other's reused.
    # Fewer steps: the old runs' step-2 evaluations go with them (else the last one read is stale).
    assert main([*command[:-1], "mute:eval.sampling.max_new_tokens=3;rl.steps=1"]) == 0
    assert capsys.readouterr().out.count("run: done earlier with the same settings, reused") == 2
    assert eval_stamps("good") == stamps["good"]
    assert min(eval_stamps("mute")) > max(stamps["mute"])
    record = json.loads((out / "mute" / "seed1" / "phases.json").read_text())
    assert record["started"] == record["run"]  # started afresh with the new settings, not continued
    from agentrl.provenance import folder_fingerprint
    assert record["run"]["model.fingerprint"] == folder_fingerprint(good_model_dir)  # a model replaced in place redoes it
    assert main(command) == 0  # back to the first settings: redone again, not the changed runs reused

    # Reading the same folders gives the same statistics, laid out or named.
    assert main(["compare", "--runs", str(out)]) == 0
    assert json.loads((out / "summary.json").read_text())["pairs"] == summary["pairs"]
    named = tmp_path / "named"
    assert main(["compare", "--runs", f"good={out / 'good'}", "--runs", f"mute={out / 'mute'}", "--out", str(named)]) == 0
    assert json.loads((named / "summary.json").read_text())["pairs"] == summary["pairs"]

    # With the coupling lab on fixed steps, --coupling-pairs of them: the runs reused, the lab's
    # numbers for the starting model those of that many pairs.
    from test_analysis import expert_and_random_episodes

    from agentrl.analysis.coupling import coupling_metrics
    from agentrl.models import load_model, load_tokenizer
    from agentrl.rollout.records import write_trajectories

    trajectories = expert_and_random_episodes()
    write_trajectories(tmp_path / "steps.jsonl", trajectories)
    assert main([*command, "--coupling", str(tmp_path / "steps.jsonl"), "--coupling-pairs", "4"]) == 0
    start = json.loads((out / "summary.json").read_text())["coupling"]["start"]
    assert start == pytest.approx(coupling_metrics(load_model(good_model_dir), load_tokenizer(good_model_dir),
                                                   trajectories, 4, 1e-3, seed=0))
    assert start != pytest.approx(coupling_metrics(load_model(good_model_dir), load_tokenizer(good_model_dir),
                                                   trajectories, 16, 1e-3, seed=0))


def test_a_method_of_no_rl_steps_evaluates_the_starting_model(good_model_dir, tmp_path):
    """`make testbed`'s `sft:rl.steps=0`: the cold start evaluated at each seed, nothing trained to export."""
    out = tmp_path / "cmp"
    assert main(["compare", str(_twostep_recipe(tmp_path)), "--model", str(good_model_dir), "--seeds", "1",
                 "2", "--out", str(out), "--method", "sft:rl.steps=0"]) == 0
    for seed in (1, 2):
        run = out / "sft" / f"seed{seed}"
        assert _success_from_files(run, "l0") > 0 and not (run / "model").exists()


def test_compare_input_errors_exit_2(tmp_path, capsys):
    assert main(["compare", "--runs", str(tmp_path / "nowhere")]) == 2
    assert "no method folders" in capsys.readouterr().err
    (tmp_path / "a" / "seed1").mkdir(parents=True)
    (tmp_path / "a" / "seed1" / "config.yaml").write_text("seed: 1\nrl: {steps: 3}\n")
    assert main(["compare", "--runs", f"a={tmp_path / 'a'}", "--runs", f"b={tmp_path / 'a'}", "--out",
                 str(tmp_path / "o")]) == 2
    assert "not a run folder" in capsys.readouterr().err
    assert main(["compare", "--runs", f"a={tmp_path / 'a'}@final"]) == 2
    assert "phase 'final'" in capsys.readouterr().err
    assert main(["compare"]) == 2
    assert "--method" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="--method 'a/b:rl.lr=1': expected name:override"):  # not a nested folder
        train_methods(str(tmp_path / "recipe.yaml"), str(tmp_path), ["a/b:rl.lr=1"], [1], tmp_path / "o", [], [])


def test_a_pipeline_folder_is_read_by_phase(tmp_path):
    """`agentrl run` folders: phase `sft` reads eval/sft, `rl` the RL phase's last evaluation."""
    from agentrl.rollout.records import write_trajectories
    from agentrl.rollout.types import Trajectory

    run = tmp_path / "seed3"
    for phase, wins in (("initial", 0), ("sft", 1), ("rl", 2)):
        folder = run / "eval" / phase if phase != "rl" else run / "rl" / "eval" / "step_000004"
        folder.mkdir(parents=True)
        write_trajectories(folder / "trajectories_l0.jsonl",
                           [Trajectory(f"l0-{i}", 0, "t", [], success=i < wins) for i in range(4)])
        (folder / "results.json").write_text(json.dumps({"l0": {"success": wins / 4, "judge_accuracy": 0.5 + wins / 10}}))
    earlier = run / "rl" / "eval" / "step_000002"  # an evaluation along the way: not the result
    earlier.mkdir()
    write_trajectories(earlier / "trajectories_l0.jsonl", [Trajectory(f"l0-{i}", 0, "t", [], success=True)
                                                            for i in range(4)])
    (earlier / "results.json").write_text(json.dumps({"l0": {"success": 1.0}}))
    (run / "eval" / "rl").mkdir()
    (run / "eval" / "rl" / "results.json").write_text("{}")  # the pipeline's mark of a finished RL phase
    (run / "phases.json").write_text("{}")
    (run / "config.yaml").write_text("seed: 3\n")
    assert read_run(run, "sft").outcomes["l0"] == {"l0-0": 1.0, "l0-1": 0.0, "l0-2": 0.0, "l0-3": 0.0}
    assert sum(read_run(run, "initial").outcomes["l0"].values()) == 0
    assert read_run(run).outcomes["l0"] == read_run(run, "rl").outcomes["l0"]
    assert sum(read_run(run).outcomes["l0"].values()) == 2 and read_run(run).seed == 3
    # a GCD judge's accuracy is read from the phase's evaluation (the other numbers come from episodes)
    assert read_run(run, "sft").extras == {"l0": {"judge_accuracy": 0.6}}
    assert read_run(run).extras == {"l0": {"judge_accuracy": 0.7}}
    shutil.rmtree(run / "rl")
    with pytest.raises(ConfigError, match="RL phase's evaluation is missing"):
        read_run(run)


def test_an_aborted_evaluation_episode_is_neither_a_failure_nor_paired(tmp_path):
    """An episode whose environment crashed says nothing about the method: it leaves the rate and
    the pairs (counted as a failure it would be paired with the other method's outcome)."""
    from agentrl.rollout.records import write_trajectories
    from agentrl.rollout.types import Trajectory

    def pipeline_run(name, outcomes):  # outcomes per task: True / False / "aborted"
        run = tmp_path / name / "seed0"
        (run / "eval" / "sft").mkdir(parents=True)
        write_trajectories(run / "eval" / "sft" / "trajectories_l0.jsonl", [
            Trajectory(f"l0-{i}", i, "t", [], success=won is True, aborted=won == "aborted")
            for i, won in enumerate(outcomes)])
        (run / "eval" / "sft" / "results.json").write_text(json.dumps({"l0": {}}))
        (run / "phases.json").write_text("{}")
        (run / "config.yaml").write_text("seed: 0\n")
        return read_run(run, "sft")

    a = pipeline_run("a", [True, "aborted", False, True])
    b = pipeline_run("b", [False, True, False, False])
    assert a.outcomes["l0"] == {"l0-0": 1.0, "l0-2": 0.0, "l0-3": 1.0}
    summary = summarize({"a": [a], "b": [b]})
    assert summary["methods"]["a"]["l0"]["mean"] == pytest.approx(2 / 3)
    assert summary["pairs"]["a - b"]["l0"]["difference"] == pytest.approx(2 / 3)  # tasks 0, 2, 3


def test_seeds_to_detect_five_points_count_in_the_metrics_own_units():
    """The report's "seeds to detect 5 pts": 5 percentage points of success, 5 units of a return."""
    def runs(values):
        return [Run(Path(f"r{s}"), s, {"l0": {"t0": v[0], "t1": v[1]}}) for s, v in enumerate(values)]

    a, b = runs([(30.0, 10.0), (20.0, 14.0), (25.0, 5.0)]), runs([(10.0, 10.0)] * 3)
    pair = summarize({"a": a, "b": b}, metric="return")["pairs"]["a - b"]["l0"]
    diffs = [[20.0, 0.0], [10.0, 4.0], [15.0, -5.0]]
    parts = stats.components([float(np.mean(d)) for d in diffs], diffs)
    assert pair["seeds_to_detect"]["5 points"] == stats.seeds_needed(parts, 5.0) is not None
    assert stats.seeds_needed(parts, 0.05) != stats.seeds_needed(parts, 5.0)


def test_runs_compared_on_the_episode_return_and_score(tmp_path, capsys):
    """`--metric return`: each episode's summed reward (ScienceWorld's final score), in its own units,
    where success would see no difference at all; `--metric score`: the same clipped at 0 per episode
    (a failed task's -100 counts 0), which here turns the difference's sign."""
    from agentrl.rollout.records import write_trajectories
    from agentrl.rollout.types import StepSample, Trajectory

    def step(reward):
        return StepSample([1], [2], [0.0], "r", "a", "o", "s", reward=reward)

    for method, rewards in (("a", (-100.0, 30.0)), ("b", (-60.0, 0.0))):
        for seed in (1, 2):
            run = tmp_path / method / f"seed{seed}"
            folder = run / "eval" / "step_000002"
            folder.mkdir(parents=True)
            episodes = [Trajectory(f"l0-{i}", 0, "t", [step(r + seed), step(10.0)], success=False)
                        for i, r in enumerate(rewards)]
            write_trajectories(folder / "trajectories_l0.jsonl", episodes)
            (folder / "results.json").write_text(json.dumps({"l0": {"success": 0.0}}))
            (run / "config.yaml").write_text(f"seed: {seed}\nrl: {{steps: 2}}\n")
    assert read_run(tmp_path / "a" / "seed1", metric="return").outcomes["l0"] == {"l0-0": -89.0, "l0-1": 41.0}
    assert main(["compare", "--runs", str(tmp_path), "--metric", "return"]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    # per seed: (-89 - (-49) + 41 - 11) / 2 = -5; clipped: (0 - 0 + 41 - 11) / 2 = 15
    assert summary["metric"] == "return" and summary["pairs"]["a - b"]["l0"]["difference"] == pytest.approx(-5.0)
    assert "Return" in capsys.readouterr().out and "| a - b | L0 | 2 | -5.0 [-5.0, -5.0]" in \
        (tmp_path / "summary.md").read_text()
    assert read_run(tmp_path / "b" / "seed2", metric="score").outcomes["l0"] == {"l0-0": 0.0, "l0-1": 12.0}
    assert main(["compare", "--runs", str(tmp_path), "--metric", "score"]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["metric"] == "score" and summary["pairs"]["a - b"]["l0"]["difference"] == pytest.approx(15.0)
    assert summary["methods"]["a"]["l0"]["mean"] == pytest.approx((41 + 42) / 4)
    assert "| a | 1, 2 | 20.5 / 21.0 |" in (tmp_path / "summary.md").read_text()  # per seed, in its own units
    assert "Score" in capsys.readouterr().out and "| a - b | L0 | 2 | 15.0 [15.0, 15.0]" in \
        (tmp_path / "summary.md").read_text()
    assert main(["compare", "--runs", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "summary.json").read_text())["pairs"]["a - b"]["l0"]["difference"] == 0


def test_a_methods_coupling_is_the_mean_over_its_seeds_final_models(tiny_model_dir, tmp_path):
    """`compare --coupling`: the lab's numbers on fixed steps for the starting model and, per
    method, the mean over its seeds' final models (two different ones here)."""
    import torch
    from test_analysis import expert_and_random_episodes

    from agentrl.analysis.coupling import coupling_metrics
    from agentrl.compare import coupling
    from agentrl.models import load_model, load_tokenizer
    from agentrl.rollout.records import write_trajectories

    trajectories = expert_and_random_episodes()
    write_trajectories(tmp_path / "steps.jsonl", trajectories)

    runs, finals = [], []
    for seed in (0, 1):
        final = tmp_path / "m" / f"seed{seed}" / "checkpoints" / "step_000001"
        shutil.copytree(tiny_model_dir, final / "model")
        (final / "trainer_state.json").write_text("{}")
        model = load_model(final / "model")
        torch.manual_seed(seed)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * torch.randn_like(p))
        model.save_pretrained(final / "model")
        runs.append(Run(final.parent.parent, seed, {}))
        finals.append(final / "model")

    def measure(path):
        return coupling_metrics(load_model(str(path)), load_tokenizer(str(path)), trajectories, 4, 1e-3, seed=0)

    out = coupling(str(tiny_model_dir), {"m": runs}, str(tmp_path / "steps.jsonl"), 4)
    each = [measure(path) for path in finals]
    assert each[0]["grad_cos_pos_neg"] != pytest.approx(each[1]["grad_cos_pos_neg"])
    assert out["m"] == pytest.approx({k: (each[0][k] + each[1][k]) / 2 for k in each[0]})
    assert out["start"] == pytest.approx(measure(tiny_model_dir))
