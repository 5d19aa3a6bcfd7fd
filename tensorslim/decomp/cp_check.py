"""Detection of completely positive (CP) symmetric tensors by Moment-SOS relaxations with dehomogenization.

Reference: J. Nie, X. Tang, Z. Yang, S. Zhong, "Dehomogenization for Completely Positive Tensors", Numerical
Algebra, Control and Optimization (2022), doi:10.3934/naco.2022037, arXiv:2206.12553.

A symmetric tensor ``A`` of order ``m`` on ``R^n`` is completely positive if ``A = sum_i lambda_i u_i^(x)m``
with ``u_i >= 0`` (paper, Introduction). Scaling every ``u_i`` onto the simplex and writing
``u = (x, 1 - e^T x)`` with ``x in R^(n-1)`` (the paper's "dehomogenization") turns the question into a
truncated moment problem on the compact set ``Delta = {x >= 0, 1 - e^T x >= 0}`` in ``n - 1`` variables:
``A`` is CP iff the linear functional with ``A_(i1..im) = L(u_i1(x) ... u_im(x))`` has a representing measure
on ``Delta``. Relaxation of order ``k`` (Moment-SOS hierarchy in Lasserre's form):

    min  <G, M_k(y)>   s.t.  L_y(u_i1 ... u_im) = A_(i1..im),  M_k(y) >= 0,
                             L_(x_i)^(k)(y) >= 0 (i < n),  L_(1 - e^T x)^(k)(y) >= 0,

with a generic positive definite ``G``. Infeasible => ``A`` is not CP. A flat optimizer
(``rank M_t = rank M_(t-1)``) gives the atoms of a CP decomposition; otherwise ``k`` grows.

The atom extraction (a Hankel/multiplication-matrix pencil), the generic objective and the homogeneous
comparison formulation on the simplex are our reconstruction; see ``docs/tensor_methods.md``.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field

import numpy as np

__all__ = ["CPCheckResult", "cp_tensor_check", "moment_relaxation_sizes"]

_INSTALL_HINT = (
    "cp_tensor_check needs cvxpy (an optional extra): pip install cvxpy  (or: pip install tensorslim[tensor])"
)


@dataclass
class OrderLog:
    """One relaxation order tried.

    Attributes:
        order: Relaxation order ``k``.
        status: Solver status string from cvxpy.
        moment_vector_size: Length of ``y`` (all monomials of degree <= 2k).
        moment_matrix_size: Side of ``M_k(y)``.
        ranks: ``rank M_t(y)`` for ``t = 0..k`` (empty when infeasible).
        seconds: Wall-clock time of building and solving.
        solver_seconds: Time reported by the solver itself.
        margin: Optimal ``t`` of the phase-1 problem, when it was needed (``> 0`` means infeasible).
    """

    order: int
    status: str
    moment_vector_size: int
    moment_matrix_size: int
    ranks: list[int]
    seconds: float
    solver_seconds: float
    margin: float | None = None


@dataclass
class CPCheckResult:
    """Outcome of :func:`cp_tensor_check`.

    Attributes:
        is_cp: True (decomposition found), False (certified not CP) or None (undetermined up to ``max_order``).
        status: ``"cp"``, ``"not_cp"`` or ``"undetermined"``.
        reason: One line saying how the answer was reached.
        weights: ``lambda``, shape ``(r,)``, when CP.
        factors: Nonnegative atoms ``u_i`` as columns, shape ``(n, r)`` with ``sum(u_i) = 1``, when CP.
        error: ``||A - sum_i lambda_i u_i^(x)m||_F / ||A||_F`` of the returned decomposition, when CP.
        extraction_error: The same error straight from the relaxation, before the local polish.
        order: Relaxation order of the final answer.
        tensor_order: Order ``m`` of the input.
        dehomogenized: Whether the dehomogenized (``n - 1`` variables) relaxation was used.
        log: One :class:`OrderLog` per order tried.
    """

    is_cp: bool | None
    status: str
    reason: str
    weights: np.ndarray | None = None
    factors: np.ndarray | None = None
    error: float | None = None
    extraction_error: float | None = None
    order: int | None = None
    tensor_order: int = 0
    dehomogenized: bool = True
    log: list[OrderLog] = field(default_factory=list)

    @property
    def cp_tensor(self) -> tuple[np.ndarray, list[np.ndarray]] | None:
        """``(weights, [U] * m)`` in tensorly's CP convention, or None when not CP."""
        if self.factors is None or self.weights is None:
            return None
        return self.weights, [self.factors] * self.tensor_order

    @property
    def solve_seconds(self) -> float:
        """Total wall-clock time of all relaxations."""
        return sum(entry.seconds for entry in self.log)


