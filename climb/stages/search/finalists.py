"""Finalists measured again (`search.finalists`): the last iteration spent on the pick itself.

At the end of a search the best few measured mixtures usually lie within a proxy's seed noise of
each other, each measured once, on the search's one seed. Taking the best of them takes the
luckiest draw of that noise: on the demo's target arm (docs/benchmarks/steady-answer.md) the top
five of a run lay within 0.005 bpb while a proxy's paired noise was 0.001-0.013, and the pick's
re-measured value moved by 0.007 from its search value. Averaging those mixtures did not help.

With `search.finalists = N`, the last iteration trains no new mixture. Its `iterations[-1]`
proxies go to the N measured mixtures the predictor (fitted on everything measured so far, as the
last iteration's would be) rates best, each trained again on `iterations[-1] // N` further seeds,
the same seeds for every finalist (seed + 1 + replicate_seeds, ...: neither the search's, the
replicates' nor the comparison's). Every search proxy of a run shares the search's seed, so all
of a finalist's measurements are paired with every other finalist's: the part of the noise a seed
gives every mixture cancels in the comparison, and the pick is the finalist with the best mean over
its seeds. The plan is saved before any of its proxies trains, and the records proxy by proxy, in
`search/finalists.json`, so a killed search resumes to the same pick.
"""
from __future__ import annotations

import numpy as np

from climb.config import RunConfig
from climb.io.files import read_json, write_json
from climb.optimize.predictor import goal_sign
from climb.runtime import results as results_log
from climb.runtime.layout import RunPaths
from climb.stages.search.common import ok_sorted, proxy_task, run_proxies


def seeds(cfg: RunConfig) -> list[int]:
    """The further seeds each finalist trains on (after the search's and the replicates')."""
    s = cfg.search
    return [s.seed + 1 + s.replicate_seeds + j for j in range(s.iterations[-1] // s.finalists)]


def _finished(results: list[dict]) -> list[dict]:
    """The successful proxies trained to the end (a proxy stopped at a rung holds a prediction)."""
    return [r for r in ok_sorted(results) if "stopped" not in r]


def _model(cfg: RunConfig, recs: list[dict], prior=None):
    """The search's predictor fitted on `recs`, as the last iteration's would be."""
    from dataclasses import replace

    from climb.optimize.strategy import _fit, from_search_config
    X, y = np.array([r["weights"] for r in recs]), np.array([r["objective"] for r in recs])
    return _fit(replace(from_search_config(cfg.search), prior=prior), X, y, cfg.search.seed)


def choose(cfg: RunConfig, results: list[dict], prior=None, bounds=None) -> list[dict]:
    """The N distinct measured mixtures (trained to the end) the predictor rates best, ties by id."""
    from climb.optimize.strategy import _holding
    ok = _finished(results)
    first: dict[str, dict] = {}
    for r in ok:
        first.setdefault(r["mixture_id"], r)
    recs = list(first.values())
    X = np.array([r["weights"] for r in recs])
    y = np.array([r["objective"] for r in recs])
    if bounds is not None and not isinstance(bounds, tuple):  # a team's bounds: finalists hold them
        keep = _holding(X, y, X, bounds)[0]
        recs = [r for r in recs if any(np.array_equal(r["weights"], k) for k in keep)]
        X, y = np.array([r["weights"] for r in recs]), np.array([r["objective"] for r in recs])
    model = _model(cfg, recs, prior)
    order = np.lexsort(([r["mixture_id"] for r in recs], goal_sign(cfg.target.goal) * model.predict(X)))
    return [{"mixture_id": recs[i]["mixture_id"], "weights": recs[i]["weights"], "objective": recs[i]["objective"]}
            for i in order[: cfg.search.finalists]]


def run(cfg: RunConfig, paths: RunPaths, ex, results: list[dict], prior=None, bounds=None, base: str = "") -> dict:
    """Choose the finalists (or read the saved choice), train what is missing, and return the
    saved file's content: {"finalists", "seeds", "records": {"<id>/<seed>": record}}."""
    f = paths.search.finalists
    state = read_json(f) if f.exists() else None
    if state is None:
        state = {"finalists": choose(cfg, results, prior, bounds), "seeds": seeds(cfg), "records": {}}
        write_json(f, state)
    todo = [(m, s) for m in state["finalists"] for s in state["seeds"]
            if results_log.retry(state["records"].get(f"{m['mixture_id']}/{s}"), cfg.search.retry_failed)]
    it = len(cfg.search.iterations) - 1
    tasks = [proxy_task(cfg, paths, f"{m['mixture_id']}-final{s}", it, m["weights"], s, base=base) for m, s in todo]

    def keep(i: int, rec: dict) -> None:
        m, s = todo[i]
        state["records"][f"{m['mixture_id']}/{s}"] = rec
        write_json(f, state)
    if tasks:
        run_proxies(cfg, ex, tasks, "finalists", keep)
    return state


def table(cfg: RunConfig, state: dict) -> list[dict]:
    """Each finalist's measurements (the search's seed first) and their mean, in the order chosen;
    a seed on which any finalist failed is left out of every mean, so the means stay paired."""
    seeds_ok = [s for s in state["seeds"]
                if all((state["records"].get(f"{m['mixture_id']}/{s}") or {}).get("status") == "ok"
                       and state["records"][f"{m['mixture_id']}/{s}"].get("objective") is not None
                       for m in state["finalists"])]
    rows = []
    for m in state["finalists"]:
        vals = [m["objective"]] + [state["records"][f"{m['mixture_id']}/{s}"]["objective"] for s in seeds_ok]
        rows.append({"mixture_id": m["mixture_id"], "weights": m["weights"], "values": vals,
                     "mean": float(np.mean(vals))})
    return rows


def predicted(cfg: RunConfig, results: list[dict], w, prior=None) -> float:
    """The predictor's value at the pick (fitted on every mixture the search measured)."""
    model = _model(cfg, _finished(results), prior)
    return float(model.predict(np.asarray(w, float)[None])[0])


def pick(cfg: RunConfig, state: dict) -> tuple[dict, list[dict]]:
    """(the finalist with the best mean, every finalist's row)."""
    rows = table(cfg, state)
    s = goal_sign(cfg.target.goal)
    return min(rows, key=lambda r: (s * r["mean"], r["mixture_id"])), rows
