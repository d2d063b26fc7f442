"""Why climb's GP is its own code: against scikit-learn's GaussianProcessRegressor.

scikit-learn's GP has analytic gradients of the evidence too; what it cannot do is put a
prior on the lengthscales, and `climb.optimize.gp.GPPredictor` puts a log-normal one on
each (around sqrt(d)). On RegMix's released 1M swarm (../shared/data/swarms/regmix): fit
on n training runs (the first n, and `--reps - 1` other random draws of n), rank the 256
test runs, for three GPs on the same standardised log(w + eps) features:

- `climb`: GPPredictor as the library uses it (Matern-5/2 ARD, the lengthscale prior);
- `climb, no prior`: the same with ls_prior = 0 (the evidence alone);
- `sklearn`: ConstantKernel x Matern(nu=2.5, ARD) + WhiteKernel, normalize_y, its L-BFGS-B
  on its own analytic gradient, one start.

Spearman with the measured test losses and seconds to fit, per n, and climb - sklearn
paired over the draws with its 95% interval.

    python benchmarks/gp_sklearn.py --json benchmarks/results/gp_sklearn.json
"""
from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import numpy as np

from common import REGMIX, write_result

DATA = REGMIX


def sklearn_gp(X, y, eps: float):
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import ConstantKernel, Matern, WhiteKernel
    F = np.log(X + eps)
    mu, sd = F.mean(0), F.std(0)
    sd = np.where(sd < 1e-12, 1.0, sd)
    d = X.shape[1]
    kernel = ConstantKernel(1.0, (1e-3, 1e2)) * Matern(np.full(d, np.sqrt(d)), (1e-2, 1e3), nu=2.5) \
        + WhiteKernel(1e-2, (1e-6, 1.0))
    gp = GaussianProcessRegressor(kernel, normalize_y=True, n_restarts_optimizer=0, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        gp.fit((F - mu) / sd, y)
    return lambda Q: gp.predict((np.log(Q + eps) - mu) / sd)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="metric/the_pile_pile_cc_val_loss")
    ap.add_argument("--n", type=int, nargs="+", default=[16, 32, 64, 112, 256])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    if not DATA.exists():
        raise SystemExit(f"{DATA} not found: this benchmark needs ../shared/data (RegMix's released swarm)")
    from scipy.stats import spearmanr, t

    from climb.io.swarm_csv import read_swarm, target_values
    from climb.optimize.gp import LOG_EPS, GPPredictor
    tr = read_swarm(DATA / "train_mixture_1m.csv", DATA / "train_pile_loss_1m.csv")
    te = read_swarm(DATA / "test_mixture_1m.csv", DATA / "test_pile_loss_1m.csv")
    y, yt = target_values(tr, args.target), target_values(te, args.target)
    models = {"climb": lambda X, Y: GPPredictor(seed=0).fit(X, Y).predict,
              "climb, no prior": lambda X, Y: GPPredictor(seed=0, ls_prior=0.0).fit(X, Y).predict,
              "sklearn": lambda X, Y: sklearn_gp(X, Y, LOG_EPS)}
    rows = []
    for n in args.n:
        for rep in range(args.reps):
            idx = np.arange(n) if rep == 0 else np.random.default_rng([n, rep]).choice(len(y), n, replace=False)
            for name, fit in models.items():
                t0 = time.perf_counter()
                predict = fit(tr.weights[idx], y[idx])
                seconds = time.perf_counter() - t0
                rho = float(spearmanr(predict(te.weights), yt).statistic)
                rows.append({"n": n, "draw": rep, "model": name, "spearman": rho, "fit_seconds": seconds})
        for name in models:
            r = [x for x in rows if x["n"] == n and x["model"] == name]
            print(f"n={n} {name}: Spearman {np.mean([x['spearman'] for x in r]):.4f}, "
                  f"fit {np.median([x['fit_seconds'] for x in r]):.2f}s")
    summary = {}
    for n in args.n:
        per = {m: np.array([x["spearman"] for x in rows if x["n"] == n and x["model"] == m]) for m in models}
        sec = {m: float(np.median([x["fit_seconds"] for x in rows if x["n"] == n and x["model"] == m]))
               for m in models}
        diff = per["climb"] - per["sklearn"]
        hw = float(t.ppf(0.975, len(diff) - 1) * diff.std(ddof=1) / np.sqrt(len(diff))) if len(diff) > 1 else None
        summary[str(n)] = {"spearman": {m: float(v.mean()) for m, v in per.items()}, "fit_seconds": sec,
                           "climb_minus_sklearn": float(diff.mean()),
                           "ci95": [float(diff.mean() - hw), float(diff.mean() + hw)] if hw is not None else None}
    allc = np.array([x["spearman"] for x in rows if x["model"] == "climb"])
    alls = np.array([x["spearman"] for x in rows if x["model"] == "sklearn"])
    d = allc - alls
    hw = float(t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d)))
    out = {"target": args.target, "reps": args.reps, "by_n": summary, "rows": rows,
           "climb_minus_sklearn_all": {"diff": float(d.mean()), "ci95": [float(d.mean() - hw), float(d.mean() + hw)],
                                       "pairs": len(d)}}
    print(f"climb - sklearn Spearman over all {len(d)} fits: {d.mean():+.4f} "
          f"[{d.mean() - hw:+.4f}, {d.mean() + hw:+.4f}]")
    if args.json:
        write_result(Path(args.json), out, indent=1)


if __name__ == "__main__":
    main()
