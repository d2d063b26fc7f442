"""The report's trade-offs between metrics: what each metric alone would pick, against the run's pick.

Where the objective weighs two or more metrics, or the swarm recorded several whose direction
their names say (bpb, a task's acc, acc_norm or gold_loss_per_byte; the training loss aside),
one predictor per metric (climb.optimize.multi, fitted on the search's proxies) predicts every
metric at the run's pick and at the mixture each metric alone prefers among the final pick's
candidates. The run's pick also shows its measured values (the mean of its comparison proxies).
The re-picks under other objectives (`climb repick`, search/repicks/) follow, and, where
matplotlib is installed, the swarm's measured points for the two metrics that pull apart most,
with their Pareto front.
"""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from climb.config import RunConfig
from climb.config.objective import named_goal
from climb.io.files import read_json
from climb.runtime.layout import RunPaths

log = logging.getLogger(__name__)
MAX_METRICS = 6  # columns of the table: the objective's metrics first, then others recorded


def tradeoff_metrics(cfg: RunConfig, ok: list[dict]) -> dict[str, str]:
    """Metric name -> goal for the table: the objective's (with their goals), then the metrics every
    proxy recorded whose name says their direction, up to MAX_METRICS in all."""
    from climb.config.objective import metric_goal
    out = {m: metric_goal(m, cfg.target) for m in cfg.target.objective}
    every = set.intersection(*(set(r["metrics"]) for r in ok)) if ok else set()
    for m in sorted(every - set(out)):
        if len(out) < MAX_METRICS and m != "train_loss" and named_goal(m):
            out[m] = named_goal(m)
    return out


def section(cfg: RunConfig, paths: RunPaths, results: list[dict], out: Path) -> tuple[str, list[str], dict | None]:
    """The report's "Trade-offs between metrics" (Markdown), its figures, and its data for
    summary.json; ("", [], None) where there is one metric and no re-pick."""
    from climb.stages.search.common import ok_sorted
    from climb.stages.search.repick import metric_view, repicks, run_space
    ok = [r for r in ok_sorted(results) if "stopped" not in r]
    metrics = tradeoff_metrics(cfg, ok)
    kept = repicks(paths)
    if len(metrics) < 2 and not kept:
        return "", [], None
    pick = read_json(paths.search.mixture)["weights"]
    view = metric_view(cfg, run_space(cfg, paths), ok, metrics, {"run's pick": pick})
    measured = _measured(paths, list(metrics))
    names = list(metrics)
    lines = ["| mixture (predicted) | " + " | ".join(f"{m} ({g})" for m, g in metrics.items()) + " |",
             "|" + " --- |" * (len(names) + 1)]

    def cell(pred: dict, m: str, meas: dict | None = None) -> str:
        text = "n/a" if pred.get(m) is None else f"{pred[m]:.4f}"
        return text + (f" (measured {meas[m]:.4f})" if meas and meas.get(m) is not None else "")
    ours = view["predicted"]["run's pick"]
    lines.append("| run's pick | " + " | ".join(cell(ours, m, measured) for m in names) + " |")
    lines += [f"| best for {b} | " + " | ".join(cell(v["predicted"], m) for m in names) + " |"
              for b, v in view["best_for"].items()]
    text = ("\n## Trade-offs between metrics\n\nOne predictor per metric, fitted on the search's proxies, predicts "
            "each metric at the run's pick and at the mixture each metric alone prefers among the final pick's "
            "candidates; the run's pick also shows the mean of its comparison proxies (measured).\n\n"
            + "\n".join(lines) + "\n")
    if kept:
        text += "\n" + _repick_table(kept, names) + "\n"
    figs = []
    fig = plot_front(ok, metrics, out)
    if fig:
        figs.append(fig)
        text += "\n![trade-off](pareto.png)\n"
    data = {"metrics": metrics, "run_pick": {"predicted": ours, "measured": measured},
            "best_for": view["best_for"], "repicks": [k["digest"] for k in kept]}
    return text, figs, data


def _measured(paths: RunPaths, metrics: list[str]) -> dict | None:
    """The mean of each metric over the run's pick's comparison proxies (None: none succeeded)."""
    if not paths.search.comparison.exists():
        return None
    recs = [r for k, r in read_json(paths.search.comparison).items()
            if k.startswith("climb/") and r.get("status") == "ok"]
    if not recs:
        return None
    return {m: (float(np.mean(v)) if (v := [r["metrics"][m] for r in recs if r["metrics"].get(m) is not None])
                else None) for m in metrics}


def _repick_table(kept: list[dict], names: list[str]) -> str:
    """The re-picks found under search/repicks/, each metric's predicted value at each (measured
    where `--compare` trained it)."""
    from climb.stages.search.repick import spec_name
    lines = ["Re-picks (`climb repick`; search/repicks/):", "",
             "| objective | " + " | ".join(names) + " | proxies trained |", "|" + " --- |" * (len(names) + 2)]
    for k in kept:
        s = k["spec"]
        terms = spec_name(s)
        pred = k["predicted"]["re-pick"]
        meas = (k.get("comparison") or {}).get("metrics", {}).get("climb", {})
        cells = [("n/a" if pred.get(m) is None else f"{pred[m]:.4f}")
                 + (f" (measured {meas[m]:.4f})" if meas.get(m) is not None else "") for m in names]
        lines.append(f"| {terms}, {s['goal']} | " + " | ".join(cells) + f" | {k.get('trained', 0)} |")
    return "\n".join(lines)


def pulling_apart(ok: list[dict], metrics: dict[str, str]) -> tuple[str, str] | None:
    """The two metrics whose goal-signed values over the swarm correlate least (Spearman below 0:
    what one gains the other loses); None where no pair pulls apart."""
    from scipy.stats import spearmanr

    from climb.optimize.predictor import goal_sign
    names, best = list(metrics), None
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            x = goal_sign(metrics[a]) * np.array([r["metrics"][a] for r in ok], float)
            y = goal_sign(metrics[b]) * np.array([r["metrics"][b] for r in ok], float)
            if np.ptp(x) == 0 or np.ptp(y) == 0:
                continue
            rho = float(spearmanr(x, y)[0])
            if rho < 0 and (best is None or rho < best[0]):
                best = (rho, a, b)
    return best[1:] if best else None


def plot_front(ok: list[dict], metrics: dict[str, str], out: Path) -> str | None:
    """pareto.png: the swarm's measured points on the two metrics that pull apart most, and their
    Pareto front; None where no pair pulls apart, or matplotlib is not installed."""
    pair = pulling_apart(ok, metrics)
    if pair is None:
        return None
    try:
        import matplotlib
    except ImportError:
        log.info("report: matplotlib is not installed; no trade-off plot")
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from climb.optimize.multi import front
    a, b = pair
    P = np.array([[r["metrics"][a], r["metrics"][b]] for r in ok], float)
    idx = front(P, (metrics[a], metrics[b]))
    fig, ax = plt.subplots(figsize=(5.5, 4.5))
    ax.scatter(P[:, 0], P[:, 1], alpha=0.5, label="search proxies (measured)")
    ax.plot(P[idx, 0], P[idx, 1], "k-o", ms=4, label="Pareto front")
    ax.set_xlabel(f"{a} ({metrics[a]})")
    ax.set_ylabel(f"{b} ({metrics[b]})")
    ax.set_title("What one metric gains, the other loses")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "pareto.png", dpi=110)
    plt.close(fig)
    return "pareto.png"