def cp_tensor_check(
    tensor: np.ndarray,
    *,
    max_order: int | None = None,
    dehomogenize: bool = True,
    solver: str | None = None,
    rank_tol: float = 1e-6,
    infeasibility_tol: float = 1e-6,
    polish: bool = True,
    symmetry_tol: float = 1e-8,
    random_state: int | None = 0,
) -> CPCheckResult:
    """Decide whether a symmetric tensor is completely positive (Nie-Tang-Yang-Zhong, arXiv:2206.12553).

    Args:
        tensor: Symmetric tensor of order ``m >= 2`` on ``R^n`` (``n >= 2``), shape ``(n,) * m``.
        max_order: Largest relaxation order ``k`` to try; default ``ceil(m / 2) + 2``.
        dehomogenize: Use the dehomogenized relaxation (``n - 1`` variables); False gives the
            homogeneous one on the simplex in ``n`` variables, for comparison (paper Tables 1-2).
        solver: cvxpy solver name; default Clarabel, else SCS (whichever is installed).
        rank_tol: Singular values below ``rank_tol * largest`` count as zero in the flatness test.
        infeasibility_tol: When the solver stalls, the phase-1 problem ``min t`` with ``t I`` added to every
            PSD block is solved; ``t* > infeasibility_tol`` (tensor scaled to unit max entry) means "not CP".
        polish: Refine the extracted atoms and weights by bound-constrained nonlinear least squares
            (``u >= 0``), which removes the solver's ~1e-7 inaccuracy (our addition; the paper reports the
            extraction accuracy). ``extraction_error`` keeps the unpolished error.
        symmetry_tol: Allowed relative asymmetry of the input.
        random_state: Seed of the generic objective and of the extraction.

    Returns:
        A :class:`CPCheckResult`.

    Raises:
        ImportError: If cvxpy is not installed.
        TypeError: If ``tensor`` is not array-like.
        ValueError: For a non-square shape, order < 2, n < 2, non-finite or non-symmetric input.
    """
    a = _check_tensor(tensor, symmetry_tol)
    m, n = a.ndim, a.shape[0]
    k_min = math.ceil(m / 2)
    k_max = k_min + 2 if max_order is None else max_order
    if isinstance(k_max, bool) or not isinstance(k_max, (int, np.integer)) or k_max < k_min:
        raise ValueError(f"max_order={max_order!r} must be an integer >= ceil(m/2) = {k_min}")
    cp = _import_cvxpy()
    solver_name = _pick_solver(cp, solver)
    common = {"tensor_order": m, "dehomogenized": dehomogenize}
    if (a < 0).any():
        reason = f"entry {a.min():.3g} < 0: CP tensors are entrywise nonnegative"
        return CPCheckResult(False, "not_cp", reason, order=0, **common)
    if not a.any():
        zero = {"weights": np.zeros(0), "factors": np.zeros((n, 0)), "error": 0.0, "extraction_error": 0.0}
        return CPCheckResult(True, "cp", "zero tensor", order=0, **zero, **common)
    scale = float(a.max())  # CP-ness is invariant under positive scaling; unit max entry helps the solver
    a = a / scale
    rng = np.random.default_rng(random_state)
    log: list[OrderLog] = []
    for k in range(k_min, k_max + 1):
        start = time.perf_counter()
        relax = _Relaxation(a, k, dehomogenize=dehomogenize)
        y, status, solver_seconds = relax.solve(cp, solver_name, rng)
        entry = OrderLog(k, status, relax.basis.size, len(relax.basis.up_to(k)), [], 0.0, solver_seconds)
        log.append(entry)
        if status in ("infeasible", "infeasible_inaccurate"):
            entry.seconds = time.perf_counter() - start
            reason = f"moment relaxation of order {k} is {status}: no representing measure on the simplex"
            return CPCheckResult(False, "not_cp", reason, order=k, log=log, **common)
        flat = None
        if y is not None:
            entry.ranks = [relax.rank(y, t, rank_tol) for t in range(k + 1)]
            flat = _flat_order(entry.ranks, k_min)
        if flat is None and status != "optimal":
            # The solver stalled (typical near weak infeasibility): decide by the phase-1 margin instead.
            entry.margin = relax.infeasibility_margin(cp, solver_name)
        entry.seconds = time.perf_counter() - start
        if entry.margin is not None and entry.margin > infeasibility_tol:
            reason = f"order-{k} relaxation infeasible by margin {entry.margin:.3g} (phase-1 problem)"
            return CPCheckResult(False, "not_cp", reason, order=k, log=log, **common)
        if flat is None:
            continue
        decomposition = _decomposition(a, relax, y, flat, entry.ranks[flat], rng, polish=polish)
        decomposition["weights"] = decomposition["weights"] * scale
        reason = f"flat truncation at t={flat} (rank {entry.ranks[flat]}) in the order-{k} relaxation"
        return CPCheckResult(True, "cp", reason, order=k, log=log, **decomposition, **common)
    reason = f"no flat optimizer and no certificate of infeasibility up to order {k_max}"
    return CPCheckResult(None, "undetermined", reason, order=k_max, log=log, **common)


