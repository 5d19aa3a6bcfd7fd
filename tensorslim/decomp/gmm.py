"""Diagonal Gaussian mixtures from moments via incomplete symmetric tensor decomposition.

References:
    (a) B. Guo, J. Nie, Z. Yang, "Learning Diagonal Gaussian Mixture Models and Incomplete Tensor
        Decompositions", Vietnam J. Math. 50 (2022), arXiv:2102.04500.
    (b) B. Guo, J. Nie, Z. Yang, "Diagonal Gaussian Mixture Models and Higher Order Tensor Decompositions",
        arXiv:2401.01337 (2024) -- higher orders, not implemented here.

Model: ``y ~ sum_s w_s N(mu_s, diag(sigma2_s))`` in ``R^d`` with ``r`` components. Inside one component the
coordinates are independent, so the third moment ``M3 = E[y (x) y (x) y]`` equals
``F = sum_s w_s mu_s^(x)3`` on every entry with pairwise distinct indices; entries with a repeated index also
contain the unknown variances. ``F`` is thus a rank-r symmetric tensor known only off the "diagonals" -- an
incomplete symmetric tensor (paper (a), abstract and Introduction). We decompose it with generating matrices
(linear least squares, then simultaneous diagonalization), recover weights and means, optionally refine them
by Levenberg-Marquardt, and finally get the variances by linear least squares.

The index sets below (basis set ``I1`` of size r, one anchor coordinate, complement sets ``C_j``) are our
reconstruction of paper (a)'s generating-polynomial construction; they need ``d >= 2 r + 2``.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["GMMMomentResult", "gmm_from_moments", "gmm_moments", "sample_moments"]


@dataclass
class GMMMomentResult:
    """Estimated diagonal Gaussian mixture, in scikit-learn's ``covariance_type="diag"`` layout.

    Attributes:
        weights_: Mixing weights, shape ``(r,)``.
        means_: Component means, shape ``(r, d)``.
        covariances_: Diagonal variances, shape ``(r, d)``.
        moment_residual: Relative residual of the fitted ``(M1, F_Omega)`` equations.
        timings: Seconds spent in ``"moments"``, ``"decomposition"``, ``"refine"`` and ``"variances"``.
    """

    weights_: np.ndarray
    means_: np.ndarray
    covariances_: np.ndarray
    moment_residual: float
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def n_components(self) -> int:
        """Number of components ``r``."""
        return int(self.weights_.shape[0])

    def sklearn_init(self, **kwargs: object) -> object:
        """An unfitted ``GaussianMixture(covariance_type="diag")`` that starts EM from this estimate.

        Args:
            **kwargs: Passed to ``sklearn.mixture.GaussianMixture`` (e.g. ``max_iter``, ``tol``).
        """
        from sklearn.mixture import GaussianMixture  # lazy: no import-time work

        return GaussianMixture(
            n_components=self.n_components,
            covariance_type="diag",
            weights_init=self.weights_ / self.weights_.sum(),
            means_init=self.means_,
            precisions_init=1.0 / self.covariances_,
            **kwargs,
        )

    def to_sklearn(self) -> object:
        """A ``GaussianMixture`` carrying these parameters as if fitted (no EM run).

        ``predict``, ``predict_proba``, ``score_samples`` and ``sample`` then use the moment estimate directly.
        """
        gm = self.sklearn_init()
        gm.weights_ = self.weights_ / self.weights_.sum()
        gm.means_ = self.means_.copy()
        gm.covariances_ = self.covariances_.copy()
        gm.precisions_ = 1.0 / self.covariances_
        gm.precisions_cholesky_ = 1.0 / np.sqrt(self.covariances_)  # sklearn's "diag" convention
        gm.converged_ = True
        gm.n_iter_ = 0
        gm.lower_bound_ = float("nan")
        gm.n_features_in_ = self.means_.shape[1]
        return gm


def gmm_moments(samples: np.ndarray, n_components: int, **solver: Any) -> GMMMomentResult:
    """Fit a diagonal Gaussian mixture to samples by the method of moments (Guo-Nie-Yang, arXiv:2102.04500).

    Args:
        samples: Data, shape ``(N, d)``.
        n_components: Number of components ``r``; needs ``d >= 2 r + 2``.
        solver: ``refine``, ``n_trials``, ``var_floor``, ``random_state`` as :func:`gmm_from_moments` takes them.

    Returns:
        A :class:`GMMMomentResult`; ``.to_sklearn()`` and ``.sklearn_init()`` hand it to scikit-learn.

    Raises:
        TypeError: If ``n_components`` is not an integer.
        ValueError: For a non-2-D or non-finite ``samples``, ``n_components < 1`` or ``d < 2 r + 2``.
    """
    y = _check_samples(samples)
    _check_components(n_components, y.shape[1])
    start = time.perf_counter()
    m1, m2, m3 = sample_moments(y)
    seconds = time.perf_counter() - start
    result = gmm_from_moments(m1, m2, m3, n_components, **solver)
    result.timings["moments"] = seconds
    return result


def sample_moments(samples: np.ndarray, *, chunk_size: int | None = None) -> tuple[np.ndarray, ...]:
    """Empirical first, second and third moments ``(M1 (d,), M2 (d, d), M3 (d, d, d))``.

    ``M3`` costs ``O(N d^3)``; it is accumulated in chunks as one GEMM per chunk.
    """
    y = _check_samples(samples)
    n, d = y.shape
    step = chunk_size or max(1, 2**22 // (d * d))
    m3 = np.zeros((d * d, d))
    for lo in range(0, n, step):
        yc = y[lo : lo + step]  # (n_c, d)
        outer = (yc[:, :, None] * yc[:, None, :]).reshape(len(yc), d * d)  # (n_c, d^2)
        m3 += outer.T @ yc
    return y.mean(axis=0), (y.T @ y) / n, m3.reshape(d, d, d) / n


def gmm_from_moments(
    m1: np.ndarray,
    m2: np.ndarray,
    m3: np.ndarray,
    n_components: int,
    *,
    refine: bool = True,
    n_trials: int = 5,
    var_floor: float = 1e-6,
    random_state: int | None = 0,
) -> GMMMomentResult:
    """Recover a diagonal Gaussian mixture from its moments ``M1 (d,)``, ``M2 (d, d)``, ``M3 (d, d, d)``.

    Steps (paper (a)'s generating-polynomial method as we reconstruct it; its exact index sets were not available):
        1. Generating matrices ``M_j = F[I1, C_j, j] F[I1, C_j, k0]^+`` using only distinct-index entries.
        2. Their common eigenvectors give ``rho_sj = mu_sj / mu_sk0``; the ``I1`` coordinates by least squares.
        3. ``lambda_s = w_s mu_sk0^3`` from ``F_Omega``, ``beta_s = w_s mu_sk0`` from ``M1``: ``w``, ``mu``.
        4. Optional Levenberg-Marquardt on ``[F(w, mu)_Omega - F_Omega; sum w mu - M1; sum w - 1]``.
        5. Variances from ``M3_jjk`` (all k) and ``M2_jj`` by nonnegative least squares.

    Args:
        m1, m2, m3: the moments; ``n_components``: the number of components ``r``.
        refine: Run the Levenberg-Marquardt refinement of weights and means on ``(M1, F_Omega)`` (step 4).
        n_trials: Random choices of index sets / diagonalizing combination; the best residual is kept.
        var_floor: Lower bound for the recovered variances.
        random_state: Seed for the trials.

    Raises:
        ValueError: For inconsistent shapes, a non-symmetric ``M2``/``M3`` or ``d < 2 r + 2``.
    """
    m1, m2, m3 = _check_moments(m1, m2, m3)
    d = m1.shape[0]
    _check_components(n_components, d)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    omega_idx = np.array(list(itertools.combinations(range(d), 3)))  # (|Omega|, 3), i < j < k
    f_omega = m3[tuple(omega_idx.T)]  # (|Omega|,)
    rng = np.random.default_rng(random_state)
    best = None
    for _ in range(max(1, n_trials)):
        order = rng.permutation(d)
        w, mu = _decompose_incomplete(m3, m1, n_components, order, rng)
        res = _moment_residual(w, mu, f_omega, omega_idx, m1)
        if np.isfinite(res) and (best is None or res < best[0]):
            best = (res, w, mu)
    if best is None:
        raise ValueError("the moment equations gave no finite solution; the moments may be degenerate")
    _, w, mu = best
    timings["decomposition"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    if refine:
        w, mu = _refine(w, mu, f_omega, omega_idx, m1)
    timings["refine"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    var = _variances(w, mu, m2, m3, var_floor)
    timings["variances"] = time.perf_counter() - t0
    residual = _moment_residual(w, mu, f_omega, omega_idx, m1)
    return GMMMomentResult(w, mu, var, residual, timings)


# ------------------------------------------------------------------------------------------------ checks


def _check_samples(samples: object) -> np.ndarray:
    y = np.asarray(samples, dtype=np.float64)
    if y.ndim != 2 or y.shape[0] < 1:
        raise ValueError(f"samples must have shape (N, d) with N >= 1, got shape {y.shape}")
    if not np.isfinite(y).all():
        raise ValueError("samples must be finite")
    return y


def _check_components(n_components: object, d: int) -> None:
    if isinstance(n_components, bool) or not isinstance(n_components, (int, np.integer)):
        raise TypeError(f"n_components={n_components!r} must be an integer, got {type(n_components).__name__}")
    if n_components < 1:
        raise ValueError(f"n_components={n_components!r} must be a positive integer")
    if d < 2 * n_components + 2:
        raise ValueError(
            f"n_components={n_components} needs dimension d >= 2*r+2 = {2 * n_components + 2} for "
            f"third-order moments, got d={d} (at most {max(0, (d - 2) // 2)} components)"
        )


def _check_moments(m1: object, m2: object, m3: object) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    m1, m2, m3 = (np.asarray(m, dtype=np.float64) for m in (m1, m2, m3))
    d = m1.shape[0] if m1.ndim == 1 else -1
    if m1.ndim != 1 or m2.shape != (d, d) or m3.shape != (d, d, d):
        raise ValueError(f"moments must have shapes (d,), (d, d), (d, d, d); got {m1.shape}, {m2.shape}, {m3.shape}")
    if not (np.isfinite(m1).all() and np.isfinite(m2).all() and np.isfinite(m3).all()):
        raise ValueError("moments must be finite")
    scale = max(np.abs(m3).max(), np.abs(m2).max(), 1e-300)
    asym2 = np.abs(m2 - m2.T).max()
    asym3 = max(np.abs(m3 - m3.transpose(p)).max() for p in itertools.permutations(range(3)))
    if max(asym2, asym3) > 1e-8 * scale:
        raise ValueError(f"moment tensors must be symmetric; max asymmetry {max(asym2, asym3):.3g} (scale {scale:.3g})")
    return m1, m2, m3


# ------------------------------------------------------------------------------------------------ algorithm


def _decompose_incomplete(
    m3: np.ndarray, m1: np.ndarray, r: int, order: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Weights ``(r,)`` and means ``(r, d)`` from the distinct-index entries of ``m3`` (and ``m1``).

    ``order`` permutes the coordinates: ``I1 = order[:r]``, anchor ``k0 = order[r]``, ``J = order[r+1:]``.
    """
    d = m1.shape[0]
    basis, k0, rest = order[:r], order[r], order[r + 1 :]
    rho = np.zeros((r, d))  # rho[s, j] = mu_sj / mu_sk0
    gen_mats = []
    for j in rest:
        cols = rest[rest != j]  # C_j = J \ {j}: disjoint from I1, j and k0, so every entry used is in Omega
        a_j = m3[np.ix_(basis, cols, [j])][:, :, 0]  # (r, |C_j|) = U1 diag(w mu_j) W^T
        a_0 = m3[np.ix_(basis, cols, [k0])][:, :, 0]  # (r, |C_j|) = U1 diag(w mu_k0) W^T
        gen_mats.append(a_j @ np.linalg.pinv(a_0))  # (r, r) = U1 diag(mu_j / mu_k0) U1^-1
    # Common eigenvectors from a random combination (generic: distinct eigenvalues).
    xi = rng.standard_normal(len(gen_mats))
    _, vecs = np.linalg.eig(sum(x * g for x, g in zip(xi, gen_mats, strict=True)))
    vinv = np.linalg.inv(vecs)
    for j, g in zip(rest, gen_mats, strict=True):
        rho[:, j] = np.real(np.diag(vinv @ g @ vecs))
    rho[:, k0] = 1.0
    # Coordinates in I1 (and k0 as the normaliser): F_ijk = sum_s t_s^(i) rho_sj rho_sk over pairs j < k in J.
    pairs = np.array(list(itertools.combinations(rest, 2)))  # (P, 2)
    design = rho[:, pairs[:, 0]].T * rho[:, pairs[:, 1]].T  # (P, r)
    t = {i: np.linalg.lstsq(design, m3[i, pairs[:, 0], pairs[:, 1]], rcond=None)[0] for i in [*basis, k0]}
    for i in basis:
        rho[:, i] = t[i] / t[k0]
    # Scales: lambda_s = w_s mu_sk0^3 (from F_Omega), beta_s = w_s mu_sk0 (from M1).
    omega_idx = np.array(list(itertools.combinations(range(d), 3)))
    design3 = rho[:, omega_idx[:, 0]] * rho[:, omega_idx[:, 1]] * rho[:, omega_idx[:, 2]]  # (r, |Omega|)
    lam = np.linalg.lstsq(design3.T, m3[tuple(omega_idx.T)], rcond=None)[0]
    beta = np.linalg.lstsq(rho.T, m1, rcond=None)[0]
    mu_k0 = np.sign(beta) * np.sqrt(np.abs(lam / beta))  # lambda / beta = mu_k0^2; sign(mu_k0) = sign(beta)
    return beta / mu_k0, mu_k0[:, None] * rho


def _model_omega(w: np.ndarray, mu: np.ndarray, omega_idx: np.ndarray) -> np.ndarray:
    """``F(w, mu)`` on the index triples ``omega_idx`` -> ``(|Omega|,)``."""
    return (w[:, None] * mu[:, omega_idx[:, 0]] * mu[:, omega_idx[:, 1]] * mu[:, omega_idx[:, 2]]).sum(0)


def _moment_residual(
    w: np.ndarray, mu: np.ndarray, f_omega: np.ndarray, omega_idx: np.ndarray, m1: np.ndarray
) -> float:
    num = np.linalg.norm(_model_omega(w, mu, omega_idx) - f_omega) ** 2 + np.linalg.norm(w @ mu - m1) ** 2
    return float(np.sqrt(num / (np.linalg.norm(f_omega) ** 2 + np.linalg.norm(m1) ** 2)))


def _refine(
    w: np.ndarray, mu: np.ndarray, f_omega: np.ndarray, omega_idx: np.ndarray, m1: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Levenberg-Marquardt on the moment equations (analytic Jacobian), as in paper (a)'s approximation step."""
    from scipy.optimize import least_squares  # lazy: scipy is an optional extra

    r, d = mu.shape
    i, j, k = omega_idx.T
    n_om = len(omega_idx)

    def unpack(theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return theta[:r], theta[r:].reshape(r, d)

    def residuals(theta: np.ndarray) -> np.ndarray:
        ww, mm = unpack(theta)
        return np.concatenate([_model_omega(ww, mm, omega_idx) - f_omega, ww @ mm - m1, [ww.sum() - 1.0]])

    def jacobian(theta: np.ndarray) -> np.ndarray:
        ww, mm = unpack(theta)
        jac = np.zeros((n_om + d + 1, r + r * d))
        rows = np.arange(n_om)
        for s in range(r):
            a, b, c = mm[s, i], mm[s, j], mm[s, k]
            jac[:n_om, s] = a * b * c
            base = r + s * d
            # d/dmu_sl of w_s mu_si mu_sj mu_sk: indices are distinct, so each triple hits three columns.
            jac[rows, base + i] += ww[s] * b * c
            jac[rows, base + j] += ww[s] * a * c
            jac[rows, base + k] += ww[s] * a * b
            jac[n_om : n_om + d, s] = mm[s]
            jac[n_om + np.arange(d), base + np.arange(d)] = ww[s]
        jac[-1, :r] = 1.0
        return jac

    sol = least_squares(residuals, np.concatenate([w, mu.ravel()]), jac=jacobian, method="lm")
    return unpack(sol.x)


def _variances(w: np.ndarray, mu: np.ndarray, m2: np.ndarray, m3: np.ndarray, floor: float) -> np.ndarray:
    """Diagonal variances ``(r, d)`` by NNLS per coordinate j, using

    ``M3_jjk - sum_s w_s mu_sj^2 mu_sk = sum_s w_s mu_sk sigma2_sj`` (k != j),
    ``M3_jjj - sum_s w_s mu_sj^3 = sum_s 3 w_s mu_sj sigma2_sj`` and
    ``M2_jj - sum_s w_s mu_sj^2 = sum_s w_s sigma2_sj``.
    """
    from scipy.optimize import nnls  # lazy

    r, d = mu.shape
    var = np.empty((r, d))
    for j in range(d):
        coef3 = w[:, None] * mu  # (r, d): column k is w_s mu_sk
        coef3[:, j] *= 3.0
        rhs3 = m3[j, j, :] - (w * mu[:, j] ** 2) @ mu  # (d,)
        a = np.vstack([coef3.T, w[None, :]])  # (d + 1, r)
        rhs = np.concatenate([rhs3, [m2[j, j] - w @ mu[:, j] ** 2]])
        var[:, j] = nnls(a, rhs)[0]
    return np.maximum(var, floor)
