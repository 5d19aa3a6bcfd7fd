"""Tensor-method benchmarks on CPU: mixed-precision CP vs ALS, moment GMM vs EM, CP-tensor detection sizes/times.

1. ``cp``: ``cp_mixed_precision`` (fp32/fp16/bf16/fp8, factors stored in the format or fp32 master factors) vs
   tensorly ``parafac`` (ALS, float64; init svd, random, random + line search) on 60x60x60 rank-8 tensors with
   Gaussian factors and 1 % Gaussian noise (the setting of compress.md Sec. 6.3). Relative error, time, and bytes
   of stored factors / gradients / momentum.
2. ``gmm``: ``gmm_moments`` (with and without refinement, and as an EM initializer) vs scikit-learn
   ``GaussianMixture(covariance_type="diag")`` with k-means and random init, d = 10, r = 3, N = 1e4 and 1e5
   (compress.md Sec. 6.4). Relative parameter errors after matching components, time, EM iterations.
3. ``cpcheck``: ``cp_tensor_check`` with and without dehomogenization on random CP tensors and on two non-CP
   tensors: answer, relaxation order, moment-vector / moment-matrix sizes, wall and solver time.

Usage: ``.venv/bin/python benchmarks/tensor_methods.py all --seeds 3 --out benchmarks/results/tensor_methods``
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from _results import write

LINES: list[str] = []


def say(line: str) -> None:
    """Print and keep a line for the raw-output section of the report."""
    print(line, flush=True)
    LINES.append(line)


# ------------------------------------------------------------------------------------------------ 1. CP


def cp_problem(seed: int, size: int = 60, rank: int = 8, noise: float = 0.01) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    factors = [torch.randn(size, rank, generator=g) for _ in range(3)]
    exact = torch.einsum("ir,jr,kr->ijk", *factors)
    e = torch.randn(exact.shape, generator=g)
    return exact + noise * e * exact.norm() / e.norm()


def run_als(x: np.ndarray, rank: int, init: str, linesearch: bool, seed: int) -> dict[str, object]:
    import tensorly as tl
    from tensorly.decomposition import parafac

    start = time.perf_counter()
    iters: list[int] = []
    cp = parafac(
        x,
        rank,
        init=init,
        n_iter_max=2000,
        tol=1e-10,
        linesearch=linesearch,
        random_state=seed,
        callback=lambda *_: iters.append(1),  # called once at init, then once per iteration
    )
    seconds = time.perf_counter() - start
    err = float(np.linalg.norm(x - tl.cp_to_tensor(cp)) / np.linalg.norm(x))
    per = sum(x.shape) * rank * 8  # float64 factors, and one MTTKRP (gradient-like) buffer of the same size
    rec = {"rel_error": err, "seconds": seconds, "iterations": len(iters) - 1, "factors": per, "gradients": per}
    return rec, cp


def rounding_floor(x: np.ndarray, cp: object, precision: str, *, stochastic: bool) -> float:
    """Error of the ALS optimum after rounding its factors (weights spread evenly over modes) to a format.

    This is what storing the factors in ``precision`` costs at best, whatever the optimizer.
    """
    import tensorly as tl

    from tensorslim.decomp._lowprec import get_format, round_to_format

    weights, factors = cp
    per_mode = np.abs(weights) ** (1.0 / len(factors))
    scaled = [f * per_mode for f in factors]
    scaled[0] = scaled[0] * np.sign(weights)
    gen = torch.Generator().manual_seed(0)
    fmt = get_format(precision)
    rounded = [
        round_to_format(torch.tensor(f, dtype=torch.float32), fmt, stochastic=stochastic, generator=gen).double()
        for f in scaled
    ]
    approx = tl.cp_to_tensor((np.ones(len(weights)), [r.numpy() for r in rounded]))
    return float(np.linalg.norm(x - approx) / np.linalg.norm(x))


CP_CONFIGS = {
    "fp32": {"precision": "fp32"},
    "fp16": {"precision": "fp16"},
    "bf16": {"precision": "bf16"},
    "bf16-master": {"precision": "bf16", "master_factors": True},
    "bf16-compensated": {"precision": "bf16", "compensated": True},
    "fp8": {"precision": "fp8_e4m3"},
    "fp8-master": {"precision": "fp8_e4m3", "master_factors": True},
}


def bench_cp(seeds: int, epochs: int, sign_epochs: int, names: Sequence[str]) -> list[dict[str, object]]:
    from tensorslim.decomp.cp_mixed import cp_mixed_precision

    records = []
    for seed in range(seeds):
        x = cp_problem(seed)
        x64 = x.double().numpy()
        for init, ls in (("svd", False), ("random", False), ("random", True)):
            als, cp = run_als(x64, 8, init, ls, seed)
            rec = {"kind": "als", "seed": seed, "init": init, "linesearch": ls, **als}
            records.append(rec)
            say(
                f"cp seed={seed} ALS init={init} linesearch={ls}: rel_err={rec['rel_error']:.6e} "
                f"iters={rec['iterations']} time={rec['seconds']:.3f}s"
            )
            if init == "svd":
                for precision in ("fp16", "bf16", "fp8_e4m3"):
                    nearest = rounding_floor(x64, cp, precision, stochastic=False)
                    stoch = rounding_floor(x64, cp, precision, stochastic=True)
                    records.append(
                        {"kind": "rounding_floor", "seed": seed, "precision": precision, "nearest": nearest,
                         "stochastic": stoch}
                    )  # fmt: skip
                    say(
                        f"cp seed={seed} ALS(svd) optimum with factors rounded to {precision}: "
                        f"nearest {nearest:.6e}, stochastic {stoch:.6e}"
                    )
        floor = min(r["rel_error"] for r in records if r["kind"] == "als" and r["seed"] == seed)
        for name in names:
            kwargs = CP_CONFIGS[name]
            precision, master = kwargs["precision"], kwargs.get("master_factors", False)
            start = time.perf_counter()
            res = cp_mixed_precision(x, 8, epochs=epochs, sign_epochs=sign_epochs, random_state=seed, **kwargs)
            seconds = time.perf_counter() - start
            reach = next((e.seconds for e in res.log if e.rel_error <= 1.1 * floor), None)
            rec = {
                "kind": "sgd",
                "seed": seed,
                "precision": precision,
                "master_factors": master,
                "compensated": kwargs.get("compensated", False),
                "rel_error": res.rel_error,
                "after_stage1": res.log[sign_epochs].rel_error,
                "seconds": seconds,
                "seconds_to_1.1x_als": reach,
                **res.memory,
                "log": [e.rel_error for e in res.log],
            }
            records.append(rec)
            say(
                f"cp seed={seed} SGD {name}: rel_err={res.rel_error:.6e} "
                f"(x{res.rel_error / floor:.4f} of ALS) after_signsgd={rec['after_stage1']:.4f} time={seconds:.2f}s "
                f"to_1.1xALS={'never' if reach is None else f'{reach:.2f}s'} memory={res.memory}"
            )
    return records


# ------------------------------------------------------------------------------------------------ 2. GMM


def gmm_problem(seed: int, n: int, d: int = 10, r: int = 3) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    rng = np.random.default_rng(seed)
    w, mu, var = rng.dirichlet([5.0] * r), rng.uniform(-3, 3, (r, d)), rng.uniform(0.5, 2.0, (r, d))
    z = rng.choice(r, n, p=w)
    return mu[z] + rng.standard_normal((n, d)) * np.sqrt(var[z]), (w, mu, var)


def gmm_errors(w, mu, var, truth) -> tuple[float, float, float]:
    from scipy.optimize import linear_sum_assignment

    tw, tmu, tvar = truth
    rows, cols = linear_sum_assignment(((mu[:, None, :] - tmu[None]) ** 2).sum(-1))
    perm = rows[np.argsort(cols)]

    def rel(a: np.ndarray, b: np.ndarray) -> float:
        return float(np.linalg.norm(a - b) / np.linalg.norm(b))

    return rel(w[perm], tw), rel(mu[perm], tmu), rel(var[perm], tvar)


def bench_gmm(seeds: int) -> list[dict[str, object]]:
    from sklearn.mixture import GaussianMixture

    from tensorslim.decomp.gmm import gmm_moments

    records = []
    for n, seed in itertools.product((10_000, 100_000), range(seeds)):
        y, truth = gmm_problem(seed, n)
        cases: dict[str, Callable[[], tuple[object, int | None]]] = {
            "moments": lambda y=y: (gmm_moments(y, 3, refine=False), None),
            "moments+LM": lambda y=y: (gmm_moments(y, 3), None),
            "moments+LM->EM": lambda y=y: _moment_em(y),
            "EM kmeans": lambda y=y, s=seed: _em(GaussianMixture(3, covariance_type="diag", random_state=s), y),
            "EM random": lambda y=y, s=seed: _em(
                GaussianMixture(3, covariance_type="diag", init_params="random", random_state=s), y
            ),
        }
        for name, fit in cases.items():
            start = time.perf_counter()
            model, iters = fit()
            seconds = time.perf_counter() - start
            errs = gmm_errors(model.weights_, model.means_, model.covariances_, truth)
            rec = {"N": n, "seed": seed, "method": name, "errors": errs, "seconds": seconds, "em_iterations": iters}
            if hasattr(model, "timings"):
                rec["timings"] = model.timings
            records.append(rec)
            say(
                f"gmm N={n} seed={seed} {name}: rel_err(w,mu,var)=({errs[0]:.4f},{errs[1]:.4f},{errs[2]:.4f}) "
                f"time={seconds:.3f}s em_iters={iters}"
            )
    return records


def _moment_em(y: np.ndarray) -> tuple[object, int]:
    from tensorslim.decomp.gmm import gmm_moments

    em = gmm_moments(y, 3).sklearn_init().fit(y)
    return em, int(em.n_iter_)


def _em(gm: object, y: np.ndarray) -> tuple[object, int]:
    gm.fit(y)
    return gm, int(gm.n_iter_)


# ------------------------------------------------------------------------------------------------ 3. CP check


def cp_sym(n: int, m: int, r: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    u, lam = rng.uniform(0, 1, (n, r)), rng.uniform(0.5, 1.5, r)
    a = np.zeros((n,) * m)
    for j in range(r):
        outer = u[:, j]
        for _ in range(m - 1):
            outer = np.multiply.outer(outer, u[:, j])
        a += lam[j] * outer
    return a


def non_cp_cases() -> dict[str, np.ndarray]:
    pattern = np.zeros((3,) * 4)
    for p in set(itertools.permutations((0, 0, 1, 1))):
        pattern[p] = 1.0
    dnn = np.array([[1, 1, 0, 0, 1], [1, 2, 1, 0, 0], [0, 1, 2, 1, 0], [0, 0, 1, 2, 1], [1, 0, 0, 1, 6]], float)
    return {"pattern (0,0,1,1), n=3 m=4": pattern, "DNN 5-cycle matrix, n=5 m=2": dnn}


def bench_cpcheck(repeats: int) -> list[dict[str, object]]:
    from tensorslim.decomp.cp_check import cp_tensor_check, moment_relaxation_sizes

    cases = {f"CP n={n} m={m} r={r}": cp_sym(n, m, r, seed=1) for n, m, r in CP_CASES}
    cases.update(non_cp_cases())
    records = []
    for n, k in ((3, 2), (4, 3), (5, 4)):
        sizes = (moment_relaxation_sizes(n, k), moment_relaxation_sizes(n, k, dehomogenize=False))
        records.append({"kind": "sizes", "n": n, "k": k, "dehomogenized": sizes[0], "homogeneous": sizes[1]})
        say(f"cpcheck sizes n={n} k={k}: with dehomogenization {sizes[0]}, without {sizes[1]}")
    cp_tensor_check(cases["CP n=3 m=4 r=3"])  # warm-up: cvxpy import and first canonicalisation
    for name, a in cases.items():
        for rep in range(repeats):
            for dehom in (True, False):  # alternate so that load drifts hit both alike
                res = cp_tensor_check(a, dehomogenize=dehom)
                rec = {
                    "kind": "check",
                    "case": name,
                    "repeat": rep,
                    "dehomogenized": dehom,
                    "status": res.status,
                    "order": res.order,
                    "error": res.error,
                    "extraction_error": res.extraction_error,
                    "seconds": res.solve_seconds,
                    "solver_seconds": sum(e.solver_seconds for e in res.log),
                    "log": [
                        {"order": e.order, "status": e.status, "vector": e.moment_vector_size,
                         "matrix": e.moment_matrix_size, "ranks": e.ranks, "seconds": e.seconds, "margin": e.margin}
                        for e in res.log
                    ],
                }  # fmt: skip
                records.append(rec)
                say(
                    f"cpcheck {name} dehom={dehom} rep={rep}: {res.status} order={res.order} "
                    f"err={_fmt(res.error)} extraction_err={_fmt(res.extraction_error)} time={res.solve_seconds:.3f}s "
                    f"solver={rec['solver_seconds']:.3f}s "
                    f"orders={[(e['order'], e['status'], e['vector']) for e in rec['log']]}"
                )
    return records


CP_CASES = [(3, 4, 3), (3, 4, 4), (3, 3, 2), (4, 3, 3), (4, 4, 5), (5, 4, 5), (3, 6, 4)]


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2e}"


# ------------------------------------------------------------------------------------------------ report


def summarize_cp(records: list[dict[str, object]]) -> list[str]:
    out = ["## 1. Mixed-precision CP (60x60x60, rank 8, 1 % noise) vs tensorly ALS (float64)", ""]
    out += ["| method | rel. error mean (min-max) | x ALS best | time s mean | factors B | gradients B | momentum B "]
    out[-1] += "| compensation B |"
    out += ["|---|---|---|---|---|---|---|---|"]
    seeds = sorted({r["seed"] for r in records})
    floors = {s: min(r["rel_error"] for r in records if r["kind"] == "als" and r["seed"] == s) for s in seeds}
    groups: dict[str, list[dict[str, object]]] = {}
    for r in records:
        if r["kind"] == "rounding_floor":
            continue
        if r["kind"] == "als":
            key = f"ALS init={r['init']}{' +linesearch' if r['linesearch'] else ''}"
        else:
            key = f"SGD {r['precision']}{' (fp32 master factors)' if r['master_factors'] else ''}"
            key += " (Kahan-compensated, bf16 compensation)" if r.get("compensated") else ""
        groups.setdefault(key, []).append(r)
    for key, rs in groups.items():
        errs = [r["rel_error"] for r in rs]
        ratio = statistics.mean(r["rel_error"] / floors[r["seed"]] for r in rs)
        mom = rs[0].get("momentum", "-")
        out.append(
            f"| {key} | {statistics.mean(errs):.5e} ({min(errs):.5e}-{max(errs):.5e}) | {ratio:.4f} | "
            f"{statistics.mean(r['seconds'] for r in rs):.2f} | {rs[0]['factors']} | {rs[0]['gradients']} | {mom} | "
            f"{rs[0].get('compensation', '-')} |"
        )
    out += ["", "Lower bound from storage alone: the ALS optimum with its factors rounded to the format.", ""]
    out += ["| format | rel. error, nearest rounding | x ALS | rel. error, stochastic rounding | x ALS |"]
    out += ["|---|---|---|---|---|"]
    for precision in ("fp16", "bf16", "fp8_e4m3"):
        rs = [r for r in records if r["kind"] == "rounding_floor" and r["precision"] == precision]
        if not rs:
            continue
        near = statistics.mean(r["nearest"] for r in rs)
        stoch = statistics.mean(r["stochastic"] for r in rs)
        x_near = statistics.mean(r["nearest"] / floors[r["seed"]] for r in rs)
        x_stoch = statistics.mean(r["stochastic"] / floors[r["seed"]] for r in rs)
        out.append(f"| {precision} | {near:.5e} | {x_near:.4f} | {stoch:.5e} | {x_stoch:.4f} |")
    return out + [""]


def summarize_gmm(records: list[dict[str, object]]) -> list[str]:
    out = ["## 2. Diagonal GMM, d = 10, r = 3: moments vs scikit-learn EM", ""]
    out += ["| N | method | rel. err w | rel. err mu | rel. err var | worst mu err | time s | EM iters |"]
    out += ["|---|---|---|---|---|---|---|---|"]
    keys = sorted({(r["N"], r["method"]) for r in records}, key=lambda k: (k[0], list(METHOD_ORDER).index(k[1])))
    for n, method in keys:
        rs = [r for r in records if r["N"] == n and r["method"] == method]
        errs = np.array([r["errors"] for r in rs])
        iters = [r["em_iterations"] for r in rs if r["em_iterations"] is not None]
        it = f"{statistics.mean(iters):.1f}" if iters else "-"
        out.append(
            f"| {n} | {method} | {errs[:, 0].mean():.4f} | {errs[:, 1].mean():.4f} | {errs[:, 2].mean():.4f} | "
            f"{errs[:, 1].max():.4f} | {statistics.mean(r['seconds'] for r in rs):.3f} | {it} |"
        )
    return out + ["", "Errors and times are means over seeds; 'worst mu err' is the largest over seeds.", ""]


METHOD_ORDER = ("moments", "moments+LM", "moments+LM->EM", "EM kmeans", "EM random")


def summarize_cpcheck(records: list[dict[str, object]]) -> list[str]:
    out = ["## 3. CP-tensor detection, with vs without dehomogenization (Clarabel)", ""]
    out += ["| n | k | moment vector (with / without) | moment matrix (with / without) |", "|---|---|---|---|"]
    for r in records:
        if r["kind"] == "sizes":
            d, h = r["dehomogenized"], r["homogeneous"]
            out.append(f"| {r['n']} | {r['k']} | {d[0]} / {h[0]} | {d[1]} / {h[1]} |")
    out += ["", "| tensor | dehom. | answer | order | vector | error (extraction) | wall s median | solver s median |"]
    out += ["|---|---|---|---|---|---|---|---|"]
    checks = [r for r in records if r["kind"] == "check"]
    for case, dehom in dict.fromkeys((r["case"], r["dehomogenized"]) for r in checks):
        rs = [r for r in checks if r["case"] == case and r["dehomogenized"] == dehom]
        r0 = rs[0]
        vec = r0["log"][-1]["vector"] if r0["log"] else "-"
        out.append(
            f"| {case} | {'yes' if dehom else 'no'} | {r0['status']} | {r0['order']} | {vec} | "
            f"{_fmt(r0['error'])} ({_fmt(r0['extraction_error'])}) | "
            f"{statistics.median(r['seconds'] for r in rs):.3f} | "
            f"{statistics.median(r['solver_seconds'] for r in rs):.3f} |"
        )
    return out + [""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["cp", "gmm", "cpcheck", "all"])
    parser.add_argument("--seeds", type=int, default=3, help="problem seeds for cp and gmm")
    parser.add_argument("--repeats", type=int, default=3, help="repeats of each cpcheck solve (median reported)")
    parser.add_argument("--epochs", type=int, default=40, help="stage-2 epochs of the CP SGD")
    parser.add_argument("--sign-epochs", type=int, default=5, help="stage-1 (SignSGD) epochs")
    parser.add_argument("--cp-configs", nargs="+", choices=list(CP_CONFIGS), default=list(CP_CONFIGS))
    parser.add_argument("--threads", type=int, default=1, help="torch and BLAS threads")
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "tensor_methods")
    args = parser.parse_args(argv)

    from threadpoolctl import threadpool_limits

    torch.set_num_threads(args.threads)
    results: dict[str, list[dict[str, object]]] = {}
    with threadpool_limits(args.threads):
        if args.what in ("cp", "all"):
            results["cp"] = bench_cp(args.seeds, args.epochs, args.sign_epochs, args.cp_configs)
        if args.what in ("gmm", "all"):
            results["gmm"] = bench_gmm(args.seeds)
        if args.what in ("cpcheck", "all"):
            results["cpcheck"] = bench_cpcheck(args.repeats)
    out = args.out.with_name(f"{args.out.name}_{args.what}") if args.what != "all" else args.out
    report = []
    if "cp" in results:
        report += summarize_cp(results["cp"])
    if "gmm" in results:
        report += summarize_gmm(results["gmm"])
    if "cpcheck" in results:
        report += summarize_cpcheck(results["cpcheck"])
    report += ["## Raw output", "", "```", *LINES, "```", ""]
    notes = [f"threads: {args.threads} (torch and BLAS)", f"versions: {_versions()}"]
    path = write(out, f"Tensor methods benchmark ({args.what})", report, data=results, notes=notes)
    print(f"wrote {path} and {path.with_suffix('.json')}")
    return 0


def _versions() -> str:
    import cvxpy
    import scipy
    import sklearn
    import tensorly

    mods = {"torch": torch, "numpy": np, "scipy": scipy, "tensorly": tensorly, "sklearn": sklearn, "cvxpy": cvxpy}
    return ", ".join(f"{k} {m.__version__}" for k, m in mods.items())


if __name__ == "__main__":
    raise SystemExit(main())
