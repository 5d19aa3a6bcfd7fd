"""Diagonal GMM from incomplete third-moment tensors (tensorslim.decomp.gmm) vs exact formulas and sklearn EM."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import linear_sum_assignment
from scipy.stats import multivariate_normal

from tensorslim.decomp.gmm import gmm_from_moments, gmm_moments, sample_moments


def _params(d: int, r: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.dirichlet([5.0] * r), rng.uniform(-3, 3, (r, d)), rng.uniform(0.5, 2.0, (r, d))


def _exact_moments(w: np.ndarray, mu: np.ndarray, var: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Population moments of a diagonal GMM, term by term (coordinates are independent inside a component)."""
    d = mu.shape[1]
    eye = np.eye(d)
    m1 = w @ mu
    m2 = np.einsum("s,si,sj->ij", w, mu, mu) + np.diag(w @ var)
    m3 = np.einsum("s,si,sj,sk->ijk", w, mu, mu, mu)
    for s in range(len(w)):
        for j in range(d):
            e = eye[j]
            c = w[s] * var[s, j]
            m3 += c * (np.einsum("i,j,k->ijk", mu[s], e, e) + np.einsum("i,j,k->ijk", e, mu[s], e))
            m3 += c * np.einsum("i,j,k->ijk", e, e, mu[s])
    return m1, m2, m3


def _draw(w: np.ndarray, mu: np.ndarray, var: np.ndarray, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    z = rng.choice(len(w), n, p=w)
    return mu[z] + rng.standard_normal((n, mu.shape[1])) * np.sqrt(var[z])


def _errors(est_w, est_mu, est_var, w, mu, var) -> tuple[float, float, float]:
    """Relative errors of (weights, means, variances) after optimal matching of components by their means."""
    cost = ((est_mu[:, None, :] - mu[None]) ** 2).sum(-1)
    rows, cols = linear_sum_assignment(cost)
    perm = rows[np.argsort(cols)]

    def rel(a: np.ndarray, b: np.ndarray) -> float:
        return float(np.linalg.norm(a - b) / np.linalg.norm(b))

    return rel(est_w[perm], w), rel(est_mu[perm], mu), rel(est_var[perm], var)


@pytest.mark.parametrize(("d", "r", "seed"), [(10, 3, 0), (12, 5, 1), (6, 2, 2), (8, 1, 3)])
@pytest.mark.parametrize("refine", [False, True])
def test_exact_moments_recover_parameters(d: int, r: int, seed: int, refine: bool) -> None:
    w, mu, var = _params(d, r, seed)
    res = gmm_from_moments(*_exact_moments(w, mu, var), r, refine=refine)
    assert max(_errors(res.weights_, res.means_, res.covariances_, w, mu, var)) < 1e-10
    assert res.moment_residual < 1e-10


def test_coordinate_permutation_equivariance() -> None:
    w, mu, var = _params(10, 3, 4)
    perm = np.random.default_rng(0).permutation(10)
    res = gmm_from_moments(*_exact_moments(w, mu[:, perm], var[:, perm]), 3, random_state=7)
    assert max(_errors(res.weights_, res.means_, res.covariances_, w, mu[:, perm], var[:, perm])) < 1e-10


def test_sample_moments_match_direct_sums() -> None:
    y = np.random.default_rng(0).standard_normal((257, 5))
    m1, m2, m3 = sample_moments(y, chunk_size=50)  # several chunks, last one partial
    np.testing.assert_allclose(m1, y.mean(0), rtol=1e-12)
    np.testing.assert_allclose(m2, np.einsum("ni,nj->ij", y, y) / 257, rtol=1e-12)
    np.testing.assert_allclose(m3, np.einsum("ni,nj,nk->ijk", y, y, y) / 257, rtol=1e-10, atol=1e-12)


@pytest.fixture(scope="module")
def samples_1e5() -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    truth = _params(10, 3, 0)
    return _draw(*truth, 100_000, seed=11), truth


def test_samples_accuracy_and_agreement_with_em(samples_1e5) -> None:
    from sklearn.mixture import GaussianMixture

    y, truth = samples_1e5
    res = gmm_moments(y, 3)
    ours = _errors(res.weights_, res.means_, res.covariances_, *truth)
    assert ours[0] < 0.02 and ours[1] < 0.02 and ours[2] < 0.05
    em = GaussianMixture(3, covariance_type="diag", random_state=0).fit(y)
    theirs = _errors(em.weights_, em.means_, em.covariances_, *truth)
    # Moments are less efficient than maximum likelihood, but not by an order of magnitude here.
    assert ours[1] < 5 * theirs[1] + 5e-3
    raw = gmm_moments(y, 3, refine=False)  # without Levenberg-Marquardt: still close, but less accurate
    assert _errors(raw.weights_, raw.means_, raw.covariances_, *truth)[1] < 0.05


def test_sklearn_init_starts_em_near_convergence(samples_1e5) -> None:
    y, truth = samples_1e5
    y = y[:10_000]
    res = gmm_moments(y, 3)
    em = res.sklearn_init(max_iter=200, tol=1e-3).fit(y)
    assert em.converged_ and em.n_iter_ <= 5
    assert _errors(em.weights_, em.means_, em.covariances_, *truth)[1] < 0.03


def test_to_sklearn_scores_like_the_mixture_density() -> None:
    w, mu, var = _params(8, 2, 5)
    res = gmm_from_moments(*_exact_moments(w, mu, var), 2)
    gm = res.to_sklearn()
    x = _draw(w, mu, var, 50, seed=3)
    dens = sum(w[s] * multivariate_normal(mu[s], np.diag(var[s])).pdf(x) for s in range(2))
    np.testing.assert_allclose(gm.score_samples(x), np.log(dens), rtol=1e-9)
    assert gm.predict(x).shape == (50,)


# ------------------------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize(("d", "r"), [(7, 3), (9, 4), (3, 1)])
def test_too_many_components_for_dimension(d: int, r: int) -> None:
    y = np.random.default_rng(0).standard_normal((100, d))
    with pytest.raises(ValueError, match=rf"n_components={r} needs dimension d >= 2\*r\+2 = {2 * r + 2}.*d={d}"):
        gmm_moments(y, r)


@pytest.mark.parametrize(("r", "error"), [(0, ValueError), (-2, ValueError), (2.5, TypeError), (True, TypeError)])
def test_bad_n_components(r: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="n_components"):
        gmm_moments(np.zeros((20, 10)), r)


@pytest.mark.parametrize(
    ("samples", "match"), [(np.zeros(10), r"shape \(N, d\)"), (np.full((5, 10), np.nan), "finite")]
)
def test_bad_samples(samples: np.ndarray, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        gmm_moments(samples, 2)


def test_non_symmetric_moments_rejected() -> None:
    m1, m2, m3 = _exact_moments(*_params(10, 3, 0))
    m3 = m3.copy()
    m3[0, 1, 2] += 1.0
    with pytest.raises(ValueError, match="symmetric"):
        gmm_from_moments(m1, m2, m3, 3)
    with pytest.raises(ValueError, match="shapes"):
        gmm_from_moments(m1, m2, m3[:-1], 3)