def moment_relaxation_sizes(n: int, order: int, *, dehomogenize: bool = True) -> tuple[int, int]:
    """``(moment vector length, moment matrix side)`` of the order-``order`` relaxation (paper Table 1).

    Counted from the monomial basis actually built: all monomials of degree ``<= 2k`` (vector) and ``<= k``
    (matrix) in ``n - 1`` (dehomogenized) or ``n`` variables.
    """
    basis = _Monomials(n - 1 if dehomogenize else n, 2 * order)
    return basis.size, len(basis.up_to(order))


# ------------------------------------------------------------------------------------------------ checks


def _import_cvxpy() -> object:
    try:
        import cvxpy
    except ImportError as exc:  # cvxpy is the optional "tensor" extra
        raise ImportError(_INSTALL_HINT) from exc
    return cvxpy


def _pick_solver(cp: object, solver: str | None) -> str:
    available = set(cp.installed_solvers())
    names = [solver.upper()] if solver else ["CLARABEL", "SCS"]
    for name in names:
        if name in available:
            return name
    raise ValueError(f"solver={solver!r} is not available; installed cvxpy solvers: {sorted(available)}")


def _check_tensor(tensor: object, symmetry_tol: float) -> np.ndarray:
    if hasattr(tensor, "detach"):  # torch tensors without importing torch
        tensor = tensor.detach().cpu().numpy()
    if not isinstance(tensor, (np.ndarray, list, tuple)):
        raise TypeError(f"tensor must be a numpy array (or torch tensor), got {type(tensor).__name__}")
    a = np.asarray(tensor, dtype=np.float64)
    if a.ndim < 2 or len(set(a.shape)) != 1 or a.shape[0] < 2:
        raise ValueError(f"tensor must have shape (n,)*m with m >= 2 and n >= 2, got {a.shape}")
    if not np.isfinite(a).all():
        raise ValueError("tensor must have finite entries")
    scale = max(np.abs(a).max(), 1e-300)
    asym = max(np.abs(a - a.transpose(p)).max() for p in itertools.permutations(range(a.ndim)))
    if asym > symmetry_tol * scale:
        raise ValueError(f"tensor must be symmetric; max |A - A^T_perm| = {asym:.3g} > {symmetry_tol:g} * {scale:.3g}")
    return a


# ------------------------------------------------------------------------------------------------ monomials


class _Monomials:
    """Graded monomial basis ``x^alpha`` with ``|alpha| <= degree`` in ``nvars`` variables."""

    def __init__(self, nvars: int, degree: int) -> None:
        self.nvars = nvars
        self.exps: list[tuple[int, ...]] = []
        for deg in range(degree + 1):
            for combo in itertools.combinations_with_replacement(range(nvars), deg):
                self.exps.append(tuple(np.bincount(np.array(combo, dtype=int), minlength=nvars)))
        self.index = {e: i for i, e in enumerate(self.exps)}

    @property
    def size(self) -> int:
        return len(self.exps)

    def up_to(self, degree: int) -> list[tuple[int, ...]]:
        return [e for e in self.exps if sum(e) <= degree]

    def shift(self, alpha: tuple[int, ...], beta: tuple[int, ...]) -> int:
        return self.index[tuple(p + q for p, q in zip(alpha, beta, strict=True))]


