"""Across-seed statistics of the acceptance scenarios: means, t-intervals, paired differences.

Owns the arithmetic only (no simulation): a 95% confidence interval of a mean over seeds uses
Student's t with n-1 degrees of freedom, `mean +- t_{0.975, n-1} * sd / sqrt(n)` (sample sd,
ddof=1); a paired difference is the same interval over the per-seed differences `x_i - y_i` of
two policies run on the same seeds (same requests, same faults). With fewer than two seeds the
interval is undefined (`None`).

The t quantile is scipy's (`scipy.stats.t.ppf`), exact to double precision.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from scipy.stats import t as _student_t

__all__ = ["Interval", "mean_ci", "paired_ci", "t_quantile_975"]

_DECIMALS = 9
"""Decimals kept in an interval's JSON form (well below any seed-to-seed difference)."""


def t_quantile_975(df: int) -> float:
    """The 0.975 quantile of Student's t with `df` degrees of freedom (df >= 1)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be at least 1, got {df}")
    return float(_student_t.ppf(0.975, df))


@dataclass(frozen=True, slots=True)
class Interval:
    """A mean over seeds and its 95% confidence interval (`lo`/`hi` None with fewer than 2 seeds)."""

    mean: float
    lo: float | None
    hi: float | None
    n: int

    @property
    def excludes_zero(self) -> bool:
        """True when the whole interval lies on one side of 0 (False when undefined)."""
        return self.lo is not None and self.hi is not None and (self.lo > 0 or self.hi < 0)

    def to_dict(self) -> dict[str, float | int | None]:
        r = _round
        return {"mean": r(self.mean), "ci95_lo": r(self.lo), "ci95_hi": r(self.hi), "n": self.n}


def _round(x: float | None) -> float | None:
    """`x` to `_DECIMALS`; None for None and NaN (the mean of no value: JSON null)."""
    return None if x is None or x != x else round(float(x), _DECIMALS)


def mean_ci(values: Sequence[float]) -> Interval:
    """Mean of `values` with its two-sided 95% t-interval (sample standard deviation)."""
    n = len(values)
    if n == 0:
        return Interval(math.nan, None, None, 0)
    m = math.fsum(values) / n
    if n < 2:
        return Interval(m, None, None, n)
    var = math.fsum((v - m) ** 2 for v in values) / (n - 1)
    half = t_quantile_975(n - 1) * math.sqrt(var / n)
    return Interval(m, m - half, m + half, n)


def paired_ci(xs: Sequence[float], ys: Sequence[float]) -> Interval:
    """Interval of the mean per-seed difference `x_i - y_i` (paired: both on the same seeds)."""
    if len(xs) != len(ys):
        raise ValueError(f"paired samples need equal lengths, got {len(xs)} and {len(ys)}")
    return mean_ci([x - y for x, y in zip(xs, ys, strict=True)])
