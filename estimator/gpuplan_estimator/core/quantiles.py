"""The one normal quantile every interval uses: P10-P90 of a log-normal error."""

from __future__ import annotations

from statistics import NormalDist

Z90 = NormalDist().inv_cdf(0.9)
"""The standard normal's 90th percentile (1.2816): P10-P90 is median x exp(+-Z90 sigma)."""