def _poly_mul(p: dict[tuple[int, ...], float], q: dict[tuple[int, ...], float]) -> dict[tuple[int, ...], float]:
    out: dict[tuple[int, ...], float] = {}
    for e1, c1 in p.items():
        for e2, c2 in q.items():
            e = tuple(a + b for a, b in zip(e1, e2, strict=True))
            out[e] = out.get(e, 0.0) + c1 * c2
    return out


# ------------------------------------------------------------------------------------------------ relaxation


class _Relaxation:
    """Order-k Moment relaxation for CP detection, as sparse linear maps of the moment vector ``y``."""

    def __init__(self, a: np.ndarray, k: int, *, dehomogenize: bool) -> None:
        self.a, self.k, self.dehomogenize = a, k, dehomogenize
        self.n, self.m = a.shape[0], a.ndim
        self.nvars = self.n - 1 if dehomogenize else self.n
        self.basis = _Monomials(self.nvars, 2 * k)
        zero = (0,) * self.nvars
        unit = [tuple(int(i == j) for j in range(self.nvars)) for i in range(self.nvars)]
        if dehomogenize:
            # u_i = x_i (i < n-1), u_n = 1 - sum x: the simplex in n - 1 variables.
            self.u_polys = [{unit[i]: 1.0} for i in range(self.n - 1)]
            self.u_polys.append({zero: 1.0, **{unit[i]: -1.0 for i in range(self.n - 1)}})
            self.ineqs = [*self.u_polys]  # x_i >= 0 and 1 - e^T x >= 0
            self.eqs: list[dict[tuple[int, ...], float]] = []
        else:
            self.u_polys = [{unit[i]: 1.0} for i in range(self.n)]
            self.ineqs = [*self.u_polys]  # u_i >= 0
            self.eqs = [{zero: -1.0, **{unit[i]: 1.0 for i in range(self.n)}}]  # e^T u - 1 = 0

    def _matrix_map(self, t: int, poly: dict[tuple[int, ...], float]) -> tuple[object, int]:
        """Sparse ``(s*s, L)`` map with ``vec(L_poly^(t)(y)) = S y``; rows indexed by monomials of degree <= t."""
        from scipy.sparse import coo_matrix  # lazy

        rows_basis = self.basis.up_to(t)
        s = len(rows_basis)
        ri, ci, vals = [], [], []
        for a_i, alpha in enumerate(rows_basis):
            for b_i, beta in enumerate(rows_basis):
                ab = tuple(p + q for p, q in zip(alpha, beta, strict=True))
                for gamma, c in poly.items():
                    ri.append(a_i * s + b_i)
                    ci.append(self.basis.shift(ab, gamma))
                    vals.append(c)
        return coo_matrix((vals, (ri, ci)), shape=(s * s, self.basis.size)).tocsr(), s

    def _entry_equations(self) -> tuple[np.ndarray, np.ndarray]:
        """``B y = b``: one row per sorted multi-index ``i1 <= ... <= im`` of ``A``."""
        rows, rhs = [], []
        zero = (0,) * self.nvars
        for idx in itertools.combinations_with_replacement(range(self.n), self.m):
            poly = {zero: 1.0}
            for i in idx:
                poly = _poly_mul(poly, self.u_polys[i])
            row = np.zeros(self.basis.size)
            for e, c in poly.items():
                row[self.basis.index[e]] += c
            rows.append(row)
            rhs.append(self.a[idx])
        return np.array(rows), np.array(rhs)

    def constraints(self, cp: object, y: object, shift: object = 0.0) -> tuple[list[object], object]:
        """Constraints of the relaxation (``shift * I`` added to every PSD block) and the matrix ``M_k(y)``."""
        b_mat, b_rhs = self._entry_equations()
        cons = [b_mat @ y == b_rhs]
        blocks = [(self.k, {(0,) * self.nvars: 1.0})] + [(self.k - 1, g) for g in self.ineqs]
        moment = None
        for order, poly in blocks:
            lmap, side = self._matrix_map(order, poly)
            mat = cp.reshape(lmap @ y, (side, side), order="C")
            moment = mat if moment is None else moment
            cons.append((mat + mat.T) / 2 + shift * np.eye(side) >> 0)
        for h in self.eqs:
            # Ideal constraints L_y(h x^alpha) = 0 for |alpha| <= 2k - 1 (h has degree 1).
            cons.append(self._vector_map(2 * self.k - 1, h) @ y == 0)
        return cons, moment

    def solve(self, cp: object, solver: str, rng: np.random.Generator) -> tuple[np.ndarray | None, str, float]:
        """Solve ``min <G, M_k(y)>`` with a generic ``G > 0``; returns ``(y or None, status, solver seconds)``."""
        y = cp.Variable(self.basis.size)
        cons, moment = self.constraints(cp, y)
        side = moment.shape[0]
        g_half = rng.standard_normal((side, side))
        gram = g_half @ g_half.T / side + np.eye(side)  # generic positive definite objective
        prob = cp.Problem(cp.Minimize(cp.trace(gram @ moment)), cons)
        status = _solve(cp, prob, solver)
        seconds = _solver_seconds(prob)
        return (None if y.value is None else np.asarray(y.value)), status, seconds

    def infeasibility_margin(self, cp: object, solver: str) -> float | None:
        """Phase-1 value ``min t`` s.t. the relaxation holds with ``t I`` added to each PSD block (t >= -1)."""
        y, t = cp.Variable(self.basis.size), cp.Variable()
        cons, _ = self.constraints(cp, y, shift=t)
        prob = cp.Problem(cp.Minimize(t), [*cons, t >= -1.0])
        _solve(cp, prob, solver)
        return None if t.value is None else float(t.value)

    def _vector_map(self, degree: int, poly: dict[tuple[int, ...], float]) -> object:
        from scipy.sparse import coo_matrix  # lazy

        rows_basis = self.basis.up_to(degree)
        ri, ci, vals = [], [], []
        for r_i, alpha in enumerate(rows_basis):
            for gamma, c in poly.items():
                ri.append(r_i)
                ci.append(self.basis.shift(alpha, gamma))
                vals.append(c)
        return coo_matrix((vals, (ri, ci)), shape=(len(rows_basis), self.basis.size)).tocsr()

    def moment_matrix(self, y: np.ndarray, t: int) -> np.ndarray:
        mmap, s = self._matrix_map(t, {(0,) * self.nvars: 1.0})
        return (mmap @ y).reshape(s, s)

    def rank(self, y: np.ndarray, t: int, tol: float) -> int:
        sv = np.linalg.svd(self.moment_matrix(y, t), compute_uv=False)
        return int((sv > tol * max(sv[0], 1e-300)).sum())

    def extract(self, y: np.ndarray, t: int, r: int, rng: np.random.Generator) -> np.ndarray:
        """Atoms ``(r, nvars)`` of the flat moment vector, from the pencil of shifted moment matrices.

        With ``H0 = M_(t-1)(y) = sum_j lambda_j v_j v_j^T`` (``v_j`` the monomials of atom j) and
        ``H_i = L_(x_i)^(t)(y)``, the matrices ``N_i = S^-1/2 P^T H_i P S^-1/2`` (``H0 = P S P^T``, rank r) are
        symmetric, commute, and have the atom coordinates as eigenvalues on a common orthonormal basis.
        """
        h0 = self.moment_matrix(y, t - 1)
        evals, evecs = np.linalg.eigh(h0)
        p, sv = evecs[:, -r:], evals[-r:]  # (s, r), (r,)
        whiten = p / np.sqrt(np.maximum(sv, 1e-300))  # P S^-1/2
        unit = [tuple(int(i == j) for j in range(self.nvars)) for i in range(self.nvars)]
        mults = []
        for i in range(self.nvars):
            hmap, s = self._matrix_map(t - 1, {unit[i]: 1.0})
            hi = (hmap @ y).reshape(s, s)
            mults.append(whiten.T @ ((hi + hi.T) / 2) @ whiten)  # (r, r)
        combo = sum(c * mat for c, mat in zip(rng.standard_normal(self.nvars), mults, strict=True))
        _, q = np.linalg.eigh(combo)  # common eigenvectors
        return np.stack([np.einsum("ij,ik,kj->j", q, mat, q) for mat in mults], axis=1)  # (r, nvars)


