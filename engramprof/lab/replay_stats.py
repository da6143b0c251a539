"""Replay's rounds: each arm's median over rounds with a distribution-free 95% interval, the
speedup's interval from rounds paired by position, and what that interval lets replay claim.

Replay runs its arms interleaved in rounds (every arm reads every selected batch once per
round, arm order rotated each round).  One round gives one figure per arm: the median of its
batch times in that round.  Rounds are treated as independent draws of the host's state.

- An arm's figure: the median of its round figures, with the **order-statistic interval for
  the median** (the sign-test interval): for n rounds sorted, ``[x(k), x(n+1-k)]`` with the
  largest k for which ``P(B <= k-1) <= 2.5%``, ``B ~ Binomial(n, 1/2)``.  It covers the true
  median with probability ``1 - 2 P(B <= k-1)`` (at least 95%) for any continuous
  distribution: no normality, no symmetry.  Below :data:`MIN_ROUNDS` rounds no such interval
  reaches 95% (``1 - 2 / 2**5 = 93.75%`` for five).
- The speedup of arm A: in each round the paired ratio ``pool / A`` of the two arms' round
  figures (both measured in the same round, interleaved, so a slow spell of the host slows
  both); the estimate is the median of the paired ratios and its interval the same
  order-statistic interval over them.  Pairing takes the drift between rounds (the 1.57x vs
  5.52x of issue 25, an hour apart) out of the ratio; the sign-test interval needs no
  symmetry of the ratios (the pool's times are right-skewed: preemptions, thread wake-ups),
  which Hodges-Lehmann / Wilcoxon would.
- The claim (:func:`speedup_claim`): an interval that contains 1.0 supports no claim that
  the arms differ; one that excludes 1.0 but whose ends are more than :data:`WIDE_FACTOR`
  apart supports the direction (faster / slower) but not a figure.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

CONFIDENCE = 0.95
MIN_ROUNDS = 6  # the fewest rounds with a 95% order-statistic interval: 1 - 2 / 2**6 = 96.9%
WIDE_FACTOR = 2.0  # interval high / low above this: the direction is supported, not the figure
CLAIMS = ("supported", "direction only", "not supported", "no interval")


@dataclass(frozen=True)
class Interval:
    estimate: float  # the sample median
    lo: float | None  # None: too few values for the confidence asked
    hi: float | None
    coverage: float | None  # the interval's exact coverage probability (>= the confidence asked)
    n: int
    rank: int | None = None  # k: the interval is the k-th smallest to the k-th largest value

    def rounded(self, digits: int) -> "Interval":
        """The same interval with its values rounded (so a sentence and a table agree)."""
        r = (lambda v: None if v is None else round(v, digits))
        return replace(self, estimate=r(self.estimate), lo=r(self.lo), hi=r(self.hi))

    def to_dict(self, digits: int = 3) -> dict:
        r = (lambda v: None if v is None else round(float(v), digits))
        return {"estimate": r(self.estimate), "lo": r(self.lo), "hi": r(self.hi),
                "coverage": None if self.coverage is None else round(self.coverage, 4), "n": self.n,
                "rank": self.rank}


def _binom_half_cdf(k: int, n: int) -> float:
    """``P(B <= k)`` for ``B ~ Binomial(n, 1/2)``, exact."""
    return sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n


def order_rank(n: int, confidence: float = CONFIDENCE) -> tuple[int, float] | None:
    """(k, coverage): the largest k such that ``[x(k), x(n+1-k)]`` covers the median with
    probability at least ``confidence``; None when even ``[x(1), x(n)]`` does not."""
    alpha = 1.0 - confidence
    best = None
    for k in range(1, n // 2 + 1):
        tail = _binom_half_cdf(k - 1, n)
        if tail > alpha / 2:
            break
        best = (k, 1.0 - 2.0 * tail)
    return best


def median_interval(values, confidence: float = CONFIDENCE) -> Interval:
    """The sample median and its distribution-free (order-statistic) interval."""
    x = np.sort(np.asarray(values, dtype=np.float64))
    n = len(x)
    if not n:
        return Interval(float("nan"), None, None, None, 0)
    est = float(np.median(x))
    kc = order_rank(n, confidence)
    if kc is None:
        return Interval(est, None, None, None, n)
    k, cov = kc
    return Interval(est, float(x[k - 1]), float(x[n - k]), cov, n, k)


def paired_speedup(pool_rounds, arm_rounds, confidence: float = CONFIDENCE) -> Interval:
    """The speedup ``pool / arm`` from rounds paired by position: the median of the paired
    ratios and its order-statistic interval."""
    p = np.asarray(pool_rounds, dtype=np.float64)
    a = np.asarray(arm_rounds, dtype=np.float64)
    if len(p) != len(a):
        raise ValueError("paired rounds: the pool and the arm have different numbers of rounds")
    ok = (a > 0) & (p > 0)
    return median_interval(p[ok] / a[ok], confidence)


def times(v: float) -> str:
    """A ratio as "2.35x"; three decimals when two would show a ratio near 1.0 as exactly 1.00."""
    t = f"{v:.2f}"
    return (f"{v:.3f}" if t == "1.00" and v != 1.0 else t) + "x"


def speedup_claim(arm: str, iv: Interval, wide: float = WIDE_FACTOR) -> tuple[str, str]:
    """(claim, the sentence that says it): one of :data:`CLAIMS`."""
    pct = f"{round(100 * CONFIDENCE)}%"
    if iv.lo is None or iv.hi is None:
        return "no interval", (f"{arm} vs pool: {times(iv.estimate)}, but {iv.n} round(s) give no {pct} interval "
                               f"(at least {MIN_ROUNDS} are needed): not supported; one sample, not a result "
                               f"(--rounds {MIN_ROUNDS} or more)")
    span = f"{pct} interval {times(iv.lo)}-{times(iv.hi)} over {iv.n} rounds"
    if iv.lo <= 1.0 <= iv.hi:
        return "not supported", (f"{arm} vs pool: {times(iv.estimate)}, but the {span} contains 1.0: not supported; "
                                 f"this run cannot tell {arm} from pool")
    way = "faster" if iv.lo > 1.0 else "slower"
    if iv.hi / iv.lo > wide:
        return "direction only", (f"{arm} vs pool: {way} (the {span} excludes 1.0), but its ends are "
                                  f"{iv.hi / iv.lo:.1f}x apart (over {wide:g}x): how much {way} is not supported; "
                                  "claim the direction, not the figure")
    return "supported", f"{arm} vs pool: {times(iv.estimate)}, {way} ({span}): supported"
