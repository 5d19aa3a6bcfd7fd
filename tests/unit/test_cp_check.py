"""Completely-positive tensor detection (tensorslim.decomp.cp_check) on constructed CP and non-CP tensors."""

from __future__ import annotations

import itertools
import sys

import numpy as np
import pytest
from scipy.optimize import linear_sum_assignment

from tensorslim.decomp.cp_check import cp_tensor_check, moment_relaxation_sizes

pytest.importorskip("cvxpy")


def _cp_tensor(n: int, m: int, r: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``A = sum_j lam_j u_j^(x)m`` with random nonnegative ``u_j`` (columns of U)."""
    rng = np.random.default_rng(seed)
    u, lam = rng.uniform(0, 1, (n, r)), rng.uniform(0.5, 1.5, r)
    a = np.zeros((n,) * m)
    for j in range(r):
        outer = u[:, j]
        for _ in range(m - 1):
            outer = np.multiply.outer(outer, u[:, j])
        a += lam[j] * outer
    return a, lam, u


def _pattern_tensor() -> np.ndarray:
    """1 on the permutations of (0, 0, 1, 1), else 0: nonnegative but its 9x9 flattening is not PSD."""
    b = np.zeros((3,) * 4)
    for p in set(itertools.permutations((0, 0, 1, 1))):
        b[p] = 1.0
    return b


def _cp_tensor_from(weights: np.ndarray, u: np.ndarray, m: int) -> np.ndarray:
    a = np.zeros((u.shape[0],) * m)
    for j in range(u.shape[1]):
        outer = u[:, j]
        for _ in range(m - 1):
            outer = np.multiply.outer(outer, u[:, j])
        a += weights[j] * outer
    return a


@pytest.mark.parametrize("dehomogenize", [True, False])
def test_random_cp_tensor_detected_and_decomposed(dehomogenize: bool) -> None:
    a, lam, u = _cp_tensor(3, 4, 3, seed=0)
    res = cp_tensor_check(a, dehomogenize=dehomogenize)
    assert res.is_cp is True and res.status == "cp"
    assert res.error < 1e-6 and res.extraction_error < 1e-5
    assert (res.factors >= 0).all() and (res.weights > 0).all()
    # Atoms are the simplex-normalised truth, weights carry the scale: lam_j (sum u_j)^m.
    truth_u, truth_w = u / u.sum(0), lam * u.sum(0) ** 4
    cost = np.abs(res.factors[:, :, None] - truth_u[:, None, :]).sum(0)
    rows, cols = linear_sum_assignment(cost)
    np.testing.assert_allclose(res.factors[:, rows], truth_u[:, cols], atol=1e-4)
    np.testing.assert_allclose(res.weights[rows], truth_w[cols], rtol=1e-4)
    recon = _cp_tensor_from(res.weights, res.factors, 4)
    assert np.linalg.norm(recon - a) / np.linalg.norm(a) == pytest.approx(res.error, rel=1e-3, abs=1e-12)
    assert res.log[-1].moment_vector_size == (15 if dehomogenize else 35)


def test_odd_order_and_rank_above_dimension() -> None:
    a, _, _ = _cp_tensor(3, 3, 2, seed=1)
    assert cp_tensor_check(a).error < 1e-6
    # Rank 4 > n = 3: needs relaxation order 3 (M_1 has rank at most 3).
    b, _, _ = _cp_tensor(3, 4, 4, seed=1)
    res = cp_tensor_check(b)
    assert res.is_cp and res.order == 3 and res.factors.shape == (3, 4) and res.error < 1e-6
    assert [entry.order for entry in res.log] == [2, 3]


def test_pattern_tensor_rejected_as_not_cp() -> None:
    b = _pattern_tensor()
    # Independent reason: an even-order CP tensor has a PSD square flattening; this one does not.
    assert np.linalg.eigvalsh(b.reshape(9, 9)).min() < -0.5
    for dehomogenize in (True, False):
        res = cp_tensor_check(b, dehomogenize=dehomogenize)
        assert res.is_cp is False and res.status == "not_cp" and res.factors is None
        assert "infeasible" in res.reason


def test_doubly_nonnegative_cycle_matrix_rejected() -> None:
    # Doubly nonnegative (PSD and entrywise >= 0) with a 5-cycle graph. A DNN matrix with a triangle-free graph
    # is CP iff its comparison matrix (off-diagonal signs flipped) is PSD (Drew, Johnson & Loewy, 1994);
    # here that matrix has determinant -1, so h is not CP although the order-1 (DNN) relaxation is feasible.
    h = np.array([[1, 1, 0, 0, 1], [1, 2, 1, 0, 0], [0, 1, 2, 1, 0], [0, 0, 1, 2, 1], [1, 0, 0, 1, 6]], float)
    comparison = np.diag(np.diag(h)) * 2 - h
    assert np.linalg.eigvalsh(h).min() > 0 and np.linalg.det(comparison) == pytest.approx(-1.0)
    assert np.linalg.eigvalsh(comparison).min() < 0
    res = cp_tensor_check(h)
    assert res.is_cp is False and res.order == 2


def test_negative_entry_is_not_cp() -> None:
    a, _, _ = _cp_tensor(3, 4, 2, seed=2)
    a[0, 0, 0, 0] = -0.1
    res = cp_tensor_check(a)
    assert res.is_cp is False and "< 0" in res.reason


def test_scale_invariance() -> None:
    a, _, _ = _cp_tensor(3, 4, 2, seed=3)
    small, big = cp_tensor_check(a), cp_tensor_check(1e3 * a)
    np.testing.assert_allclose(np.sort(big.weights), 1e3 * np.sort(small.weights), rtol=1e-6)


@pytest.mark.parametrize(("n", "k", "dehom", "full"), [(3, 2, (15, 6), (35, 10)), (4, 3, (84, 20), (210, 35))])
def test_relaxation_sizes_match_paper_table_1(n: int, k: int, dehom: tuple, full: tuple) -> None:
    assert moment_relaxation_sizes(n, k) == dehom
    assert moment_relaxation_sizes(n, k, dehomogenize=False) == full


def test_relaxation_sizes_5_4() -> None:
    assert moment_relaxation_sizes(5, 4) == (495, 70)
    assert moment_relaxation_sizes(5, 4, dehomogenize=False) == (1287, 126)


# ------------------------------------------------------------------------------------------------ bad input


def test_non_symmetric_rejected() -> None:
    a, _, _ = _cp_tensor(3, 4, 2, seed=0)
    a[0, 1, 2, 2] += 0.5
    with pytest.raises(ValueError, match="symmetric"):
        cp_tensor_check(a)


@pytest.mark.parametrize(
    ("tensor", "error", "match"),
    [
        (np.ones((3, 4)), ValueError, r"shape \(n,\)\*m"),
        (np.ones(3), ValueError, r"m >= 2"),
        (np.ones((1, 1)), ValueError, r"n >= 2"),
        (np.full((2, 2), np.nan), ValueError, "finite"),
        ("tensor", TypeError, "numpy array"),
    ],
)
def test_bad_tensor(tensor: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        cp_tensor_check(tensor)


def test_bad_max_order_and_solver() -> None:
    a, _, _ = _cp_tensor(3, 4, 2, seed=0)
    with pytest.raises(ValueError, match="max_order=1"):
        cp_tensor_check(a, max_order=1)
    with pytest.raises(ValueError, match="solver='NOPE'"):
        cp_tensor_check(a, solver="NOPE")


def test_missing_cvxpy_gives_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cvxpy", None)  # makes `import cvxpy` raise ImportError
    with pytest.raises(ImportError, match="pip install cvxpy"):
        cp_tensor_check(np.eye(3))
