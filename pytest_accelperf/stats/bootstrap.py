"""The statistic behind throughput verdicts: a bootstrap interval on the step-time ratio.

Step times on a shared machine are noisy and skewed: most steps take about the same time,
and a few are slow because something else ran (garbage collection, another process, a
clock change). So the throughput check compares *medians*, which a few slow steps cannot
move, and asks how precisely the data pin the change down before calling it.

The statistic is the ratio of median step times,

    ratio = median(now) / median(baseline)        (> 1 means this run is slower)

and its uncertainty is a 95% percentile-bootstrap confidence interval ``[low, high]``:
both samples are resampled independently with replacement (2000 times, with a fixed seed
so that the same data always give the same verdict), the ratio is computed for every
resample, and the 2.5th and 97.5th percentiles of those ratios bound the interval. The
*minimum detectable change* is the interval's half-width relative to the ratio,
``mdc = (high - low) / (2 * ratio)``: a change smaller than that is indistinguishable from
noise in this data. (Relative, so that the same noise gives the same resolution whether the
run is unchanged or twice as slow.)

Drift correction: when both runs timed the same reference probe after their steps
(:mod:`pytest_accelperf.backends.measure.probe`), the statistic becomes

    ratio = [median(now) / median(probe_now)] / [median(base) / median(probe_base)]

i.e. each run's step time in units of what the machine gave that run. A machine that is
30 % slower today (another job on the cores, a slower runner) slows the probe as much as
the step and leaves the ratio alone; a step that got slower by itself does not. The probe
medians are resampled too, so their own noise widens the interval honestly. (Per-step
pairing, ``step_i / probe_i``, was measured and rejected: a sub-millisecond probe's
scheduler jitter then adds to every sample, and the interval of a small step widened 2-3x.)

With a relative ``tolerance`` (e.g. 0.10 for 10%), the verdict is:

* ``regression`` (``improvement``) when the whole interval lies beyond the tolerance,
  ``low > 1 + tolerance`` (``high < 1 - tolerance``), however wide it is: a step twice
  as slow is a regression on the noisiest machine.
* ``inconclusive`` otherwise when ``mdc > tolerance``: the noise is too large to resolve a
  change of the size the tolerance allows, so no verdict either way. Measure more steps
  or run on a quieter machine.
* ``regression`` when ``ratio > 1 + tolerance`` and ``low > 1``: slower by more than the
  tolerance, and the whole interval says slower.
* ``improvement`` when ``ratio < 1 - tolerance`` and ``high < 1``: faster by more than the
  tolerance, and the whole interval says faster.
* ``pass`` otherwise.

Degenerate data are handled without a warning: when every step time of both runs is the
same, every resample gives the same ratio and the interval collapses to it
(``low == ratio == high``, ``mdc == 0``). Each run needs at least 3 positive, finite step
times; fewer, or a zero/negative/non-finite time, is a ``ValueError`` (a device step never
takes zero seconds, so such a value is a broken measurement, not data).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType

import numpy as np
import numpy.typing as npt

from pytest_accelperf.records.verdict import Verdict


def _scipy_stats() -> ModuleType:
    """``scipy.stats``, imported on first use: it is most of the start-up time of the
    ``accelperf`` command (and of ``import pytest_accelperf``), which mostly never needs
    it."""
    from scipy import stats

    module: ModuleType = stats
    return module


#: The fewest step times per run for which a bootstrap interval means anything.
MIN_SAMPLES = 3

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class RatioEstimate:
    """The ratio of median step times with its bootstrap confidence interval.

    ``ratio`` is ``median(now) / median(base)`` (> 1: slower); ``low``/``high`` bound its
    ``confidence`` interval; ``mdc`` (minimum detectable change) is
    ``(high - low) / (2 * ratio)``.
    """

    ratio: float
    low: float
    high: float
    mdc: float
    n_now: int
    n_base: int
    confidence: float = 0.95


def _as_samples(values: Sequence[float], name: str) -> FloatArray:
    arr = np.asarray(values, dtype=np.float64).ravel()
    if arr.size < MIN_SAMPLES:
        raise ValueError(
            f"{name} has {arr.size} step time(s); at least {MIN_SAMPLES} are needed to "
            f"estimate a confidence interval (measure more steps)"
        )
    bad = ~np.isfinite(arr) | (arr <= 0)
    if bad.any():
        first = int(np.argmax(bad))
        raise ValueError(
            f"{name} step time #{first} is {float(arr[first])!r}; step times must be positive and "
            f"finite seconds"
        )
    return arr


def _median_ratio(now: FloatArray, base: FloatArray, axis: int = -1) -> FloatArray | float:
    """The statistic, vectorized over resamples along ``axis``."""
    return np.median(now, axis=axis) / np.median(base, axis=axis)


def _corrected_ratio(now: FloatArray, now_probe: FloatArray, base: FloatArray,
                     base_probe: FloatArray, axis: int = -1) -> FloatArray | float:
    """The drift-corrected statistic, vectorized over resamples along ``axis``."""
    return ((np.median(now, axis=axis) / np.median(now_probe, axis=axis))
            / (np.median(base, axis=axis) / np.median(base_probe, axis=axis)))


def step_time_ratio(now: Sequence[float], base: Sequence[float], *, confidence: float = 0.95,
                    n_resamples: int = 2000, seed: int = 0,
                    probes: tuple[Sequence[float], Sequence[float]] | None = None,
                    ) -> RatioEstimate:
    """Estimate ``median(now) / median(base)`` with a percentile-bootstrap interval.

    The samples are independent (unpaired) and resampled separately; ``seed`` makes the
    interval, and so the verdict, reproducible. With ``probes=(now_probe, base_probe)``
    the ratio is drift-corrected by the probes' medians. See the module docstring.

    >>> est = step_time_ratio([1.0, 1.0, 1.0], [0.5, 0.5, 0.5])
    >>> est.ratio, est.low, est.high, est.mdc
    (2.0, 2.0, 2.0, 0.0)
    >>> step_time_ratio([2.0] * 3, [1.0] * 3, probes=([2.0] * 3, [1.0] * 3)).ratio
    1.0
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
    x = _as_samples(now, "the new run")
    y = _as_samples(base, "the baseline")
    if probes is not None:
        samples = (x, _as_samples(probes[0], "the new run's probe"), y,
                   _as_samples(probes[1], "the baseline's probe"))
        return _bootstrap(samples, _corrected_ratio, confidence, n_resamples, seed)
    return _bootstrap((x, y), _median_ratio, confidence, n_resamples, seed)


