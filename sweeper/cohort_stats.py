"""The exact statistics `sweeper cohorts` states: the Wilson score interval of a proportion, the
upper tail of the hypergeometric distribution (a one-sided Fisher exact test) and Holm's step-down
correction. Pure functions in log space, no SciPy: the terms are summed from the observed count up,
each from math.lgamma, so that a fleet's 10^5 node-days neither overflow nor lose the tail."""

from __future__ import annotations

import math
from collections.abc import Sequence

Z95 = 1.959963984540054  # the standard normal's 97.5th percentile: a two-sided 95% interval


def log_comb(n: int, k: int) -> float:
    """log C(n, k) for 0 <= k <= n."""
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def _logsumexp(logs: Sequence[float]) -> float:
    top = max(logs)
    return top + math.log(sum(math.exp(v - top) for v in logs))


def hypergeom_sf(k: int, total: int, successes: int, draws: int) -> float:
    """P(X >= k) for X hypergeometric: `draws` taken without replacement from `total` items of which
    `successes` are marked. The one-sided p-value of Fisher's exact test that a group of `draws`
    node-days holds `k` or more of the `successes` failing node-days by chance."""
    if not 0 <= successes <= total or not 0 <= draws <= total:
        raise ValueError(f"hypergeometric: successes {successes} and draws {draws} must lie in 0..{total}")
    lo, hi = max(0, draws + successes - total), min(successes, draws)
    if k <= lo:
        return 1.0
    if k > hi:
        return 0.0
    base = log_comb(total, draws)
    logs: list[float] = []
    top = -math.inf
    for i in range(k, hi + 1):
        term = log_comb(successes, i) + log_comb(total - successes, draws - i) - base
        logs.append(term)
        top = max(top, term)
        if term < top - 46:  # past the mode (terms fall from there on), below 1e-20 of the largest
            break
    return min(1.0, math.exp(_logsumexp(logs)))


def binom_sf(k: int, n: int, p: float) -> float:
    """P(X >= k) for X binomial(n, p), summed in log space."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    if p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    lp, lq = math.log(p), math.log1p(-p)
    return min(1.0, math.exp(_logsumexp([log_comb(n, i) + i * lp + (n - i) * lq for i in range(k, n + 1)])))


def wilson(successes: int, trials: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a proportion (95% by default); (0, 1) for no trials."""
    if trials <= 0:
        return 0.0, 1.0
    p = successes / trials
    den = 1 + z * z / trials
    mid = (p + z * z / (2 * trials)) / den
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / den
    return max(0.0, mid - half), min(1.0, mid + half)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (family-wise error over the tests), in the input's order."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    out, running = [1.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        out[i] = running
    return out