def _solve(cp: object, prob: object, solver: str) -> str:
    """Solve and return cvxpy's status; a solver failure becomes the status ``"solver_error"``."""
    import warnings

    try:
        with warnings.catch_warnings():  # "solution may be inaccurate" is reported through the status instead
            warnings.simplefilter("ignore", UserWarning)
            prob.solve(solver=solver)
    except cp.error.SolverError:
        return "solver_error"
    return str(prob.status)


def _solver_seconds(prob: object) -> float:
    stats = prob.solver_stats
    return float(stats.solve_time) if stats is not None and stats.solve_time is not None else float("nan")


def _flat_order(ranks: list[int], k_min: int) -> int | None:
    """Smallest ``t`` in ``[max(k_min, 1), k]`` with ``rank M_t = rank M_(t-1)`` (flat truncation, d_K = 1)."""
    for t in range(max(k_min, 1), len(ranks)):
        if ranks[t] == ranks[t - 1] and ranks[t] > 0:
            return t
    return None


def _atoms_to_simplex(atoms: np.ndarray, n: int, dehomogenize: bool) -> np.ndarray:
    """Atoms ``(r, nvars)`` -> nonnegative simplex points as columns ``(n, r)``."""
    u = np.hstack([atoms, 1.0 - atoms.sum(axis=1, keepdims=True)]) if dehomogenize else atoms.copy()
    u = np.maximum(u, 0.0)  # solver noise can leave -1e-9 entries
    return (u / np.maximum(u.sum(axis=1, keepdims=True), 1e-300)).T


