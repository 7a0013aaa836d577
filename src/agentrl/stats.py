"""Statistics for comparing methods where the training run is the unit of replication.

The reference is Agarwal et al. 2021, "Deep RL at the Edge of the Statistical Precipice":
percentile-bootstrap intervals over runs, the interquartile mean, and the probability of
improvement P(X > Y) (the Mann-Whitney statistic over runs). scipy provides each of them
(`scipy.stats.bootstrap`, `trim_mean`, `mannwhitneyu`); rliable would add arch, pandas and seaborn
for the same three numbers.

A method's result on a split is one success rate per seed (each the mean of that seed's evaluation
episodes). Two sources of spread make those rates differ: training (another seed trains another
policy) and evaluation (a finite number of episodes measures it). `components` separates them, and
`detectable_difference` says what a comparison of this size can see and what it would take to see
less: this is how a reader tells "no difference" from "too few seeds to say".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

CONFIDENCE = 0.95
POWER = 0.8
RESAMPLES = 10_000


def interval(values, confidence: float = CONFIDENCE, seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap interval of the mean over `values` (one per seed). One value: a
    point (no spread can be estimated from one run)."""
    values = np.asarray(values, dtype=float)
    if len(values) < 2:
        return float(values.mean()), float(values.mean())
    result = stats.bootstrap((values,), np.mean, confidence_level=confidence, n_resamples=RESAMPLES,
                             method="percentile", rng=np.random.default_rng(seed))
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def t_interval(values, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Student-t interval of the mean over `values` (one per seed): mean +- t(n-1) x sd / sqrt(n).
    At 5 seeds the percentile bootstrap covers less than its nominal 95% (it cannot see spread
    wider than the seeds drawn); the t-interval is the conservative companion a reviewer asks for.
    One value, or no spread: a point."""
    values = np.asarray(values, dtype=float)
    mean = float(values.mean())
    if len(values) < 2 or values.std() == 0:
        return mean, mean
    half = stats.t.ppf(0.5 + confidence / 2, len(values) - 1) * values.std(ddof=1) / math.sqrt(len(values))
    return mean - half, mean + half


def t_pvalue(values) -> float | None:
    """Two-sided p-value of a one-sample t-test of mean 0 (a paired t-test on per-seed differences);
    None without spread to test by."""
    values = np.asarray(values, dtype=float)
    if len(values) < 2 or values.std() == 0:
        return None
    return float(stats.ttest_1samp(values, 0.0).pvalue)


def band(curves: np.ndarray, confidence: float = CONFIDENCE, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Per-step percentile-bootstrap interval of the mean over seeds; `curves` (seeds, steps)."""
    if curves.shape[0] < 2:
        return curves[0], curves[0]
    result = stats.bootstrap((curves,), np.mean, axis=0, confidence_level=confidence, n_resamples=2000,
                             method="percentile", rng=np.random.default_rng(seed))
    return result.confidence_interval.low, result.confidence_interval.high


def iqm(values) -> float:
    """Interquartile mean: the mean of the middle half (robust to one outlying seed)."""
    return float(stats.trim_mean(np.asarray(values, dtype=float), 0.25))


def probability_of_improvement(x, y) -> float:
    """P(X > Y) + P(X = Y) / 2 for a run X of one method and a run Y of the other."""
    return float(_poi(np.asarray(x, dtype=float), np.asarray(y, dtype=float)))


def improvement_interval(x, y, confidence: float = CONFIDENCE, seed: int = 0) -> tuple[float, float]:
    """Bootstrap interval of P(X > Y), seeds resampled in pairs."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(x) < 2:
        point = probability_of_improvement(x, y)
        return point, point
    result = stats.bootstrap((x, y), lambda a, b, axis=-1: _poi(a, b), paired=True, vectorized=True,
                             confidence_level=confidence, n_resamples=RESAMPLES, method="percentile",
                             rng=np.random.default_rng(seed))
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def _poi(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """probability_of_improvement over the last axis, batched over the leading ones."""
    return ((a[..., :, None] > b[..., None, :]).mean(axis=(-2, -1))
            + 0.5 * (a[..., :, None] == b[..., None, :]).mean(axis=(-2, -1)))


@dataclass(frozen=True)
class Components:
    """Spread of a per-seed quantity (a success rate, or a paired difference of two)."""
    total_sd: float
    """Sample standard deviation over seeds (ddof 1; 0 with one seed)."""
    within_sd: float
    """The part from evaluating on finitely many episodes: the mean over seeds of the per-seed
    estimate's standard error."""
    between_sd: float
    """The part from training: sqrt(max(0, total^2 - within^2))."""
    episodes: int
    """Episodes per seed that `within_sd` refers to."""


def components(per_seed: list[float], episode_scores: list[list[float]]) -> Components:
    """Training and evaluation spread of per-seed means of `episode_scores` (one list per seed: 0/1
    successes, or paired differences of them on the same tasks)."""
    total = float(np.std(per_seed, ddof=1)) if len(per_seed) > 1 else 0.0
    within_var = float(np.mean([np.var(s, ddof=1) / len(s) if len(s) > 1 else 0.0 for s in episode_scores]))
    between = math.sqrt(max(0.0, total ** 2 - within_var))
    return Components(total, math.sqrt(within_var), between, round(float(np.mean([len(s) for s in episode_scores]))))


def detectable_difference(parts: Components, seeds: int, episodes: int | None = None,
                          confidence: float = CONFIDENCE, power: float = POWER) -> float:
    """The smallest true paired difference that a two-sided paired t-test at `confidence` finds with
    probability `power`, with `seeds` paired seeds of `episodes` evaluation episodes each (default:
    the measured number), given the measured spread. inf below 2 seeds."""
    if seeds < 2:
        return math.inf
    episodes = episodes or parts.episodes
    variance = parts.between_sd ** 2 + parts.within_sd ** 2 * parts.episodes / episodes
    quantiles = stats.t.ppf(1 - (1 - confidence) / 2, seeds - 1) + stats.t.ppf(power, seeds - 1)
    return float(quantiles * math.sqrt(variance / seeds))


def seeds_needed(parts: Components, difference: float, episodes: int | None = None, limit: int = 10_000) -> int | None:
    """Paired seeds at which `difference` becomes detectable (None: more than `limit`, or no spread
    was measured to size it by)."""
    if parts.total_sd == 0 or difference <= 0:
        return None
    for seeds in range(2, limit + 1):
        if detectable_difference(parts, seeds, episodes) <= difference:
            return seeds
    return None
