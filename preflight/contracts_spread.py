"""The robust statistics of figures measured alike, as their exact JSON shape: the report's collective section and its
storage section (preflight/storage/contracts.py) both carry them, so both import it from here, and neither imports the
other."""

from __future__ import annotations

from typing import TypedDict

from preflight.schema_marks import Amount, Count


class Spread(TypedDict):
    """Robust statistics of figures measured alike (the hosts of one sweep, the pairs of the pairwise stage): a figure
    is an outlier when it is below the threshold, min(median * e^(-k * mad_log), fraction * median)
    (collective.outlier_mad_k and outlier_fraction; preflight.collective.spread)."""

    count: Count  # the figures the statistics are over
    median_GBps: Amount | None  # None: no figure
    mad_log: Amount | None  # the median absolute deviation of ln(figure / median): within a factor e^mad_log of it
    threshold_GBps: float | None  # None: fewer than 3 figures, too few to name an outlier