def _fit_weights(a: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, float]:
    """Nonnegative least squares for ``lambda`` in ``A = sum_j lambda_j u_j^(x)m``, and the relative error."""
    from scipy.optimize import nnls  # lazy

    m = a.ndim
    cols = []
    for j in range(u.shape[1]):
        outer = u[:, j]
        for _ in range(m - 1):
            outer = np.multiply.outer(outer, u[:, j])
        cols.append(outer.ravel())
    design = np.stack(cols, axis=1)  # (n^m, r)
    weights, _ = nnls(design, a.ravel())
    err = float(np.linalg.norm(design @ weights - a.ravel()) / np.linalg.norm(a))
    return weights, err


def _decomposition(
    a: np.ndarray, relax: _Relaxation, y: np.ndarray, flat: int, rank: int, rng: np.random.Generator, *, polish: bool
) -> dict[str, object]:
    """Atoms of the flat moment vector -> nonnegative weights (NNLS) -> optional polish, with both errors."""
    atoms = relax.extract(y, flat, rank, rng)  # (r, nvars)
    u = _atoms_to_simplex(atoms, a.shape[0], relax.dehomogenize)  # (n, r)
    weights, raw_err = _fit_weights(a, u)
    keep = weights > 0
    weights, u, err = weights[keep], u[:, keep], raw_err
    if polish:
        weights, u, err = _polish(a, weights, u)
    return {"weights": weights, "factors": u, "error": err, "extraction_error": raw_err}


def _rank_one_sum(v: np.ndarray, m: int) -> np.ndarray:
    """``sum_j v_j^(x)m`` flattened, for columns ``v_j`` of ``v`` ``(n, r)``."""
    out = np.zeros(v.shape[0] ** m)
    for j in range(v.shape[1]):
        outer = v[:, j]
        for _ in range(m - 1):
            outer = np.multiply.outer(outer, v[:, j])
        out += outer.ravel()
    return out


def _polish(a: np.ndarray, weights: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """Local refinement of ``A ~ sum_j v_j^(x)m`` over ``v >= 0`` (``v_j = lambda_j^(1/m) u_j``); keeps the better."""
    from scipy.optimize import least_squares  # lazy

    m, (n, r) = a.ndim, u.shape
    target = a.ravel()
    start = (u * weights ** (1.0 / m)).ravel()
    sol = least_squares(lambda z: _rank_one_sum(z.reshape(n, r), m) - target, start, bounds=(0.0, np.inf))
    v = sol.x.reshape(n, r)
    err = float(np.linalg.norm(_rank_one_sum(v, m) - target) / np.linalg.norm(target))
    before = float(np.linalg.norm(_rank_one_sum(start.reshape(n, r), m) - target) / np.linalg.norm(target))
    if not err < before:
        return weights, u, before
    scale = np.maximum(v.sum(axis=0), 1e-300)  # back onto the simplex
    return scale**m, v / scale, err
