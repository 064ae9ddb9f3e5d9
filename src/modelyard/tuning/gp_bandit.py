"""The Gaussian-process bandit: Vertex Vizier's default algorithm, as an Optuna sampler.

Each suggestion fits a Gaussian process (Matern-5/2 kernel with one length scale per dimension,
its hyperparameters by maximum a posteriori on the log marginal likelihood) to the completed
trials, mapped into the unit cube (log scales in log space, categories one-hot), and proposes the
point that maximises the upper confidence bound ``mean + UCB_COEFFICIENT * stddev`` within a trust
region around the trials. The outputs are warped first as Vizier's default designer warps them
(half-rank, then log): the GP models the order of the bad half and the differences among the best,
not the size of a few disasters (Rosenbrock's 1e5 beside 1e2). Trials still
running count as observed at the model's own mean ("kriging believer"): their uncertainty is
spent, so parallel workers are sent to different places. Several metrics are scalarised with a
random Chebyshev weighting per suggestion, so successive suggestions cover the Pareto front.
The first trial is the centre of the space, the next few random, as Vizier seeds its GP.

NumPy and SciPy only (no JAX, no PyTorch): see docs/tuning.md for why this and not the
``google-vizier`` package's designer.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.samplers import BaseSampler, RandomSampler
from optuna.search_space import IntersectionSearchSpace
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState
from scipy import optimize
from scipy.linalg import cho_factor, cho_solve, solve_triangular
from scipy.stats import norm, qmc
from threadpoolctl import threadpool_limits

UCB_COEFFICIENT = 1.8  # Vizier's GP-UCB exploration weight
SEED_TRIALS = 4  # the centre, then random points, before the GP takes over
# The log warping's strength (Vizier's offset, 1.5 there): the best value maps to 0.5, the worst to -0.5. 4 did better
# than 1.5 and 10 over bench/vizier.py's functions (10 seeds each, held-out seeds checked), none of them alone.
WARP = 4.0
TRUST_MIN, TRUST_GROWTH, TRUST_OFF = 0.2, 0.05, 0.5  # the trust region's radius: min + growth * trials / (dims + 1)
_CANDIDATES_LOG2 = 10  # 1024 quasi-random candidates per suggestion
_LOCAL = 500
_JITTER = 1e-6
# No suggestion repeats a trial: a candidate whose every coordinate (after rounding integers and discrete values to
# what the trial would get) lies within MIN_GAP of an evaluated or running trial's, in the unit cube, is refused.
# A near-copy of a trial mostly measures that trial's noise again (the digits study's GP spent its last trials on
# learning rates a few percent apart); 0.01 is 1% of each parameter's range (of its log for log scales).
MIN_GAP = 0.01


def _numeric(dist: CategoricalDistribution) -> bool:
    return all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in dist.choices)


class _Encoder:
    """Parameter values <-> points of the unit cube (one column per number, one per category)."""

    def __init__(self, space: dict[str, BaseDistribution]) -> None:
        self.space = space
        self.columns: list[tuple[str, int]] = []  # (param, category index or -1)
        for name, dist in space.items():
            if isinstance(dist, CategoricalDistribution) and not _numeric(dist):
                self.columns += [(name, i) for i in range(len(dist.choices))]
            else:
                self.columns.append((name, -1))
        self.dim = len(self.columns)
        self.onehot = np.array([i >= 0 for _, i in self.columns])

    @staticmethod
    def _bounds(dist: BaseDistribution) -> tuple[float, float, bool]:
        if isinstance(dist, CategoricalDistribution):
            return float(min(dist.choices)), float(max(dist.choices)), False
        return float(dist.low), float(dist.high), bool(dist.log)

    def encode(self, params: dict[str, Any]) -> np.ndarray:
        out = np.zeros(self.dim)
        for j, (name, cat) in enumerate(self.columns):
            dist, value = self.space[name], params[name]
            if cat >= 0:
                out[j] = float(dist.choices.index(value) == cat)
                continue
            low, high, log = self._bounds(dist)
            if log:
                low, high, value = math.log(low), math.log(high), math.log(value)
            out[j] = 0.5 if high == low else (float(value) - low) / (high - low)
        return out

    def decode(self, x: np.ndarray) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, dist in self.space.items():
            cols = [j for j, (n, _) in enumerate(self.columns) if n == name]
            if isinstance(dist, CategoricalDistribution) and not _numeric(dist):
                out[name] = dist.choices[int(np.argmax(x[cols]))]
                continue
            low, high, log = self._bounds(dist)
            u = float(np.clip(x[cols[0]], 0.0, 1.0))
            value = (math.exp(math.log(low) + u * (math.log(high) - math.log(low))) if log
                     else low + u * (high - low))
            if isinstance(dist, CategoricalDistribution):
                value = min(dist.choices, key=lambda c: abs(float(c) - value))
            elif isinstance(dist, IntDistribution):
                value = int(min(max(round((value - dist.low) / dist.step) * dist.step + dist.low, dist.low), dist.high))
            else:
                value = float(min(max(value, dist.low), dist.high))
                if dist.step:
                    value = float(round((value - dist.low) / dist.step) * dist.step + dist.low)
            out[name] = value
        return out

    def project_many(self, xs: np.ndarray) -> np.ndarray:
        """``project`` of each row."""
        xs = np.clip(xs, 0.0, 1.0)
        if self.onehot.any():
            xs = np.array([self.project(row) for row in xs])
        return xs

    def project(self, x: np.ndarray) -> np.ndarray:
        """A candidate made valid: inside the cube, exactly one category of each parameter on."""
        x = np.clip(x, 0.0, 1.0)
        for name in self.space:
            cols = [j for j, (n, c) in enumerate(self.columns) if n == name and c >= 0]
            if cols:
                hot = cols[int(np.argmax(x[cols]))]
                x[cols] = 0.0
                x[hot] = 1.0
        return x


def _matern52(x1: np.ndarray, x2: np.ndarray, ls: np.ndarray, var: float) -> np.ndarray:
    """The kernel matrix between two sets of points."""
    d = (x1[:, None, :] - x2[None, :, :]) / ls
    r = np.sqrt(np.maximum((d * d).sum(-1), 1e-30))
    s5r = math.sqrt(5.0) * r
    return var * (1.0 + s5r + 5.0 / 3.0 * r * r) * np.exp(-s5r)


class GP:
    """A Gaussian process over the unit cube with fitted hyperparameters."""

    def __init__(self, x: np.ndarray, y: np.ndarray, warm: np.ndarray | None = None) -> None:
        self.x, self.y = x, y
        dim = x.shape[1]
        self._d2 = (x[:, None, :] - x[None, :, :]) ** 2  # squared differences, per dimension: fixed while fitting
        # theta = log length scales (dim), log signal variance, log noise variance
        start = np.concatenate([np.full(dim, math.log(0.5)), [0.0], [math.log(1e-3)]])
        best = None
        for theta0 in ([start] if warm is None or warm.shape != start.shape else [start, warm]):
            res = optimize.minimize(self._neg_log_posterior, theta0, jac=True, method="L-BFGS-B",
                                    bounds=[(math.log(0.01), math.log(20.0))] * dim
                                    + [(math.log(0.05), math.log(20.0)), (math.log(1e-6), math.log(1.0))],
                                    options={"maxiter": 60})
            if best is None or res.fun < best.fun:
                best = res
        self.theta = best.x
        self._prepare()

    def _parts(self, theta: np.ndarray):
        dim = self.x.shape[1]
        ls, var, noise = np.exp(theta[:dim]), math.exp(theta[dim]), math.exp(theta[dim + 1])
        r = np.sqrt(np.maximum(self._d2 @ (1.0 / ls ** 2), 1e-30))
        s5r = math.sqrt(5.0) * r
        e = np.exp(-s5r)
        k = var * (1.0 + s5r + 5.0 / 3.0 * r * r) * e
        return ls, var, noise, k, (s5r, e)

    def _neg_log_posterior(self, theta: np.ndarray) -> tuple[float, np.ndarray]:
        dim, n = self.x.shape[1], self.x.shape[0]
        ls, var, noise, k, (s5r, e) = self._parts(theta)
        kn = k + (noise + _JITTER) * np.eye(n)
        try:
            c = cho_factor(kn, lower=True)
        except np.linalg.LinAlgError:
            return 1e10, np.zeros_like(theta)
        alpha = cho_solve(c, self.y)
        nll = 0.5 * self.y @ alpha + np.log(np.diag(c[0])).sum() + 0.5 * n * math.log(2 * math.pi)
        w = np.outer(alpha, alpha) - cho_solve(c, np.eye(n))  # dL/dK = 0.5 * w
        # dK/dlog(ls_j) = var * 5/3 * (1 + sqrt5 r) exp(-sqrt5 r) * d_j^2 / ls_j^2
        base = var * 5.0 / 3.0 * (1.0 + s5r) * e
        grad = np.empty_like(theta)
        grad[:dim] = -0.5 * np.tensordot(w * base, self._d2, axes=([0, 1], [0, 1])) / ls ** 2
        grad[dim] = -0.5 * np.sum(w * k)
        grad[dim + 1] = -0.5 * np.trace(w) * noise
        # Priors: log-normal on the length scales (around 0.5 of the cube), on the noise (small).
        prior_ls = theta[:dim] - math.log(0.5)
        nll += 0.5 * np.sum(prior_ls ** 2)
        grad[:dim] += prior_ls
        prior_noise = (theta[dim + 1] - math.log(1e-3)) / 3.0
        nll += 0.5 * prior_noise ** 2
        grad[dim + 1] += prior_noise / 3.0
        return float(nll), grad

    def _prepare(self) -> None:
        n = self.x.shape[0]
        dim = self.x.shape[1]
        self.ls, self.var = np.exp(self.theta[:dim]), math.exp(self.theta[dim])
        noise = math.exp(self.theta[dim + 1])
        k = _matern52(self.x, self.x, self.ls, self.var)
        self._chol = cho_factor(k + (noise + _JITTER) * np.eye(n), lower=True)
        self._alpha = cho_solve(self._chol, self.y)

    def predict(self, xs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ks = _matern52(xs, self.x, self.ls, self.var)
        mean = ks @ self._alpha
        v = solve_triangular(self._chol[0], ks.T, lower=True)
        variance = np.maximum(self.var - np.sum(v * v, axis=0), 1e-12)
        return mean, np.sqrt(variance)

    def condition(self, xs: np.ndarray) -> "GP":
        """The same GP (same hyperparameters) with ``xs`` observed at its own mean."""
        if not len(xs):
            return self
        mean, _ = self.predict(xs)
        other = object.__new__(GP)
        other.x, other.y, other.theta = np.vstack([self.x, xs]), np.concatenate([self.y, mean]), self.theta
        other._prepare()
        return other


def _half_rank(v: np.ndarray) -> np.ndarray:
    """Half-rank warping (Vizier's): the values worse than the median keep their order but are replaced
    by Gaussian quantiles of their rank, scaled by the spread of the better half. Bad values then say
    "bad" without their size: a model fitted to them is not stretched by one disaster."""
    med = np.median(v)
    good = v[v >= med]
    spread = math.sqrt(np.mean((good - med) ** 2)) or (math.sqrt(np.mean((v - med) ** 2)) or 1.0)
    bad = np.flatnonzero(v < med)
    if not len(bad):
        return v
    out = v.copy()
    order = bad[np.argsort(v[bad], kind="stable")]  # worst first
    ranks = np.arange(1, len(order) + 1)
    out[order] = med + spread * norm.ppf(0.5 * (ranks - 0.5) / len(order))
    return out


def _warp(v: np.ndarray) -> np.ndarray:
    """One metric (larger is better) -> the GP's target: half-rank, then log warping (the best values
    spread apart, the worst compressed), as Vizier's default output warping."""
    v = _half_rank(v)
    low, high = v.min(), v.max()
    if high <= low:
        return np.zeros_like(v)
    return 0.5 - np.log1p((high - v) / (high - low) * (WARP - 1.0)) / math.log(WARP)


