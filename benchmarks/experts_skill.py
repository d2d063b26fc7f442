"""How well do the experts rank mixtures? Their ensemble loss against measured proxies.

A search with `search.experts` fits a line in the experts' ensemble loss to the few proxies
it has trained (8 with `[4, 2, 2]`), so the feature's skill is measured there on a handful
of mixtures chosen close together. This measures it on a wider set: the 28 search mixtures
of the default search's run of the same seed (same corpus, clusters, target and proxy), each
mixture's measured objective against the ensemble loss of the experts of an experts run.
Printed per seed: Spearman and Pearson (positive: the experts rank as the proxies do).
`--cross` also scores every seed's measured mixtures with every other seed's experts, to tell
whether a low figure comes from the experts (a row) or from the mixtures they rank (a column).

    python benchmarks/experts_skill.py --seeds 10 11 --experts 'runs/cbench_E_s{seed}' \
        --measured 'runs/cbench_default_s{seed}'

With `--train F`, experts of F times the proxies' steps are trained first, in a copy of
`--base` (embed, cluster and tokenize done) named by `--experts`, with `--config` and `--set`
as the runs were made, the search seed set per seed; nothing else of the search runs:

    python benchmarks/experts_skill.py --train 1.0 --base runs/cbench_base --config pipelines/bench.toml \
        --set corpus.max_shards=2 --seeds 10 --experts 'runs/xskill_f1.0_s{seed}' \
        --measured 'runs/cbench_default_s{seed}'
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from common import go_offline, write_result

go_offline()
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def expert_logprobs(run: Path) -> tuple[list[int], np.ndarray, np.ndarray]:
    """The clusters with an expert in `run`, their log-probabilities (tokens x experts) and the
    tokens' weights in the objective."""
    from climb.runtime.proxy_runs import coef_path
    from climb.runtime.layout import RunPaths
    where = RunPaths(run).search.expert_logprobs
    folder = where(0).parent
    clusters = sorted(int(p.name[len("cluster_"):-len(".coef.npy")]) for p in folder.glob("cluster_*.coef.npy"))
    if not clusters:
        raise SystemExit(f"{folder} holds no experts")
    logp = np.stack([np.load(where(c)) for c in clusters], 1)
    return clusters, logp, np.load(coef_path(where(clusters[0])))


def measured(run: Path) -> tuple[np.ndarray, np.ndarray]:
    """The weights and objective of every search proxy of `run` that finished (its last record)."""
    from climb.runtime.layout import RunPaths
    from climb.stages.search import read_results
    rows = [r for r in read_results(RunPaths(run)) if r.get("status") == "ok" and r.get("objective") is not None]
    return np.array([r["weights"] for r in rows], float), np.array([r["objective"] for r in rows], float)


def skill(experts_run: Path, measured_run: Path) -> dict:
    from scipy.stats import pearsonr, spearmanr

    from climb.optimize.experts import ensemble_loss
    clusters, logp, coef = expert_logprobs(experts_run)
    W, y = measured(measured_run)
    f = ensemble_loss(logp, coef, W[:, clusters])
    return {"experts": str(experts_run), "measured": str(measured_run), "mixtures": len(y),
            "spearman": float(spearmanr(f, y).statistic), "pearson": float(pearsonr(f, y).statistic),
            "ensemble_range": [float(f.min()), float(f.max())], "measured_range": [float(y.min()), float(y.max())]}


def train_experts(base: Path, run: Path, config: str, sets: list[str], seed: int, fraction: float) -> None:
    """Experts of `fraction` of the proxies' steps in a copy of `base`, as a search would train them."""
    from climb.config.load import load_config
    from climb.runtime.executor import make_executor
    from climb.runtime.device import proxy_processes
    from climb.runtime.layout import RunPaths
    from climb.stages.search import experts_feature, mixture_space
    from climb.stages.tokenize import cluster_tokens
    if not run.exists():
        shutil.copytree(base, run, copy_function=shutil.copy2)
    cfg = load_config(config, list(sets) + [f"search.seed={seed}", f"search.experts={fraction}"])
    paths = RunPaths(run)
    paths.search.experts.parent.mkdir(parents=True, exist_ok=True)
    with make_executor(cfg.executor, proxy_processes(cfg.proxy, cfg.executor)) as ex:
        experts_feature(cfg, paths, ex, mixture_space(cfg, cluster_tokens(paths)))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", required=True)
    ap.add_argument("--experts", required=True, help="the run holding the experts, per seed ({seed})")
    ap.add_argument("--measured", required=True, help="the run whose search proxies are scored, per seed")
    ap.add_argument("--train", type=float, default=0.0, help="train experts of this fraction of the steps first")
    ap.add_argument("--base", default="runs/cbench_base")
    ap.add_argument("--config", default="pipelines/bench.toml")
    ap.add_argument("--set", action="append", default=[], dest="sets")
    ap.add_argument("--cross", action="store_true", help="also every seed's experts on every seed's mixtures")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    out = []
    for s in args.seeds:
        run = Path(args.experts.format(seed=s))
        if args.train:
            train_experts(Path(args.base), run, args.config, args.sets, s, args.train)
        r = {"seed": s, **skill(run, Path(args.measured.format(seed=s)))}
        print(f"seed {s}: {r['mixtures']} mixtures, Spearman {r['spearman']:+.3f}, Pearson {r['pearson']:+.3f} "
              f"(ensemble {r['ensemble_range'][0]:.3f}-{r['ensemble_range'][1]:.3f}, "
              f"measured {r['measured_range'][0]:.4f}-{r['measured_range'][1]:.4f})", flush=True)
        out.append(r)
    cross = None
    if args.cross:
        cross = [[skill(Path(args.experts.format(seed=i)), Path(args.measured.format(seed=j)))["spearman"]
                  for j in args.seeds] for i in args.seeds]
        print("Spearman, experts of seed (row) on the measured mixtures of seed (column):")
        print("      " + " ".join(f"{j:>6}" for j in args.seeds))
        for i, row in zip(args.seeds, cross):
            print(f"{i:>6}" + " ".join(f"{v:+6.2f}" for v in row))
    if args.json:
        write_result(Path(args.json), {"train_fraction": args.train or None, "runs": out,
                                       "seeds": args.seeds, "cross_spearman": cross}, indent=1)


if __name__ == "__main__":
    main()
