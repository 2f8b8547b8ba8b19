"""What the claims' tests can decide: their smallest decisive results and their power.

Before a grid runs, ``matrixrl plan`` says from these what each claim can decide on it
(``analysis.design``), and an inconclusive verdict says what more would decide it at the effect it
observed. Each is exact for the model it names (docs/report.md, "What a grid can decide"): sign
tests by the binomial, claim 3 by the noncentral t (and a seeded simulation below 10 units, where
the sign-flip test binds), claim 2's context test by its own statistic's distribution, claims 6-7
by a seeded simulation of the stratified test. scipy is imported in the functions that use it, so
that ``matrixrl --help`` does not load it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

POWER = 0.8
"""The power a design is sized for."""
MOST_UNITS = 1000
"""Beyond this many units a search for the units needed stops and says "more than"."""


def _alpha(confidence: float) -> float:
    return 1 - confidence


# --- the binomial -----------------------------------------------------------------------------


def binomial_pmf(n: int, p: float) -> list[float]:
    """P(Bin(n, p) = k) for k = 0..n."""
    return _binomial_terms(n, 0, p)


def binomial_tail(n: int, k: int, p: float) -> float:
    """P(Bin(n, p) ≥ k)."""
    return min(1.0, sum(_binomial_terms(n, max(k, 0), p)))


def _binomial_terms(n: int, k: int, p: float) -> list[float]:
    """P(Bin(n, p) = j) for j = k..n, each from the last by C(n, j + 1) = C(n, j)·(n − j)/(j + 1)."""
    if k > n:
        return []
    if p <= 0 or p >= 1:
        certain = 0 if p <= 0 else n
        return [float(j == certain) for j in range(k, n + 1)]
    log_p, log_q = math.log(p), math.log1p(-p)
    log_term = math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * log_p + (n - k) * log_q
    step = log_p - log_q
    terms = []
    for j in range(k, n + 1):
        terms.append(math.exp(log_term))
        log_term += math.log((n - j) / (j + 1)) + step if j < n else 0.0
    return terms


# --- the sign test (claims 1, 4, 5) ------------------------------------------------------------


@functools.cache
def sign_threshold(units: int, confidence: float) -> int | None:
    """The fewest of ``units`` going one way that the sign test's Clopper–Pearson interval finds
    decisive (its lower bound above 0.5); None when not even all of them are."""
    if units < 1:
        return None
    pmf = binomial_pmf(units, 0.5)
    tail = 0.0
    threshold = None
    for k in range(units, units // 2, -1):  # P(Bin(units, ½) ≥ k), growing as k falls
        tail += pmf[k]
        if tail >= _alpha(confidence) / 2:
            break
        threshold = k
    return threshold


@functools.cache
def fewest_unanimous(confidence: float) -> int:
    """The fewest units, all going one way, that the sign test finds decisive (6 at 95%)."""
    units = 1
    while sign_threshold(units, confidence) is None:
        units += 1
    return units


def sign_power(units: int, share: float, confidence: float) -> float:
    """The chance that a sign test over ``units`` is decisive for the finding when each unit goes its
    way with probability ``share``."""
    k = sign_threshold(units, confidence)
    return 0.0 if k is None else binomial_tail(units, k, share)


def sign_share_needed(units: int, confidence: float, power: float = POWER) -> float | None:
    """The smallest probability of each unit going the finding's way at which ``units`` units reach
    ``power``; None when they cannot (too few units)."""
    if sign_threshold(units, confidence) is None:
        return None
    return _bisect(lambda share: sign_power(units, share, confidence) >= power, 0.5, 1.0)


def sign_units_needed(share: float, confidence: float, power: float = POWER) -> int | None:
    """The fewest units at which a sign test reaches ``power`` when each unit goes the finding's way
    with probability ``share`` (> 0.5). Its power saws up and down by a few units as the threshold
    steps, so beyond 200 units the crossing found by halving stands for it (a few units late, at
    most). None beyond :data:`MOST_UNITS`."""
    if share <= 0.5:
        return None
    fewest = fewest_unanimous(confidence)
    found = _fewest(lambda units: sign_power(units, share, confidence) >= power, fewest, MOST_UNITS)
    if found is None or found > 200:
        return found
    return next(units for units in range(fewest, found + 1) if sign_power(units, share, confidence) >= power)


def rate_needed(configurations: int, counts: Callable[[float], float], confidence: float, power: float = POWER) -> float | None:
    """The smallest per-run rate q at which a sign test over ``configurations`` reaches ``power``, when a
    configuration counts for the finding with probability ``counts(q)`` (increasing) and never against
    it, so that the test is decisive once :func:`fewest_unanimous` of them count; None when it cannot."""
    needed = fewest_unanimous(confidence)
    if configurations < needed:
        return None

    def reaches(q: float) -> bool:
        return binomial_tail(configurations, needed, counts(q)) >= power

    return _bisect(reaches, 0.0, 1.0) if reaches(1.0) else None


# --- the t and F distributions ------------------------------------------------------------------


def _t_sf(dof: int, noncentrality: float, t: float) -> float:
    """P(T > t) for T noncentral t with ``dof`` degrees of freedom."""
    from scipy.special import nctdtr

    cdf = float(nctdtr(dof, noncentrality, t))
    if math.isnan(cdf):  # scipy's nctdtr gives NaN far in a tail (e.g. 9 dof, noncentrality 39.5, t 2.26)
        return 1.0 if noncentrality > t else 0.0
    return 1.0 - cdf


@functools.cache
def _t_critical(dof: int, confidence: float) -> float:
    from scipy.special import stdtrit

    return float(stdtrit(dof, 1 - _alpha(confidence) / 2))


def known_share_sf(statistic: float, dfn: int, dfd: float, known: float, noncentrality: float = 0.0) -> float:
    """P(X > ``statistic``) for X = (χ'²_dfn(λ)/dfn)/(k + (1 − k)·u²), u² ~ χ²_dfd/dfd, k = ``known``: claim
    2's context statistic when a share k of its denominator is known and the rest estimated on ``dfd``
    degrees of freedom (``claims.context_anova``); k = 0 is the (noncentral) F's. Integrated over the
    residual's χ²_dfd by Gauss–Legendre in √x over its mass (within 40 SDs of its mean): numpy and
    scipy.special only, which plan can afford (tests/test_design.py checks it against scipy.stats)."""
    import numpy as np
    from scipy.special import chdtrc, chndtr

    y, weights = _legendre_nodes(float(dfd))
    x = y * y
    at = dfn * statistic * (known + (1 - known) * x / dfd)
    tail = chdtrc(dfn, at) if noncentrality == 0 else 1.0 - chndtr(at, dfn, noncentrality)
    return float(min(1.0, np.sum(weights * tail)))


@functools.cache
def _gauss_legendre(points: int):
    """Gauss–Legendre nodes and weights on [−1, 1], as ``numpy.polynomial.legendre.leggauss`` gives them,
    by Newton's method on the Legendre recurrence (O(points²)): leggauss solves a points × points
    eigenproblem, which took most of a plan's time at 400 points (docs/performance.md, "plan's design
lines: kept, not recomputed")."""
    import numpy as np

    x = np.cos(np.pi * (np.arange(points, 0, -1) - 0.25) / (points + 0.5))  # rising, near each root
    for _ in range(100):
        previous, current = np.ones_like(x), x.copy()
        for order in range(2, points + 1):
            previous, current = current, ((2 * order - 1) * x * current - (order - 1) * previous) / order
        derivative = points * (x * current - previous) / (x * x - 1)
        step = current / derivative
        x = x - step
        if np.abs(step).max() < 1e-15:
            break
    previous, current = np.ones_like(x), x.copy()
    for order in range(2, points + 1):
        previous, current = current, ((2 * order - 1) * x * current - (order - 1) * previous) / order
    derivative = points * (x * current - previous) / (x * x - 1)
    return x, 2 / ((1 - x * x) * derivative * derivative)


@functools.cache
def _legendre_nodes(dfd: float):
    """``(√x, weight)`` with Σ weight·g(x) ≈ E[g(χ²_dfd)]: Gauss–Legendre (400 points) in y = √x over
    the χ²'s mass, the density times dx/dy = 2y folded into the weights."""
    import numpy as np
    from scipy.special import gammaln

    spread = 40 * math.sqrt(2 * dfd)
    lo, hi = math.sqrt(max(0.0, dfd - spread)), math.sqrt(dfd + spread + 40)
    nodes, weights = _gauss_legendre(400)
    y = lo + (hi - lo) * (nodes + 1) / 2
    half = dfd / 2
    log_density = (half - 1) * np.log(y * y) - y * y / 2 - half * math.log(2) - float(gammaln(half))
    return y, weights * (hi - lo) / 2 * np.exp(log_density) * 2 * y


@functools.cache
def _share_table(dfn: int, dfd: float):
    """``(log π grid, log g(π))`` of :func:`known_share_p`: g(π) = max over the true known share k of
    P_k(the plug-in p-value ≤ π). Tables of the plug-in statistic's tail on grids of the share and the
    statistic (64 Gauss–Legendre nodes in √u² over ±12 SDs of the residual's χ²), interpolated."""
    import numpy as np
    from scipy.special import chdtrc, gammaln

    nodes, weights = _gauss_legendre(64)
    spread = 12 * math.sqrt(2 * dfd)
    lo, hi = math.sqrt(max(0.0, dfd - spread)), math.sqrt(dfd + spread + 12)
    y = lo + (hi - lo) * (nodes + 1) / 2
    half = dfd / 2
    w = weights * (hi - lo) / 2 * np.exp((half - 1) * np.log(y * y) - y * y / 2 - half * math.log(2) - float(gammaln(half))) * 2 * y
    w = w / w.sum()
    u2 = y * y / dfd
    shares = np.linspace(0.0, 1.0, 26)
    # The plug-in tail sf(t; κ) on a log grid of t, per share κ: shares × t.
    t = np.exp(np.linspace(math.log(1e-3), math.log(400.0), 240))
    denominator = shares[:, None, None] + (1 - shares[:, None, None]) * u2[None, None, :]
    tail = (chdtrc(dfn, dfn * t[None, :, None] * denominator) * w).sum(axis=2)  # shares × t, falling in t
    levels = np.exp(np.linspace(math.log(1e-6), 0.0, 49))
    # c(κ, π): the plug-in critical value, log-interpolated on each share's tail (np.interp wants it rising).
    log_c = np.array([np.interp(-np.log(levels), -np.log(np.maximum(row, 1e-300)), np.log(t)) for row in tail])
    sizes = []
    for k in shares[1:-1]:  # at k = 0 (the F) and 1 (the χ²) the plug-in share is the true one: size π
        fitted = k / (k + (1 - k) * u2)  # the share the test computes where the residual's is u2
        at = np.array([np.interp(fitted, shares, log_c[:, i]) for i in range(len(levels))])  # levels × nodes
        sizes.append((chdtrc(dfn, dfn * np.exp(at) * (k + (1 - k) * u2)[None, :]) * w).sum(axis=1))
    worst = np.maximum(np.max(sizes, axis=0), levels)
    return np.log(levels), np.log(np.maximum.accumulate(worst))


def known_share_p(statistic: float, dfn: int, dfd: float, known: float) -> float:
    """Claim 2's context p-value, valid whatever the residual variance: the plug-in p-value
    (:func:`known_share_sf` at the share ``known`` computed from the estimated residual variance),
    taken through g(π), the largest chance, over every true share, that the plug-in p-value is at most
    π (:func:`known_share_valid`). The plug-in alone ran over its level (its share rises as the
    residual variance is underestimated, thinning the tail it reads); docs/design.md, claim 2."""
    return known_share_valid(known_share_sf(statistic, dfn, dfd, known), dfn, dfd)


def known_share_valid(plug_in: float, dfn: int, dfd: float) -> float:
    """g(``plug_in``) of :func:`known_share_p`: never below ``plug_in``."""
    import numpy as np

    if plug_in <= 0:
        return 0.0
    log_levels, log_worst = _share_table(int(dfn), float(dfd))
    if math.log(plug_in) < log_levels[0]:
        return float(min(1.0, plug_in * math.exp(log_worst[0] - log_levels[0])))
    return float(min(1.0, math.exp(np.interp(math.log(plug_in), log_levels, log_worst))))


def known_share_level(dfn: int, dfd: float, alpha: float) -> float:
    """The plug-in level at which :func:`known_share_p` reaches ``alpha`` (g⁻¹(α))."""
    import numpy as np

    log_levels, log_worst = _share_table(int(dfn), float(dfd))
    return float(math.exp(np.interp(math.log(alpha), log_worst, log_levels)))


@functools.cache
def known_share_critical(dfn: int, dfd: float, known: float, alpha: float) -> float:
    """The value that :func:`known_share_sf`'s central statistic exceeds with probability ``alpha``."""
    hi = 2.0
    while known_share_sf(hi, dfn, dfd, known) > alpha:
        hi *= 2
    return _bisect(lambda f: known_share_sf(f, dfn, dfd, known) <= alpha, 0.0, hi, 40)


# --- the Student-t interval (claim 3) ----------------------------------------------------------


def t_power(units: int, effect: float, confidence: float) -> float:
    """The chance that the Student-t interval over ``units`` normal units lies above 0 when their mean
    is ``effect`` of their standard deviations."""
    if units < 2:
        return 0.0
    return _t_sf(units - 1, effect * math.sqrt(units), _t_critical(units - 1, confidence))


@functools.cache
def sign_patterns(m: int):
    """Every pattern of m signs up to 16 units, else 16,384 seeded ones (rows of ±1)."""
    import numpy as np

    if m <= 16:
        return (1 - 2 * ((np.arange(1 << m)[:, None] >> np.arange(m)) & 1)).astype(float)
    return (1 - 2 * np.random.default_rng(20261207).integers(0, 2, size=(1 << 14, m))).astype(float)


@functools.cache
def peak_power(units: int, effect: float, confidence: float, draws: int = 2000) -> float:
    """Claim 3's power: the chance that the Student-t interval over ``units`` normal units lies above 0
    and the sign-flip test agrees, their mean ``effect`` of their standard deviations. None below
    :func:`fewest_unanimous` units (the sign-flip test's smallest p, 2/2^m, is not below the level);
    the t's from 10 units (the two within 2% there: docs/report.md, claim 3); seeded simulation between."""
    import numpy as np
    from scipy.special import stdtrit

    if units < fewest_unanimous(confidence):
        return 0.0
    if units >= 10:
        return t_power(units, effect, confidence)
    x = np.random.default_rng(units).standard_normal((draws, units)) + effect
    t = x.mean(axis=1) / (x.std(axis=1, ddof=1) / math.sqrt(units))
    signs = sign_patterns(units)
    flips = (np.abs(signs @ x.T) >= np.abs(x.sum(axis=1)) - 1e-12).mean(axis=0)
    return float(((t > stdtrit(units - 1, (1 + confidence) / 2)) & (flips < 1 - confidence)).mean())


def peak_effect_needed(units: int, confidence: float, power: float = POWER) -> float | None:
    """The smallest mean, in standard deviations of the units, at which claim 3 over ``units`` reaches
    ``power``; None where no mean does."""
    if peak_power(units, 100.0, confidence) < power:
        return None
    return _bisect(lambda effect: peak_power(units, effect, confidence) >= power, 0.0, 100.0, 24)


def peak_units_needed(effect: float, confidence: float, power: float = POWER) -> int | None:
    """The fewest units at which claim 3 reaches ``power`` at a mean of ``effect`` standard deviations."""
    if effect <= 0:
        return None
    return _fewest(lambda units: peak_power(units, effect, confidence) >= power, 2, MOST_UNITS)


# --- claim 2's context test --------------------------------------------------------------------


def context_power(contexts: int, cells_per_context: float, residual_dof: int, omega2: float, confidence: float,
                  base_ratio: float = 1.0) -> float:  # fmt: skip
    """The chance that claim 2's context test rejects at Holm's first step (α/2) when the context
    explains ``omega2`` of a cell's gain variance, with evaluation noise alone (a base evaluation's
    variance ``base_ratio`` times a checkpoint's): its statistic a noncentral χ² over a denominator
    whose bases' share is known, at that statistic's own critical value (docs/report.md, "What a
    grid can decide", derives it and checks it by simulation)."""
    if contexts < 2 or residual_dof < 1 or not 0 <= omega2 < 1:
        return 0.0
    n, b = cells_per_context, base_ratio
    dfn, dfd = contexts - 1, residual_dof
    noncentrality = (1 + b) * n * contexts * omega2 / ((1 + b * n) * (1 - omega2))
    known = b * n / (1 + b * n)
    critical = known_share_critical(dfn, float(dfd), known, known_share_level(dfn, float(dfd), _alpha(confidence) / 2))
    return known_share_sf(critical, dfn, float(dfd), known, noncentrality)


def context_omega2_needed(contexts: int, cells_per_context: float, residual_dof: int, confidence: float, power: float = POWER,
                          base_ratio: float = 1.0) -> float | None:  # fmt: skip
    """The smallest ω² of the context at which its test reaches ``power`` (:func:`context_power`)."""
    if contexts < 2 or residual_dof < 1:
        return None
    return _bisect(lambda omega2: context_power(contexts, cells_per_context, residual_dof, omega2, confidence, base_ratio) >= power,
                   0.0, 0.999, 12)  # fmt: skip


def context_seeds_needed(contexts: int, cells_per_context: float, omega2: float, confidence: float, power: float = POWER,
                         base_ratio: float = 1.0) -> int | None:  # fmt: skip
    """How many times the grid's seeds claim 2's context test needs to reach ``power`` at ``omega2``
    (1: as it is); None when 100 times cannot (the shared bases' error does not shrink with seeds:
    only more contexts lower it)."""
    if contexts < 2 or not 0 < omega2 < 1:
        return None

    def reaches(times: int) -> bool:
        cells = cells_per_context * times
        dof = round(contexts * cells) - contexts - 1
        return dof >= 1 and context_power(contexts, cells, dof, omega2, confidence, base_ratio) >= power

    return _fewest(reaches, 1, 100)


def _fewest(holds: Callable[[int], bool], lo: int, hi: int) -> int | None:
    """The smallest integer in [lo, hi] at which ``holds`` (increasing, or nearly) becomes true; None when
    it does not hold at ``hi``."""
    if lo > hi or not holds(hi):
        return None
    while lo < hi:
        middle = (lo + hi) // 2
        if holds(middle):
            hi = middle
        else:
            lo = middle + 1
    return lo


def _bisect(holds: Callable[[float], bool], lo: float, hi: float, steps: int = 40) -> float:
    """The smallest x in [lo, hi] at which the monotone ``holds`` becomes true (to ``steps`` halvings)."""
    for _ in range(steps):
        middle = (lo + hi) / 2
        if holds(middle):
            hi = middle
        else:
            lo = middle
    return hi


# --- claim 2's policy test, claim 3 in points, claim 4 with shared cliffing, claims 6-7 within configurations ---------

EVALUATION_ACCURACY = 0.5
"""The accuracy at which ``plan`` puts evaluation noise into points (the binomial variance is largest there)."""
CALM_RISES = 0.2
"""The share of calm runs whose signal rises as early as a cliff's, as ``plan`` assumes for claims 6-7."""
SHARED_CLIFFS = 0.1
"""The share of shared runs that cliff, as ``plan`` assumes for claim 4."""
CLIFF_SHARES = (0.75, 0.25)
"""The shares of isolated's and shared's failures that are cliffs, as ``plan`` assumes for claim 5."""
PRECEDES = 0.9
"""The share of cliffs the signal precedes at which ``plan`` gives claims 6-7's power (the calibration's planted effect)."""
DRAWS = 1000
"""Simulated studies behind claims 6-7's power in ``plan`` (seeded: the same line every time)."""


def evaluation_sd(trials: int) -> float:
    """The binomial SD of one evaluation of ``trials`` trials at :data:`EVALUATION_ACCURACY`."""
    return math.sqrt(EVALUATION_ACCURACY * (1 - EVALUATION_ACCURACY) / trials)


def policy_difference_needed(cells: int, residual_dof: int, sd: float, confidence: float, power: float = POWER) -> float | None:
    """The mean gain difference isolated − shared (balanced modes over ``cells``) at which claim 2's policy
    test, F(1, df_resid) at Holm's first step (α/2), reaches ``power`` when each cell's gain has the
    evaluation SD ``sd`` about its context's (the shared base cancels within a context)."""
    from scipy.special import fdtri, ncfdtr

    if residual_dof < 1 or cells < 2:
        return None
    critical = float(fdtri(1, residual_dof, 1 - _alpha(confidence) / 2))
    noncentrality = _bisect(lambda lam: 1 - float(ncfdtr(1, residual_dof, lam, critical)) >= power, 0.0, 1000.0, 40)
    return math.sqrt(4 * sd * sd * noncentrality / cells)


def _ties(seeds: int, rate: float, other: float) -> tuple[float, float]:
    """``(P(X > Y), P(X < Y))`` for X ~ Bin(seeds, rate), Y ~ Bin(seeds, other)."""
    x, y = binomial_pmf(seeds, rate), binomial_pmf(seeds, other)
    above = sum(x[i] * y[j] for i in range(seeds + 1) for j in range(seeds + 1) if i > j)
    below = sum(x[i] * y[j] for i in range(seeds + 1) for j in range(seeds + 1) if i < j)
    return above, below


def sign_power_with_ties(units: int, p_for: float, p_against: float, confidence: float) -> float:
    """The sign test's power over ``units`` units, each for the finding with probability ``p_for``, against
    it with ``p_against``, else tied (left out of the test)."""
    untied = p_for + p_against
    if untied <= 0:
        return 0.0
    share = p_for / untied
    return sum(weight * sign_power(m, share, confidence) for m, weight in enumerate(binomial_pmf(units, untied)) if m)


def cliff_rate_needed(configurations: int, seeds: int, shared: float, confidence: float, power: float = POWER) -> float | None:
    """The isolated cliff rate at which claim 4's sign test over ``configurations`` of ``seeds`` seeds a mode
    reaches ``power`` when shared's runs cliff at ``shared``; None when even 1 does not."""

    def reaches(rate: float) -> bool:
        return sign_power_with_ties(configurations, *_ties(seeds, rate, shared), confidence) >= power

    return _bisect(reaches, shared, 1.0, 20) if reaches(1.0) else None


def _non_cliff_shares(seeds: int, fails: float, cliffs: float) -> dict[float, float]:
    """The distribution of a mode's share of failing seeds that fail otherwise than by a cliff (claim 5's
    unit), over ``seeds`` runs each failing with probability ``fails``, a failure a cliff with ``cliffs``;
    configurations where the mode has no failure are left out (they are not units)."""
    shares: dict[float, float] = {}
    for failed, p_failed in enumerate(binomial_pmf(seeds, fails)):
        for other, p_other in enumerate(binomial_pmf(failed, 1 - cliffs) if failed else []):
            shares[other / failed] = shares.get(other / failed, 0.0) + p_failed * p_other
    return shares


def failure_power(configurations: int, seeds: int, fails: float, cliff_shares: tuple[float, float], confidence: float) -> float:
    """Claim 5's power: its sign test over ``configurations`` of ``seeds`` seeds a mode, every run failing
    with probability ``fails``, a failure a cliff with probability ``cliff_shares`` (isolated, shared)."""
    isolated, shared = (_non_cliff_shares(seeds, fails, share) for share in cliff_shares)
    p_for = sum(p * q for a, p in shared.items() for b, q in isolated.items() if a > b)
    p_against = sum(p * q for a, p in shared.items() for b, q in isolated.items() if a < b)
    return sign_power_with_ties(configurations, p_for, p_against, confidence)


def failure_rate_needed(configurations: int, seeds: int, cliff_shares: tuple[float, float], confidence: float,
                        power: float = POWER) -> float | None:  # fmt: skip
    """The failure rate of both modes' runs at which :func:`failure_power` reaches ``power``; None when
    even failing always does not."""

    def reaches(fails: float) -> bool:
        return failure_power(configurations, seeds, fails, cliff_shares, confidence) >= power

    return _bisect(reaches, 0.0, 1.0, 20) if reaches(1.0) else None


@functools.cache
def _hypergeometric(total: int, early: int, cliffs: int):
    import numpy as np
    from scipy.special import comb

    support = np.arange(max(0, early - (total - cliffs)), min(early, cliffs) + 1)
    pmf = comb(early, support) * comb(total - early, cliffs - support) / comb(total, cliffs)
    return int(support[0]), pmf


def stratified_power(strata: int, seeds: int, precedes: float, calm_rises: float, confidence: float,
                     draws: int = DRAWS, seed: int = 0) -> float:  # fmt: skip
    """Claims 6-7's power, simulated (``draws`` studies, seeded): ``strata`` configurations of ``seeds``
    cells, each a cliff with probability ½, the signal preceding a cliff with probability ``precedes``
    and rising as early in a calm run with ``calm_rises``; supported when the exact stratified test's
    P(T ≥ t) < α/2 (``claims.stratified_exact``), counting the configurations that hold both."""
    import numpy as np

    if seeds < 2 or strata < 1:
        return 0.0
    rng = np.random.default_rng(seed)
    cliffs = rng.binomial(seeds, 0.5, size=(draws, strata))
    preceded = rng.binomial(cliffs, precedes)
    rose = rng.binomial(seeds - cliffs, calm_rises)
    half = _alpha(confidence) / 2
    supported = 0
    for n1, a, c in zip(cliffs.tolist(), preceded.tolist(), rose.tolist()):
        pmf, low, observed = np.ones(1), 0, 0
        for cliff, early_cliff, early_calm in zip(n1, a, c):
            if 0 < cliff < seeds:
                first, table = _hypergeometric(seeds, early_cliff + early_calm, cliff)
                pmf = np.convolve(pmf, table)
                low += first
                observed += early_cliff
        supported += len(pmf) > 1 and float(pmf[observed - low:].sum()) < half
    return supported / draws