def _targets(values: np.ndarray, directions: Sequence[StudyDirection], rng: np.random.Generator) -> np.ndarray:
    """One number per trial to maximise: signs by goal, each metric warped (``_warp``), several
    metrics scalarised, standardised."""
    signs = np.array([1.0 if d == StudyDirection.MAXIMIZE else -1.0 for d in directions])
    v = np.column_stack([_warp(col) for col in (values * signs).T]) + 0.5  # in [0, 1], 1 the best
    if v.shape[1] == 1:
        y = v[:, 0]
    else:
        w = rng.dirichlet(np.ones(v.shape[1]))
        y = np.min(v / np.maximum(w, 1e-9), axis=1) * w.min()
    return (y - y.mean()) / (np.std(y) or 1.0)


def _fresh(enc: _Encoder, cands: np.ndarray, seen: np.ndarray) -> np.ndarray:
    """The candidates as the trial would get them (integers and discrete values rounded), less those within
    ``MIN_GAP`` (L-inf, unit cube) of a ``seen`` point; all of them if none is that far (a tiny discrete space)."""
    snapped = np.array([enc.encode(enc.decode(c)) for c in cands])
    gap = np.min(np.max(np.abs(snapped[:, None, :] - seen[None, :, :]), axis=2), axis=1)
    keep = snapped[gap >= MIN_GAP]
    return keep if len(keep) else snapped