def _bootstrap(samples: tuple[FloatArray, ...],
               statistic: Callable[..., FloatArray | float], confidence: float,
               n_resamples: int, seed: int) -> RatioEstimate:
    x, y = samples[0], samples[-2 if len(samples) == 4 else 1]
    ratio = float(statistic(*samples))
    if all(np.ptp(a) == 0 for a in samples):
        # Every resample gives the same ratio: the interval is that point.
        return RatioEstimate(ratio, ratio, ratio, 0.0, x.size, y.size, confidence)
    with warnings.catch_warnings():
        # A bootstrap distribution that is (nearly) one value makes scipy warn that the
        # data are degenerate; the percentile interval is still right (it is that value),
        # and pytest's filterwarnings=error must not turn it into a failure.
        warnings.simplefilter("ignore", _scipy_stats().DegenerateDataWarning)
        res = _scipy_stats().bootstrap(
            samples, statistic, n_resamples=n_resamples, vectorized=True, paired=False,
            confidence_level=confidence, method="percentile",
            rng=np.random.default_rng(seed),
        )
    low = float(res.confidence_interval.low)
    high = float(res.confidence_interval.high)
    if not (math.isfinite(low) and math.isfinite(high)):  # pragma: no cover - defensive
        low = high = ratio
    return RatioEstimate(ratio, low, high, (high - low) / (2 * ratio), x.size, y.size,
                         confidence)


#: The fewest recorded sessions of a baseline from which a between-session spread is
#: estimated (two give a standard deviation with one degree of freedom: t = 12.7).
MIN_SESSIONS = 3


@dataclass(frozen=True)
class SessionSpread:
    """What a baseline's recorded sessions say about session-to-session noise.

    ``sd`` is the standard deviation of the sessions' log step-time levels; ``n`` how many
    sessions were recorded; ``outliers`` the indexes of those left out as outlying (see
    :func:`outlying_sessions`), with their level over the median of all in ``factors``;
    ``robust`` when too few were left and the level and spread are the median and the
    scaled MAD of all of them instead."""

    sd: float
    n: int
    outliers: tuple[int, ...] = ()
    factors: tuple[float, ...] = ()
    robust: bool = False


