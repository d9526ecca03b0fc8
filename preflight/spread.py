"""Robust statistics of bandwidth figures measured alike: the median, the median absolute deviation (MAD), and the
figures well below them; and the report's shapes of them (``Spread``, ``Stats``). The collective (its sweep, pairwise and
speed sections) and the storage stage (each path's hosts) judge their figures by this one rule and report them in these
shapes, so it sits with what every stage shares, and neither stage imports the other's.

Bandwidth is a rate: what slows it (a busy CPU, a shared link, a fault) divides it, so its noise is a factor, not an
amount. The MAD is therefore taken of the figures' logarithms around the median's: mad_log = median(|ln(x / median)|),
so the figures typically lie within a factor e^mad_log of the median (mad_log 0.1: within about 10%). A figure is an
outlier when it is below both

- median * e^(-k * mad_log) (``collective.outlier_mad_k``, 4): far from the bulk in the bulk's own spread, median - k *
  MAD on the logarithmic scale, so that a healthy but noisy set (a loaded machine, a shared network) names nobody; and
- fraction * median (``collective.outlier_fraction``, 0.5): slow by a margin that matters, so that a tight set (eight
  links within 1% of each other: a MAD near 0) does not name the one 3% off.

Median and MAD, not mean and standard deviation: one host at a tenth of the speed moves the mean and inflates the
standard deviation until it hides itself; it moves the median and the MAD of eight figures hardly at all. On the
logarithmic scale a host at a tenth of the median stands as far out as one at ten times it, and two healthy hosts at
0.5 and 1.0 of the median do not make a tenth look ordinary, as they would on the linear scale. Fewer than three
figures name no outlier: with two, each is as far from their median as the other.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TypedDict

from preflight.schema_marks import Amount, Count

MIN_FIGURES = 3
_FLOOR_GBPS = 1e-9  # a failed run's 0 GB/s, on the logarithmic scale


class Spread(TypedDict):
    """Robust statistics of figures measured alike (the hosts of one sweep, the pairs of the pairwise stage): a figure
    is an outlier when it is below the threshold, min(median * e^(-k * mad_log), fraction * median)
    (collective.outlier_mad_k and outlier_fraction; preflight.spread)."""

    count: Count  # the figures the statistics are over
    median_GBps: Amount | None  # None: no figure
    mad_log: Amount | None  # the median absolute deviation of ln(figure / median): within a factor e^mad_log of it
    threshold_GBps: float | None  # None: fewer than 3 figures, too few to name an outlier


class Stats(TypedDict):
    """Robust statistics of figures measured alike, in the figures' own unit (preflight.spread): a figure is an
    outlier when it is below the threshold, min(median * e^(-k * mad_log), fraction * median)."""

    count: Count
    median: Amount | None  # None: no figure
    mad_log: Amount | None
    threshold: Amount | None  # None: fewer than 3 figures, too few to name an outlier


def median(values: Iterable[float]) -> float:
    """The median; the mean of the middle two for an even count. ValueError for no values."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("the median of no values")
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


@dataclass(frozen=True)
class Outliers:
    """The statistics of a set of figures and the keys of its outliers, slowest first."""

    count: int
    median: float | None
    mad_log: float | None  # the median of |ln(figure / median)|
    threshold: float | None  # figures strictly below it are outliers; None: too few figures
    outliers: list[str]

    def below(self, value: float) -> bool:
        """Whether a figure (of this set or measured alike) is an outlier against this set."""
        return self.threshold is not None and value < self.threshold

    def stats(self) -> Stats:
        """The report's form in the figures' own unit, rounded."""
        return {"count": self.count, "median": _round(self.median), "mad_log": _round(self.mad_log), "threshold": _round(self.threshold)}

    def summary(self) -> Spread:
        """The report's form, rounded as the report's rates are."""
        return {"count": self.count, "median_GBps": _round(self.median), "mad_log": _round(self.mad_log),
                "threshold_GBps": _round(self.threshold)}


def outliers(figures: Mapping[str, float], k: float, fraction: float) -> Outliers:
    """The median and log-scale MAD of the figures, and the keys of those below min(median * e^(-k * mad_log),
    fraction * median)."""
    if not figures:
        return Outliers(0, None, None, None, [])
    values = list(figures.values())
    middle = median(values)
    spread = mad_log(values, middle)
    if len(values) < MIN_FIGURES:
        return Outliers(len(values), middle, spread, None, [])
    threshold = min(middle * math.exp(-k * spread), fraction * middle)
    slow = sorted((key for key, value in figures.items() if value < threshold), key=lambda key: (figures[key], key))
    return Outliers(len(values), middle, spread, threshold, slow)


def mad_log(values: Iterable[float], middle: float) -> float:
    """The median absolute deviation of the figures' logarithms around their median's, median(|ln(x / middle)|)."""
    return median(abs(math.log(max(v, _FLOOR_GBPS) / max(middle, _FLOOR_GBPS))) for v in values)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 6)