class GPBanditSampler(BaseSampler):
    """GP-UCB over the parameters every completed trial has; the rest (conditional children
    outside that intersection) are drawn at random."""

    def __init__(self, seed: int | None = None, seed_trials: int = SEED_TRIALS) -> None:
        self._rng = np.random.default_rng(seed)
        self._random = RandomSampler(seed=seed)
        self._space = IntersectionSearchSpace()
        self.seed_trials = seed_trials
        self._warm: np.ndarray | None = None

    def reseed_rng(self) -> None:
        self._rng = np.random.default_rng()
        self._random.reseed_rng()

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return {name: dist for name, dist in self._space.calculate(study).items() if not dist.single()}

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        # One BLAS thread: the matrices are ~100 x 100, where OpenBLAS's threads only wait on each other
        # (16x slower on a busy 2-core machine, measured).
        with threadpool_limits(1):
            return self._sample_relative(study, trial, search_space)

    def _sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                         search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        if not search_space:
            return {}
        trials = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING))
        done = [t for t in trials if t.state == TrialState.COMPLETE and all(p in t.params for p in search_space)]
        pending = [t for t in trials if t.state == TrialState.RUNNING and t.number != trial.number
                   and all(p in t.params for p in search_space)]
        enc = _Encoder(search_space)
        started = len(done) + len(pending)
        if len(done) < self.seed_trials and started < 2 * self.seed_trials:
            return enc.decode(enc.project(self._rng.random(enc.dim)))
        if not done:
            return {}
        x = np.array([enc.encode(t.params) for t in done])
        y = _targets(np.array([t.values for t in done], dtype=float), study.directions, self._rng)
        gp = GP(x, y, self._warm)
        self._warm = gp.theta
        gp = gp.condition(np.array([enc.encode(t.params) for t in pending]).reshape(-1, enc.dim))
        best = self._maximise_ucb(gp, enc, x, y)
        return enc.decode(best)

    def _maximise_ucb(self, gp: GP, enc: _Encoder, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        def ucb(points: np.ndarray) -> np.ndarray:
            mean, std = gp.predict(points)
            return mean + UCB_COEFFICIENT * std

        sobol = qmc.Sobol(enc.dim, scramble=True, seed=self._rng)
        cands = sobol.random_base2(_CANDIDATES_LOG2)
        # Around the best trials too: the acquisition's peaks are often close to them.
        top = x[np.argsort(-y)[:5]]
        near = top[self._rng.integers(len(top), size=_LOCAL)] + self._rng.normal(0, 0.05, (_LOCAL, enc.dim))
        cands = enc.project_many(np.vstack([cands, near]))
        # A trust region, as Vizier's GP bandit has: while the trials are few for the dimension, only points
        # near one of them (L-inf distance in the unit cube) are candidates; the GP's uncertainty far from
        # every trial would otherwise send each suggestion to a corner of the space.
        radius = TRUST_MIN + TRUST_GROWTH * len(x) / (enc.dim + 1)
        if radius < TRUST_OFF:
            gap = np.min(np.max(np.abs(cands[:, None, :] - x[None, :, :]), axis=2), axis=1)
            inside = cands[gap <= radius]
            cands = inside if len(inside) else cands
        cands = _fresh(enc, cands, gp.x)
        scores = ucb(cands)
        best = cands[int(np.argmax(scores))]
        best_score = float(scores.max())
        # A few rounds of shrinking local search around the incumbent.
        for scale in (0.02, 0.005):
            trial = _fresh(enc, enc.project_many(best + self._rng.normal(0, scale, (200, enc.dim))), gp.x)
            s = ucb(trial)
            if s.max() > best_score:
                best, best_score = trial[int(np.argmax(s))], float(s.max())
        return best

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        others = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING))
        if not [t for t in others if t.number != trial.number]:  # the study's first trial: the centre
            enc = _Encoder({param_name: param_distribution})
            return enc.decode(enc.project(np.full(enc.dim, 0.5)))[param_name]
        return self._random.sample_independent(study, trial, param_name, param_distribution)