#: Modified z-score past which a session's level is an outlier (Iglewicz and Hoaglin's
#: 3.5), and the floor of the MAD it is scaled by (1 % in log space: sessions closer than
#: that agree, whatever their MAD).
OUTLIER_Z = 3.5
MAD_FLOOR = 0.01


def outlying_sessions(logs: FloatArray) -> list[int]:
    """Indexes of the log levels whose modified z-score ``0.6745 |x - median| / MAD``
    exceeds :data:`OUTLIER_Z`: one session measured under another job's load cannot set
    the level and the spread of all of them.

    >>> outlying_sessions(np.log([1.0, 1.02, 0.99, 3.0]))
    [3]
    >>> outlying_sessions(np.log([0.9, 1.0, 1.1]))
    []
    """
    med = float(np.median(logs))
    mad = max(float(np.median(np.abs(logs - med))), MAD_FLOOR)
    return [i for i, x in enumerate(logs) if 0.6745 * abs(float(x) - med) / mad > OUTLIER_Z]


def widen_by_sessions(est: RatioEstimate, now_level: float, levels: Sequence[float],
                      ) -> tuple[RatioEstimate, SessionSpread]:
    """Re-center ``est`` on the mean of the baseline's sessions and widen it by their spread.

    A bootstrap interval sees only the noise within one session; on a shared machine whole
    sessions differ (another job, a different core, the process's memory layout), by far
    more than that. With ``levels``, one step-time level per recorded session of the
    baseline (median step time, or median step time over median probe time when
    drift-corrected), the ratio becomes ``now_level / geometric mean(levels)`` and its
    interval, in log space, has the half-width

        sqrt(w**2 + (t[n-1] * sd * sqrt(1 + 1/n))**2)

    where ``w`` is the bootstrap interval's half-width (the noise within this session),
    ``sd`` the standard deviation of the sessions' log levels and ``t[n-1]`` Student's
    quantile for ``n - 1`` degrees of freedom: a prediction interval for a new session from
    ``n`` earlier ones. Sessions that agree leave the interval as it was; sessions 20 %
    apart make a 3 % tolerance ``inconclusive`` instead of a coin toss. An outlying session
    (:func:`outlying_sessions`) is left out of the mean and the SD; when fewer than
    :data:`MIN_SESSIONS` remain, the center is the median of all the levels and ``sd`` their
    MAD scaled to a normal SD (1.4826 MAD), so one contaminated session moves neither.

    >>> est = RatioEstimate(1.0, 0.99, 1.01, 0.01, 30, 30)
    >>> wide, spread = widen_by_sessions(est, 1.0, [1.0, 1.0, 1.0])
    >>> round(wide.low, 4), round(wide.high, 4), spread.sd
    (0.99, 1.0101, 0.0)
    >>> wide, spread = widen_by_sessions(est, 1.0, [0.9, 1.0, 1.1])
    >>> round(wide.mdc, 2), round(spread.sd, 3)
    (0.52, 0.1)
    """
    logs = np.log(np.asarray(levels, dtype=np.float64))
    n = int(logs.size)
    if n < MIN_SESSIONS or not np.all(np.isfinite(logs)) or not now_level > 0:
        raise ValueError(f"{n} session level(s); at least {MIN_SESSIONS} positive ones are "
                         f"needed")
    outliers = outlying_sessions(logs)
    kept = np.delete(logs, outliers)
    robust = kept.size < MIN_SESSIONS
    if robust:
        med = float(np.median(logs))
        level, sd = med, 1.4826 * float(np.median(np.abs(logs - med)))
    else:
        level, sd = float(np.mean(kept)), float(np.std(kept, ddof=1))
    center = math.log(now_level) - level
    median_all = float(np.median(logs))
    factors = tuple(math.exp(float(logs[i]) - median_all) for i in outliers)
    within = (math.log(est.high) - math.log(est.low)) / 2
    q = float(_scipy_stats().t.ppf(0.5 + est.confidence / 2, n - 1))
    half = math.hypot(within, q * sd * math.sqrt(1 + 1 / n))
    ratio = math.exp(center)
    low, high = math.exp(center - half), math.exp(center + half)
    return (RatioEstimate(ratio, low, high, (high - low) / (2 * ratio), est.n_now, est.n_base,
                          est.confidence),
            SessionSpread(sd, n, tuple(outliers), factors, robust))


