"""Scaling fits with their uncertainty, held-out error and a refusal when data cannot tell.

One observation is one **run** (a network of a given size with a given load), never a time
bucket of a run: buckets of one run are autocorrelated and share everything but time.
:func:`fit` fits a target (say, the core router's table size) against terms (flows,
members, routers) by least squares, either ``linear`` (y = b0 + sum b_i x_i) or ``power``
(ln y = b0 + sum b_i ln x_i), and gives each coefficient its standard error and confidence
interval (Student t with n - p degrees of freedom), the residual spread, R², the range of
every term seen (the model's validity range) and the error on held-out runs (leave one run
out, and the runs at the largest value of the first term predicted from the others: an
honest test of extrapolation).

It refuses, with a :class:`Refusal` that says why, when the degrees of freedom are too few
(:data:`MIN_DF`) or two terms move together; :func:`predict` refuses a point beyond
``max_factor`` times the range seen or along a term that never varied. :func:`fit_both`
and :func:`run_grid` are what the sweeps (:mod:`flowtrace.study`, :mod:`flowtrace.backbone`)
share: both models of a target, and the grid of runs they are fitted over.
Imports numpy (and scipy for t quantiles when present) lazily; no Spark.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: residual degrees of freedom a fit needs before it reports coefficients
MIN_DF = 3
#: |correlation| between two terms (in the model's space) above which they cannot be told apart
MAX_CORR = 0.98
#: how far beyond the observed range of a term a prediction may go (factor on the maximum)
MAX_FACTOR = 2.0
#: a prediction beyond the sampled range of a term is refused unless predicting the runs at
#: that term's largest value from the others erred by at most this much (mean |relative|)
MAX_EXTRAPOLATION_ERROR = 0.10


@dataclass
class Fit:
    """A fitted model. ``coef``/``se``/``ci`` are keyed by term, ``const`` included."""

    target: str
    model: str
    terms: tuple[str, ...]
    n: int
    df: int
    coef: dict[str, float]
    se: dict[str, float]
    ci: dict[str, tuple[float, float]]
    r2: float
    sigma: float
    level: float
    ranges: dict[str, tuple[float, float]]
    dropped: dict[str, float] = field(default_factory=dict)  #: constant terms -> their value
    loo_error: float | None = None  #: mean |relative error| leaving one run out
    extrapolation_error: float | None = None  #: same, on runs at the largest first term
    extrapolation_runs: int = 0
    #: term -> (mean |relative error|, runs): the runs at the term's largest value predicted
    #: from the others (None: could not be tested)
    extrapolation: dict[str, tuple[float | None, int]] = field(default_factory=dict)
    clusters: int | None = None  #: clusters of the cluster-robust errors (None: classical)
    notes: list[str] = field(default_factory=list)
    #: (X'X)^-1 of the fit and the t quantile at its level: what a prediction interval needs
    xtx_inv: Any = None
    t_quantile: float = 0.0
    #: covariance of the coefficients (classical, or cluster-robust with ``clusters``)
    cov: Any = None

    def formula(self) -> str:
        parts = [f"{self.coef['const']:.4g}"]
        for t in self.terms:
            parts.append(f"{self.coef[t]:+.4g}·{t}" if self.model == "linear"
                         else f"{t}^{self.coef[t]:.4g}")
        if self.model == "linear":
            return f"{self.target} = " + " ".join(parts)
        return f"{self.target} = exp({parts[0]})·" + "·".join(parts[1:])


@dataclass
class Refusal:
    """No fit (or no prediction), and why, in one sentence a user can act on."""

    target: str
    model: str
    reason: str


def _t_quantile(level: float, df: int) -> float:
    try:
        from scipy import stats

        return float(stats.t.ppf(0.5 + level / 2, df))
    except ImportError:  # pragma: no cover - scipy is in the spark extra
        return 1.959964 * (1 + 2.5 / max(df, 1))  # rough, conservative


def _design(rows: Sequence[Mapping[str, Any]], target: str, terms: Sequence[str],
            model: str) -> tuple[Any, Any]:
    import numpy as np

    X = np.array([[float(r[t]) for t in terms] for r in rows], dtype=float).reshape(
        len(rows), len(terms))
    y = np.array([float(r[target]) for r in rows], dtype=float)
    if model == "power":
        X, y = np.log(X), np.log(y)
    return X, y


def _usable(rows: Sequence[Mapping[str, Any]], target: str, terms: Sequence[str],
            model: str) -> list[Mapping[str, Any]]:
    def ok(v: Any) -> bool:
        return v is not None and math.isfinite(float(v)) and (model == "linear" or v > 0)

    return [r for r in rows if ok(r.get(target)) and all(ok(r.get(t)) for t in terms)]


def fit(rows: Sequence[Mapping[str, Any]], target: str, terms: Sequence[str],
        model: str = "linear", *, level: float = 0.95, min_df: int = MIN_DF,
        holdout: bool = True, cluster: str | None = None) -> Fit | Refusal:
    """Fit *target* against *terms* over *rows* (one per run); see the module docstring.

    With *cluster* (a column: say the topology a run used), standard errors, intervals and
    prediction intervals are cluster-robust (the CR1 sandwich, Student t with clusters - 1
    degrees of freedom): runs that share a cluster are not counted as independent."""
    import numpy as np

    if model not in ("linear", "power"):
        raise ValueError(f"unknown model {model!r}")
    rows = _usable(rows, target, terms, model)
    n = len(rows)
    if n == 0:
        return Refusal(target, model, f"no run has a usable value of {target}")
    X, y = _design(rows, target, terms, model)
    keep: list[str] = []
    dropped: dict[str, float] = {}
    for i, t in enumerate(terms):
        col = X[:, i]
        if np.ptp(col) <= 1e-9 * max(1.0, float(np.abs(col).max())):
            dropped[t] = float(rows[0][t])
        else:
            keep.append(t)
    idx = [terms.index(t) for t in keep]
    Xk = X[:, idx]
    for a in range(len(keep)):
        for b in range(a + 1, len(keep)):
            rho = float(np.corrcoef(Xk[:, a], Xk[:, b])[0, 1])
            if abs(rho) > MAX_CORR:
                return Refusal(target, model, (
                    f"{keep[a]} and {keep[b]} move together across the runs (correlation "
                    f"{rho:.3f}): their effects cannot be told apart; vary them independently "
                    "(flowtrace study sweeps them on a grid)"))
    p = len(keep) + 1
    df = n - p
    if df < min_df:
        return Refusal(target, model, (
            f"too few runs: {n} run(s) for {p} parameter(s) leave {max(df, 0)} degree(s) of "
            f"freedom, at least {min_df} are needed; run more network sizes, loads or seeds"))
    A = np.column_stack([np.ones(n), Xk])
    beta, *_ = np.linalg.lstsq(A, y, rcond=None)
    resid = y - A @ beta
    ss_res = float(resid @ resid)
    ss_tot = float(((y - y.mean()) ** 2).sum())
    sigma = math.sqrt(ss_res / df)
    xtx_inv = np.linalg.pinv(A.T @ A)
    cov = xtx_inv * sigma ** 2
    groups = None
    if cluster is not None:
        labels = [r[cluster] for r in rows]
        groups = len(set(labels))
        if groups - 1 < min_df:
            return Refusal(target, model, (
                f"too few independent clusters ({cluster}): {groups} leave {groups - 1} "
                f"degree(s) of freedom, at least {min_df} are needed"))
        meat = np.zeros((p, p))
        for g in set(labels):
            idx_g = [i for i, lab in enumerate(labels) if lab == g]
            score = A[idx_g].T @ resid[idx_g]
            meat += np.outer(score, score)
        cov = (groups / (groups - 1)) * ((n - 1) / df) * (xtx_inv @ meat @ xtx_inv)
        df = groups - 1
    se = np.sqrt(np.maximum(np.diag(cov), 0.0))
    tq = _t_quantile(level, df)
    names = ["const", *keep]
    out = Fit(target=target, model=model, terms=tuple(keep), n=n, df=df,
              coef={k: float(b) for k, b in zip(names, beta)},
              se={k: float(s) for k, s in zip(names, se)},
              ci={k: (float(b - tq * s), float(b + tq * s)) for k, b, s in zip(names, beta, se)},
              r2=(1.0 - ss_res / ss_tot) if ss_tot > 0 else float("nan"), sigma=sigma,
              level=level, ranges={t: (min(float(r[t]) for r in rows),
                                       max(float(r[t]) for r in rows)) for t in terms},
              dropped=dropped, clusters=groups, xtx_inv=xtx_inv, cov=cov, t_quantile=tq)
    for t, v in dropped.items():
        out.notes.append(f"{t} was {v:g} in every run: its effect is unknown, predictions "
                         f"must keep {t} = {v:g}")
    if holdout:
        _holdout(out, rows, min_df, level)
    return out


def value_at(f: Fit, point: Mapping[str, float]) -> float:
    """The fitted value of *f* at *point* (its terms' values)."""
    v = f.coef["const"]
    for t in f.terms:
        x = float(point[t])
        v += f.coef[t] * (x if f.model == "linear" else math.log(x))
    return math.exp(v) if f.model == "power" else v


def _holdout(f: Fit, rows: Sequence[Mapping[str, Any]], min_df: int, level: float) -> None:
    terms = [*f.terms, *f.dropped]

    def rel_errors(train: Sequence[Mapping[str, Any]], test: Sequence[Mapping[str, Any]]
                   ) -> list[float]:
        g = fit(train, f.target, terms, f.model, level=level, min_df=1, holdout=False)
        if isinstance(g, Refusal) or any(t in g.dropped for t in f.terms):
            return []  # the training runs cannot see a term the model needs
        errs = []
        for r in test:
            y = float(r[f.target])
            if y != 0:
                errs.append(abs(value_at(g, r) - y) / abs(y))
        return errs

    loo: list[float] = []
    for i in range(len(rows)):
        loo += rel_errors([r for j, r in enumerate(rows) if j != i], [rows[i]])
    f.loo_error = sum(loo) / len(loo) if loo else None
    for term in f.terms:
        top = max(float(r[term]) for r in rows)
        test = [r for r in rows if float(r[term]) == top]
        train = [r for r in rows if float(r[term]) < top]
        errs = rel_errors(train, test)
        f.extrapolation[term] = (sum(errs) / len(errs) if errs else None, len(errs))
    if f.terms:
        f.extrapolation_error, f.extrapolation_runs = f.extrapolation[f.terms[0]]


def predict(f: Fit, point: Mapping[str, float], *, max_factor: float = MAX_FACTOR
            ) -> tuple[float, float, float] | Refusal:
    """(value, low, high) of the prediction interval at *point*, or why not."""
    import numpy as np

    for t, v in f.dropped.items():
        if t in point and not math.isclose(float(point[t]), v, rel_tol=1e-9):
            return Refusal(f.target, f.model, (
                f"{t} was {v:g} in every run, so the fit cannot say what {t} = "
                f"{float(point[t]):g} does; sweep {t}"))
    for t in f.terms:
        lo, hi = f.ranges[t]
        x = float(point[t])
        if x > hi * max_factor or (lo > 0 and x < lo / max_factor):
            return Refusal(f.target, f.model, (
                f"{t} = {x:g} is outside the range the runs cover ({lo:g} to {hi:g}) by more "
                f"than {max_factor:g}x: the model is not valid there; extend the sweep"))
        if x > hi:
            err, runs = f.extrapolation.get(t, (None, 0))
            if err is None or err > MAX_EXTRAPOLATION_ERROR:
                why = ("could not be tested (too few runs below the largest "
                       f"{t})" if err is None else
                       f"missed the {runs} run(s) at {t} = {hi:g} by {100 * err:.0f}% on "
                       f"average when fitted without them (more than "
                       f"{100 * MAX_EXTRAPOLATION_ERROR:.0f}%)")
                return Refusal(f.target, f.model, (
                    f"{t} = {x:g} is beyond the sampled range ({lo:g} to {hi:g}) and "
                    f"extrapolating along {t} {why}: not valid there; extend the sweep"))
    x0 = [1.0] + [float(point[t]) if f.model == "linear" else math.log(float(point[t]))
                  for t in f.terms]
    x0a = np.array(x0)
    centre = float(x0a @ np.array([f.coef[k] for k in ("const", *f.terms)]))
    half = f.t_quantile * math.sqrt(f.sigma ** 2 + float(x0a @ f.cov @ x0a))
    if f.model == "power":
        return math.exp(centre), math.exp(centre - half), math.exp(centre + half)
    return centre, centre - half, centre + half


def best(fits: Sequence[Fit | Refusal]) -> Fit | None:
    """The fitted model with the lowest leave-one-out error (None if all refused)."""
    ok = [f for f in fits if isinstance(f, Fit)]
    if not ok:
        return None
    return min(ok, key=lambda f: (f.loo_error if f.loo_error is not None else math.inf))


MODELS = ("linear", "power")


def fit_both(rows: Sequence[Mapping[str, Any]], target: str, terms: Sequence[str], *,
             level: float = 0.95, cluster: str | None = None
             ) -> tuple[list[Fit | Refusal], Fit | None]:
    """Both :data:`MODELS` of *target* over *rows* and the better one (:func:`best`; None
    when both are refused): what every sweep reports per target."""
    fits = [fit(rows, target, terms, model, level=level, cluster=cluster) for model in MODELS]
    return fits, best(fits)


def run_grid(grid: Sequence[tuple[Any, ...]], run: Callable[..., dict[str, Any]],
             describe: Callable[[tuple[Any, ...], dict[str, Any]], str],
             progress: Callable[[str], None] | None = None, label: str = "study"
             ) -> list[dict[str, Any]]:
    """``run(*point)`` for every point of a sweep's *grid*, in order: the runs a fit is made
    from. After each, *progress* (if any) gets ``[label +SECONDS] run K/N`` followed by
    ``describe(point, row)``."""
    rows: list[dict[str, Any]] = []
    t0 = time.monotonic()
    for k, point in enumerate(grid, 1):
        rows.append(run(*point))
        if progress:
            progress(f"[{label} +{time.monotonic() - t0:6.1f}s] run {k}/{len(grid)}"
                     + describe(point, rows[-1]))
    return rows


def as_rows(results: Sequence[Fit | Refusal]) -> list[dict[str, Any]]:
    """One row per (target, model, term) for a table; a refusal is one row with its reason."""
    rows: list[dict[str, Any]] = []
    for f in results:
        if isinstance(f, Refusal):
            rows.append({"target": f.target, "model": f.model, "term": None, "coef": None,
                         "se": None, "ci_lo": None, "ci_hi": None, "n": None, "df": None,
                         "r2": None, "loo_error": None, "extrapolation_error": None,
                         "note": f.reason})
            continue
        for term in ("const", *f.terms):
            rows.append({"target": f.target, "model": f.model, "term": term,
                         "coef": f.coef[term], "se": f.se[term], "ci_lo": f.ci[term][0],
                         "ci_hi": f.ci[term][1], "n": f.n, "df": f.df, "r2": f.r2,
                         "loo_error": f.loo_error,
                         "extrapolation_error": f.extrapolation_error,
                         "note": "; ".join(f.notes)})
    return rows