def throughput_verdict(est: RatioEstimate, tolerance: float) -> Verdict:
    """The verdict for a step-time ratio estimate under a relative ``tolerance``.

    >>> throughput_verdict(RatioEstimate(1.3, 1.2, 1.4, 0.1, 30, 30), tolerance=0.1)
    <Verdict.REGRESSION: 'regression'>
    >>> throughput_verdict(RatioEstimate(1.3, 0.9, 1.7, 0.4, 30, 30), tolerance=0.1)
    <Verdict.INCONCLUSIVE: 'inconclusive'>
    """
    if est.low > 1 + tolerance:
        return Verdict.REGRESSION  # however wide, the whole interval is past the tolerance
    if est.high < 1 - tolerance:
        return Verdict.IMPROVEMENT
    if est.mdc > tolerance:
        return Verdict.INCONCLUSIVE
    if est.ratio > 1 + tolerance and est.low > 1:
        return Verdict.REGRESSION
    if est.ratio < 1 - tolerance and est.high < 1:
        return Verdict.IMPROVEMENT
    return Verdict.PASS


#: How much wider than the tolerance an A/B interval may be and still name a change that
#: lies wholly on one side of 1 with its estimate past the tolerance (:func:`ab_verdict`).
AB_RESOLVE = 2.0


def ab_verdict(est: RatioEstimate, tolerance: float) -> Verdict:
    """A/B mode's verdict on its two-level interval: :func:`throughput_verdict`, and
    besides, a change whose whole interval lies on one side of 1 with its estimate past
    the tolerance is named while the smallest detectable change is up to
    :data:`AB_RESOLVE` times the tolerance (where the stored-baseline check says
    ``inconclusive`` as soon as it passes the tolerance). The A/B interval samples process
    pairs as well as rounds, so a slowdown it calls significant is one that held across
    fresh processes; past twice the tolerance, an interval that wide on a shared machine
    is where load that the foreign-load reading missed shows, and it stays
    ``inconclusive``. ``pass`` still needs the interval to resolve the tolerance.

    >>> ab_verdict(RatioEstimate(1.021, 1.0095, 1.0335, 0.0118, 30, 30), tolerance=0.01)
    <Verdict.REGRESSION: 'regression'>
    >>> throughput_verdict(RatioEstimate(1.021, 1.0095, 1.0335, 0.0118, 30, 30), 0.01)
    <Verdict.INCONCLUSIVE: 'inconclusive'>
    >>> ab_verdict(RatioEstimate(0.968, 0.941, 0.997, 0.029, 30, 30), tolerance=0.01)
    <Verdict.INCONCLUSIVE: 'inconclusive'>
    """
    verdict = throughput_verdict(est, tolerance)
    if verdict is not Verdict.INCONCLUSIVE or est.mdc > AB_RESOLVE * tolerance:
        return verdict
    if est.ratio > 1 + tolerance and est.low > 1:
        return Verdict.REGRESSION
    if est.ratio < 1 - tolerance and est.high < 1:
        return Verdict.IMPROVEMENT
    return verdict


#: Share of rounds cut from each end before averaging paired log-ratios: one round that
#: another job disturbed in one arm only cannot move the estimate.
TRIM = 0.1


def _trimmed_mean(logs: FloatArray, axis: int = -1) -> FloatArray | float:
    mean: FloatArray | float = _scipy_stats().trim_mean(logs, TRIM, axis=axis)
    return mean


def paired_ratio(now_blocks: Sequence[Sequence[float]], base_blocks: Sequence[Sequence[float]],
                 *, confidence: float = 0.95, n_resamples: int = 2000, seed: int = 0,
                 ) -> RatioEstimate:
    """The step-time ratio of two revisions measured in alternation (A/B mode).

    Round ``i`` timed a block of steps of each revision back to back, so both saw the same
    machine; its ratio is ``median(now_i) / median(base_i)``. The estimate is the
    geometric 10 %-trimmed mean of the rounds' ratios, with a percentile-bootstrap
    interval over rounds (resampled as pairs). Drift slower than a round cancels within
    every pair, which is why this resolves changes of a few percent where two runs
    hours apart cannot.

    >>> est = paired_ratio([[1.1] * 3] * 4, [[1.0] * 3] * 4)
    >>> round(est.ratio, 6), round(est.mdc, 6)
    (1.1, 0.0)
    """
    logs = _round_logs(now_blocks, base_blocks)
    ratio = math.exp(float(_trimmed_mean(logs)))
    if np.ptp(logs) == 0:
        return RatioEstimate(ratio, ratio, ratio, 0.0, len(logs), len(logs), confidence)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", _scipy_stats().DegenerateDataWarning)
        res = _scipy_stats().bootstrap(
            (logs,), _trimmed_mean, n_resamples=n_resamples, vectorized=True,
            confidence_level=confidence, method="percentile", rng=np.random.default_rng(seed))
    low = math.exp(float(res.confidence_interval.low))
    high = math.exp(float(res.confidence_interval.high))
    return RatioEstimate(ratio, low, high, (high - low) / (2 * ratio), len(logs), len(logs),
                         confidence)


def _round_logs(now_blocks: Sequence[Sequence[float]],
                base_blocks: Sequence[Sequence[float]]) -> FloatArray:
    """Each round's ``log(min(now_i) / min(base_i))``: each block's fastest step.

    The noise of a step time on a shared host is one-sided (another job, an interrupt, a
    cache evicted only ever add time), so a block's fastest step is its least disturbed
    one, and the minimum is the estimator with the least variance for a change that
    slows every step (Chen & Revels, *Robust benchmarking in noisy environments*, 2016).
    Measured on the recorded rounds of benchmarks/gate.py's A/B runs (60 s, 8 process
    pairs), the interval's half-width fell from 0.5-1.0 % to 0.4 % for the JAX MLP and
    from 0.7-1.8 % to 0.4-1.2 % for the torch GPT, with the same estimates of the planted
    2 % and 5 %. What it cannot see is a change in only some of a block's steps (a pause
    every few steps): A/B mode gates a change in every step, the stored-baseline check
    keeps every step's time."""
    if len(now_blocks) != len(base_blocks):
        raise ValueError(f"{len(now_blocks)} rounds of the new revision against "
                         f"{len(base_blocks)} of the base: rounds must be paired")
    if len(now_blocks) < MIN_SAMPLES:
        raise ValueError(f"{len(now_blocks)} round(s); at least {MIN_SAMPLES} are needed")
    return np.array([math.log(float(np.min(_as_samples(a, "the new revision"))) /
                              float(np.min(_as_samples(b, "the base revision"))))
                     for a, b in zip(now_blocks, base_blocks, strict=True)])


@dataclass(frozen=True)
class ProcessSpread:
    """How the paired log-ratios of an A/B measurement vary at its two levels: between
    process pairs (``process_sd``: the standard deviation of a pair's true mean, from its
    memory layout, allocator state, thread placement) and between rounds within one pair
    (``within_sd``, winsorized: the spread the pair's trimmed mean sees), both as standard
    deviations of a log-ratio (about a relative change).
    ``processes`` pairs took ``rounds`` rounds in all."""

    processes: int
    rounds: int
    process_sd: float
    within_sd: float

    @property
    def process_dominates(self) -> bool:
        """Whether the process level contributes more to a pair's mean than its rounds."""
        per_pair = max(self.rounds / max(self.processes, 1), 1.0)
        rounds_var = self.within_sd ** 2 / ((1 - 2 * TRIM) ** 2 * per_pair)
        return self.process_sd ** 2 > rounds_var


def _trimmed_mean_se(logs: FloatArray) -> float:
    """Standard error of the 10 %-trimmed mean of ``logs``: the winsorized standard
    deviation over ``(1 - 2 * TRIM) * sqrt(n)`` (Tukey & McLaughlin), robust to the few
    rounds another job disturbed, as the trimmed mean itself is."""
    n = len(logs)
    if n < 2:
        return 0.0
    winsorized = np.asarray(_scipy_stats().mstats.winsorize(logs, limits=(TRIM, TRIM)),
                            dtype=np.float64)
    return float(winsorized.std(ddof=1) / ((1 - 2 * TRIM) * math.sqrt(n)))


def process_ratio(now_blocks: Sequence[Sequence[float]],
                  base_blocks: Sequence[Sequence[float]], pairs: Sequence[int], *,
                  confidence: float = 0.95) -> tuple[RatioEstimate, ProcessSpread]:
    """The step-time ratio of two revisions measured in alternation by several process
    pairs (A/B mode with ``--accelperf-compare-processes``): round ``i`` was timed by pair
    ``pairs[i]``, one fresh worker process of each revision.

    A process carries its own memory layout, allocator state and thread placement, so
    steady-state speed differs between two processes of the same program (by around 1 %
    on a CPU), and rounds inside one pair of processes share that offset: an interval over
    rounds alone is too narrow by exactly the between-process variance. This is the
    two-level (random-effects) estimate instead. Each pair's mean is the 10 %-trimmed mean
    of its rounds' log-ratios, with its own standard error from its rounds (winsorized:
    :func:`_trimmed_mean_se`); the estimate is the mean of the pairs' means. The variance
    of one pair's mean is estimated as the larger of the pairs' means' observed variance
    (both levels) and what the rounds alone give it (the method of moments' estimate with
    the between-process part truncated at 0: three means that agree by chance cannot
    claim more precision than their own rounds have), and the interval is Student's t over
    the pairs (``k - 1`` degrees of freedom for ``k`` pairs). The spread at each level is
    reported (:class:`ProcessSpread`; ``within_sd`` is the rounds' winsorized standard
    deviation).

    >>> est, spread = process_ratio([[1.1] * 3] * 4, [[1.0] * 3] * 4, [0, 0, 1, 1])
    >>> round(est.ratio, 6), round(est.mdc, 6), spread.processes
    (1.1, 0.0, 2)
    """
    logs = _round_logs(now_blocks, base_blocks)
    if len(pairs) != len(logs):
        raise ValueError(f"{len(pairs)} pair labels for {len(logs)} rounds")
    labels = sorted(set(pairs))
    if len(labels) < 2:
        raise ValueError(f"rounds of {len(labels)} process pair(s); at least 2 are needed "
                         f"to estimate the between-process variance")
    groups = [logs[np.asarray(pairs) == label] for label in labels]
    means = np.array([float(_trimmed_mean(g)) for g in groups])
    k, n = len(groups), len(logs)
    center = float(means.mean())
    ratio = math.exp(center)
    var_means = float(means.var(ddof=1))
    ses = [_trimmed_mean_se(g) for g in groups]
    rounds_var = float(np.mean(np.square(ses)))  # one pair mean's variance from its rounds
    per_pair = n / k
    within_sd = math.sqrt(rounds_var * per_pair) * (1 - 2 * TRIM)
    spread = ProcessSpread(k, n, math.sqrt(max(0.0, var_means - rounds_var)), within_sd)
    pair_var = max(var_means, rounds_var)
    if pair_var == 0.0:
        return RatioEstimate(ratio, ratio, ratio, 0.0, n, n, confidence), spread
    half = pairs_t(k, confidence) * math.sqrt(pair_var / k)
    low, high = math.exp(center - half), math.exp(center + half)
    return (RatioEstimate(ratio, low, high, (high - low) / (2 * ratio), n, n, confidence),
            spread)


#: The most process pairs A/B mode starts (``--accelperf-compare-processes``).
MAX_PAIRS = 16


def pairs_t(pairs: int, confidence: float = 0.95) -> float:
    """The factor of Student's t that widens an interval over ``pairs`` process pairs
    (``pairs - 1`` degrees of freedom): 12.71 for 2 pairs, 4.30 for 3, 2.78 for 5, at 95 %.

    >>> [round(pairs_t(k), 2) for k in (2, 3, 5)]
    [12.71, 4.3, 2.78]
    """
    if pairs < 2:
        raise ValueError(f"{pairs} process pair(s); at least 2 are needed")
    return float(_scipy_stats().t.ppf((1 + confidence) / 2, pairs - 1))


def ab_ratio(now_blocks: Sequence[Sequence[float]], base_blocks: Sequence[Sequence[float]],
             pairs: Sequence[int]) -> tuple[RatioEstimate, ProcessSpread | None]:
    """A/B mode's statistic: over the process pairs (:func:`process_ratio`) when the
    rounds came from more than one, else over the rounds of the one pair
    (:func:`paired_ratio`, no spread)."""
    if len(set(pairs)) > 1:
        return process_ratio(now_blocks, base_blocks, pairs)
    return paired_ratio(now_blocks, base_blocks), None
