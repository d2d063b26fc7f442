"""Reuse: a search that starts from an earlier run's evidence when the corpus changed.

A corpus update (a shard added or replaced, `cluster.refit = false`) keeps the clusters, the
tokenizer and the proxies; only the token store changed. With `search.reuse` naming the earlier
run's folder, its finished search (`search/results.jsonl`, `quality.json`, `mixture.json`,
`comparison.json`) enters this search as prior evidence, after a check on the new corpus:

1. `check` (before any proxy trains; climb.runtime.preflight.before and the stage itself):
   refused, with one line naming what differs, where the earlier run has no finished search,
   another tokenizer (the content of tokenize/tokenizer.json), another target (objective, goal,
   weights, target files by what they hold) or other proxies ([proxy] as the search key sees it,
   and search.base). All by content; the earlier search must also be up to date with its own
   config.toml and inputs. Other clusters (centroids, fine-to-cluster plan: `cluster.refit =
   true`, another `cluster.k`) with all else equal are not refused: the earlier run's records
   say nothing of this run's clusters, so its found mixture enters as one fixed component
   instead (`mode` "virtual": climb/stages/search/virtual.py), and the steps below are skipped.
2. `confirm`: a **confirmation round** of `search.iterations[-1]` mixtures the earlier run
   measured: its pick, and records spread over the range of its measured values (evenly spaced
   ranks from best to worst). Each trains on this run's token store with the earlier record's
   seed, as any search proxy (plan saved first in `search/reuse_plan.json`, records appended to
   results.jsonl, iteration 0, ids `reuse-<j>`), and its new value is set against its earlier
   measurement (`agreement`): like against like, so the residual is a difference of two
   measurements, judged against the noise of such a difference (`difference_noise`), and the
   values' spread makes their Spearman mean something. (A predictor's values at its own best
   mixtures would be optimistic, and those mixtures nearly tie: their ranking is noise.)
3. `decide`: **holds**, **drifted** or **fails** (the thresholds and why: there). Holds: the
   earlier records, shifted by the measured bias, join this run's in the predictor and the
   search runs its last iteration alone; drifted: the earlier predictor (search.predictor fitted
   on the earlier records) becomes a feature the predictor fits a line in
   (climb.optimize.experts.ExpertPrior: a slope >= 0 and an intercept, so a shifted, stretched or
   flattened landscape is discounted by the data) and the search runs its last two iterations;
   fails: the normal full search, the earlier records unused.

Where the evidence holds or drifted, the earlier run's replicate seeds stand for this run's (the
same proxies, and a landscape the round found within their noise): none train again; where it
fails, they do. A corpus that only lost documents (a shard removed, the clusters kept: `removed_only`)
has nothing new a proxy could measure, and goes the component way with no search proxy.

The final pick is made over this run's measured mixtures alone, by the run's rule (with the
earlier predictor as a feature where it held or drifted): an earlier measurement is never a
measurement of the new corpus. What happened goes to `search/reuse.json`, quality.json's
`reuse`, the log (a warning where it fell back) and the report.
"""
from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np

from climb.config import RunConfig, digest, without
from climb.io.errors import InputError
from climb.io.files import read_json, write_json
from climb.optimize.predictor import make_predictor
from climb.runtime import results as results_log
from climb.runtime.layout import RunPaths
from climb.stages.search.common import append, ok_sorted, proxy_task, read_results, run_proxies

log = logging.getLogger(__name__)

# The earlier evidence holds where the confirmation round's residuals (new less earlier
# measurement of each mixture, the mean bias removed) spread no more than noise alone would spread
# them but once in HOLD_RESIDUAL_ALPHA**-1 times, and the new values rank as the earlier ones with
# at least HOLD_SPEARMAN.
# - The residual: its variance over the noise of a difference (`difference_noise`) squared is, on
#   an unchanged landscape, an F(n - 1, noise_df) variable: n - 1 degrees of freedom in the round
#   (the bias takes one), noise_df in the earlier run's estimate of the noise (quality.json's
#   `noise_df`; few, from its replicates and comparison). Its 99% point is the bound
#   (`residual_limit`): with many noise df and 4 proxies, 1.94x the noise; with the 6 a small run
#   has, 3.1x, because a noise measured on 6 df is itself often low by a third. So an unchanged
#   landscape holds 99 times in 100, and a reshaping of the differences by a few noise sd does not.
# - The Spearman: the round spans the earlier values from best to worst, so on an unchanged
#   landscape its mixtures stand several noise sd apart and rank as before; 0.5 on 4 allows one
#   neighbouring pair swapped (0.8) but not two.
# - A bias alone is what a corpus update does to every mixture (the windows change) and is removed,
#   as long as it stays within the earlier swarm's spread: a shift larger than the differences the
#   search chose among says the landscape moved more than it can be trusted to have moved evenly.
HOLD_RESIDUAL_ALPHA = 0.01
HOLD_SPEARMAN = 0.5
HOLD_BIAS_SPREAD = 1.0
# Below this Spearman (the new values rank against the earlier ones), the earlier
# evidence points the wrong way and is dropped; from it up to HOLD_SPEARMAN it is a discounted
# feature whose weight the new proxies fit.
DRIFT_SPEARMAN = 0.0
# Fewer successful confirmation proxies than this cannot judge a ranking: the search starts over.
MIN_CONFIRMED = 3
CONFIRMATION = "reuse-"  # mixture ids of the confirmation round
# What reuse reads of the earlier search (comparison.json: its pick's measurement, where the pick
# was not among its search's proxies).
EVIDENCE = ("results.jsonl", "quality.json", "mixture.json", "comparison.json")
SAME_L1 = 1e-9  # weights this close (L1) are the same mixture: an earlier measurement applies


# ----------------------------------------------------------------- the earlier run, and refusals
def earlier(cfg: RunConfig) -> RunPaths:
    """The earlier run's folder (search.reuse), its search finished and intact."""
    where = cfg.search.reuse
    ep = RunPaths(Path(where).resolve())
    m = ep.manifest("search")
    if not m.exists() or not all((ep.search.dir / f).exists() for f in EVIDENCE):
        raise InputError(f"search.reuse {where}: no finished search there ({m} or its results are missing); "
                         "name the run folder of a search that finished")
    from climb.runtime.stage import damaged_outputs
    bad = [f for f in damaged_outputs(ep, "search") if f in EVIDENCE or f == "manifest.json"]
    if bad:
        raise InputError(f"search.reuse {where}: its search/{bad[0]} changed since that search finished; reuse "
                         f"needs it as it finished (run `climb search --run {where}` to repair it)")
    return ep


def evidence_key(cfg: RunConfig) -> str:
    """What the search key takes from the earlier run: its results, noise and pick by content."""
    from climb.runtime.stage import output_digest
    ep = earlier(cfg)
    return digest([output_digest(ep, "search", f) for f in EVIDENCE])


def check(cfg: RunConfig, paths: RunPaths, key) -> None:
    """Refuse, in one line naming what differs, an earlier run whose evidence is not of this run's
    clusters, tokenizer, target and proxies; nothing is trained. `key`: the search stage's key
    (climb.stages.search.key, passed in: the stage imports this room, not the other way round)."""
    from climb.config import ConfigError, load_config
    where = cfg.search.reuse
    if not where:
        return
    if Path(where).resolve() == paths.root.resolve():
        raise InputError(f"search.reuse {where} is this run's own folder, whose search this one replaces; copy the "
                         f"earlier run first (cp -r {where} {where}-before) and name the copy")
    ep = earlier(cfg)
    try:
        ecfg = load_config(ep.config)
    except (OSError, ConfigError) as e:
        raise InputError(f"search.reuse {where}: its config.toml cannot be read ({e})") from None
    manifest = read_json(ep.manifest("search"))
    try:
        current = key(ecfg, ep)
    except (InputError, FileNotFoundError) as e:
        raise InputError(f"search.reuse {where}: its search cannot be checked against its inputs ({e})") from None
    if manifest.get("key", manifest.get("hash")) != current:
        raise InputError(f"search.reuse {where}: its search is not up to date with its config.toml and inputs (its "
                         f"token store, target files or settings changed since it ran); run `climb search --run "
                         f"{where}` first, or name another run")
    refit = _clustering(ep, paths) is not None
    differs = _tokenizer(ep, paths, refit) or _target(ecfg, ep, cfg, paths) or _proxies(ecfg, cfg)
    if differs:
        raise InputError(f"search.reuse {where}: {differs}")
    if refit and cfg.search.candidates:
        raise InputError(f"search.reuse {where}: its clusters are not this run's, so the search chooses among its "
                         "found mixture and this run's new clusters, not among search.candidates; unset one of them")


def mode(ep: RunPaths, paths: RunPaths) -> str:
    """"same": the earlier run's clusters are this run's and the corpus gained documents (its evidence
    is checked by a confirmation round); "virtual": the clusters are not the same, or the corpus only
    lost documents (its found mixture enters as one fixed component, climb/stages/search/virtual.py;
    with nothing new to choose, no search proxy trains and the pick is that component)."""
    return "same" if same_clusters(ep, paths) and not removed_only(ep, paths) else "virtual"


def same_clusters(ep: RunPaths, paths: RunPaths) -> bool:
    """Whether the earlier run's clusters (centroids, fine-to-cluster plan) are this run's."""
    return _clustering(ep, paths) is None


def removed_only(ep: RunPaths, paths: RunPaths) -> bool:
    """Whether this run's corpus is the earlier run's less some documents: every shard here is a
    shard there, holding none of whose documents the earlier one did not (ids in the token stores'
    assignments), and something is gone. Nothing was added that a proxy could measure."""
    from climb.stages.search.virtual import _ids
    here, there = paths.shards(), set(ep.shards())
    if not here or not set(here) <= there:
        return False
    fewer = len(here) < len(there)
    for shard in here:
        ids, old = set(_ids(paths, shard).tolist()), set(_ids(ep, shard).tolist())
        if not ids <= old:
            return False
        fewer = fewer or len(ids) < len(old)
    return fewer


def earlier_search_key(cfg: RunConfig) -> str:
    """The earlier search's own key (its manifest): what its clusters, token store and settings were
    when it ran. A component read through its documents depends on them beside its found mixture;
    `check` refuses an earlier search whose inputs changed since."""
    m = read_json(earlier(cfg).manifest("search"))
    return str(m.get("key", m.get("hash")))


def _clustering(ep: RunPaths, paths: RunPaths) -> str | None:
    from climb.io.digests import file_digest
    ka, kb = ep.n_clusters(), paths.n_clusters()
    if ka != kb:
        return (f"it has {ka} clusters, this run {kb}; reuse needs the same clusters (cluster.refit = false keeps "
                "them when the corpus changes)")

    def plan(p: RunPaths):
        f = read_json(p.cluster.fitted) if p.cluster.fitted.exists() else {}
        return f.get("fine_to"), f.get("prune")
    if file_digest(ep.cluster.centroids) != file_digest(paths.cluster.centroids) or plan(ep) != plan(paths):
        return ("its clusters were fitted apart from this run's (other centroids or another fine-to-cluster plan); "
                "reuse needs the same clusters (cluster.refit = false keeps them when the corpus changes)")
    return None


def _tokenizer(ep: RunPaths, paths: RunPaths, refit: bool = False) -> str | None:
    from climb.io.digests import file_digest
    if file_digest(ep.tokenize.tokenizer) != file_digest(paths.tokenize.tokenizer):
        # Clusters fitted again tokenise the corpus again, with a tokenizer trained again unless one is named.
        hint = (f"; other clusters tokenise the corpus again: name its {ep.tokenize.tokenizer} in proxy.tokenizer"
                if refit else "")
        return ("its proxies' tokenizer (tokenize/tokenizer.json) holds other tokens than this run's; reuse needs "
                f"the same tokenizer (proxy.tokenizer, proxy.vocab_size, proxy.tokenizer_docs){hint}")
    return None


def _target(ecfg: RunConfig, ep: RunPaths, cfg: RunConfig, paths: RunPaths) -> str | None:
    from climb.runtime.targets import target_files
    a, b = ecfg.target, cfg.target
    # Paths are not compared (a target copied elsewhere is the same target); what they hold is, below.
    # The contamination check reads the target but changes no proxy's score.
    skip = ("texts", "tasks", "lm_eval_include", "contamination", "decontaminate")
    ka, kb = without(a, *skip), without(b, *skip)
    ka["tasks"], kb["tasks"] = sorted(a.tasks), sorted(b.tasks)
    for name in ("objective", "goal", "weights", "goals", *sorted(ka.keys() | kb.keys())):
        if ka.get(name) != kb.get(name):
            return (f"its target.{name} was {ka.get(name)!r}, this run's is {kb.get(name)!r}; reuse needs the "
                    "same target")
    fa = [f[1:] for f in target_files(a, ep.root, ep.digests)]
    fb = [f[1:] for f in target_files(b, paths.root, paths.digests)]
    if fa != fb:
        return "its target files hold other content than this run's; reuse needs the same target"
    return None


def _proxies(ecfg: RunConfig, cfg: RunConfig) -> str | None:
    # As the search key sees them; the tokenizer settings are compared by the tokenizer itself.
    skip = ("timeout_s", "curve_points", "curve_evals", "tokenizer", "tokenizer_docs")

    def seen(c: RunConfig) -> dict:
        return {**{f"proxy.{k}": v for k, v in without(c.proxy, *skip).items()}, "search.base": c.search.base}
    a, b = seen(ecfg), seen(cfg)
    if a == b:
        return None
    shape = ("proxy.n_layer", "proxy.n_embd")
    if any(a[s] != b[s] for s in shape):
        return (f"its proxies were {a['proxy.n_layer']} layers x {a['proxy.n_embd']}, this run's are "
                f"{b['proxy.n_layer']} x {b['proxy.n_embd']}; reuse needs the same proxies")
    names = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    return (f"its proxies differ from this run's in {', '.join(names)} ({names[0]} {a.get(names[0])!r} there, "
            f"{b.get(names[0])!r} here); reuse needs the same proxies")


# ----------------------------------------------------------------- the check on the new corpus
class EarlierFeature:
    """The earlier run's predictor as a function of mixtures (a feature ExpertPrior fits a line in)."""

    def __init__(self, model):
        self.model = model

    def __call__(self, W) -> np.ndarray:
        return np.asarray(self.model.predict(np.atleast_2d(np.asarray(W, float))), float)


def earlier_records(ep: RunPaths) -> list[dict]:
    """The earlier search's successful proxies trained to the end (a proxy stopped at a rung holds
    a predicted value)."""
    return [r for r in ok_sorted(read_results(ep)) if "stopped" not in r and r.get("objective") is not None
            and math.isfinite(r["objective"])]


def difference_noise(quality: dict) -> float | None:
    """The sd of one mixture's measurement on this corpus less its measurement on the earlier one,
    where the corpus change alone moves it: sqrt(2) x the earlier run's `paired_sd`.

    `paired_sd` (climb.optimize.quality.noise) is the sd of ONE proxy's mixture x seed interaction:
    the part of its seed noise that does not cancel between mixtures trained with the same seed. It
    is not yet a difference. A confirmation proxy repeats an earlier measurement with the earlier
    seed on the new token store, and its residual (new less old, the mean bias removed) is a
    difference of two such measurements: their common seed effect (`seed_sd`'s remainder) is shared
    by every mixture of the round, so the bias takes it away, and what is left is two interactions,
    sqrt(2) x paired_sd where the new windows make the new interaction independent of the old (less
    where the data barely changed, none where it did not: same seed and same data give the same
    proxy). sqrt(2) x `seed_sd` would count the common seed effect the bias has removed, and so let
    a larger drift pass as noise."""
    p = quality.get("paired_sd")
    return None if p is None or not math.isfinite(p) else math.sqrt(2.0) * p


def agreement(expected, measured) -> dict:
    """How the confirmation round's measured values meet the earlier run's measurements of the same
    mixtures: Spearman, the mean bias (new - earlier) and the residuals' sd once it is removed."""
    from scipy.stats import spearmanr

    from climb.optimize.predictor import is_constant
    p, m = np.asarray(expected, float), np.asarray(measured, float)
    r = m - p
    rho = None if len(m) < 2 or is_constant(p) or is_constant(m) else float(spearmanr(p, m).statistic)
    return {"n": int(len(m)), "spearman": rho, "bias": float(r.mean()) if len(r) else None,
            "residual_sd": float(np.std(r - r.mean(), ddof=1)) if len(r) > 1 else None}


def residual_limit(noise: float, n: int, noise_df: int | None) -> float:
    """The residual sd that noise alone exceeds with chance HOLD_RESIDUAL_ALPHA, for n confirmation
    proxies and a noise of a difference estimated on noise_df degrees of freedom (None: known)."""
    from scipy.stats import chi2, f
    q = (f.ppf(1 - HOLD_RESIDUAL_ALPHA, n - 1, noise_df) if noise_df else
         chi2.ppf(1 - HOLD_RESIDUAL_ALPHA, n - 1) / (n - 1))
    return float(noise * math.sqrt(q))


def decide(fit: dict, noise: float | None, spread: float | None, noise_df: int | None = None) -> tuple[str, str]:
    """("holds" | "drifted" | "fails", why) from `agreement`'s figures, the noise of a difference
    (`difference_noise`) and the degrees of freedom it was measured on, and the earlier swarm's
    spread (the thresholds: this module's constants)."""
    rho, bias, sd = fit["spearman"], fit["bias"], fit["residual_sd"]
    if fit["n"] < MIN_CONFIRMED or rho is None:
        return "fails", f"{fit['n']} confirmation proxies measured with a spread, {MIN_CONFIRMED} needed to judge"
    if rho < DRIFT_SPEARMAN:
        return "fails", f"the new values rank against the earlier ones (Spearman {rho:.2f})"
    limit = residual_limit(noise, fit["n"], noise_df) if noise else None
    holds = [rho >= HOLD_SPEARMAN, limit is not None and sd <= limit,
             spread is None or abs(bias) <= HOLD_BIAS_SPREAD * spread]
    bound = f"{limit:.4g} (noise alone passes it {HOLD_RESIDUAL_ALPHA:.0%} of the time)" if limit else ""
    if all(holds):
        return "holds", f"residual sd {sd:.4g} within {bound}, Spearman {rho:.2f}"
    why = [f"Spearman {rho:.2f} < {HOLD_SPEARMAN:g}"] if not holds[0] else []
    if not holds[1]:
        why.append("the earlier run measured no paired noise" if not noise else
                   f"residual sd {sd:.4g} > {bound}")
    if not holds[2]:
        why.append(f"bias {bias:+.4g} beyond the earlier swarm's spread {spread:.4g}")
    return "drifted", "; ".join(why)


def _in_space(w, space: dict, min_weight: float) -> np.ndarray:
    """A mixture of the earlier run put inside this run's space (usable clusters, epoch caps)."""
    from climb.optimize.pick import project
    w = np.where(space["usable"], np.asarray(w, float), 0.0)
    w = w / w.sum()
    if (w > space["max_weight"] + 1e-9).any():
        w = project(w, space["max_weight"], min_weight)
    return w


def _same(a, b) -> bool:
    return float(np.abs(np.asarray(a, float) - np.asarray(b, float)).sum()) < SAME_L1


def _pick_measured(ep: RunPaths, old: list[dict], pick) -> dict | None:
    """The earlier run's measurement of its own pick: its search record (search.final "seen" or
    "measured-predicted" pick a measured mixture), else its first comparison seed's."""
    for r in old:
        if _same(r["weights"], pick):
            return r
    if not ep.search.comparison.exists():
        return None
    runs = read_json(ep.search.comparison)
    for k in sorted((k for k in runs if k.startswith("climb/")), key=lambda k: int(k.split("/", 1)[1])):
        r = runs[k]
        if r.get("status") == "ok" and r.get("objective") is not None and math.isfinite(r["objective"]):
            return r
    return None


def spread_over_values(records: list[dict], n: int, goal: str) -> list[dict]:
    """n of the earlier measured records spread over the range of their measured values: sorted
    from best to worst (mixture id breaking ties), those at the evenly spaced ranks j (N-1)/n,
    j = 1..n (the best itself left out: the earlier pick stands for it); all of them where N <= n.
    A fixed rule, so the round is the same on every resume and for every search.seed."""
    from climb.optimize.predictor import goal_sign
    ranked = sorted(records, key=lambda r: (goal_sign(goal) * r["objective"], r["mixture_id"]))
    if len(ranked) <= n:
        return ranked
    at = np.floor(np.linspace(0, len(ranked) - 1, n + 1)[1:] + 0.5).astype(int)
    return [ranked[i] for i in at]


def confirmation_plan(cfg: RunConfig, paths: RunPaths, space: dict, ep: RunPaths, old: list[dict]) -> dict:
    """The confirmation round (saved, so a resumed search trains the same mixtures): mixtures the
    earlier run measured, each with the earlier seed and the earlier value it is expected to repeat.

    The earlier pick first (its expected value is its earlier measurement: `_pick_measured`; none
    where it was never measured at weights this run can train), then `search.iterations[-1] - 1`
    of the earlier records spread over the range of their measured values (`spread_over_values`),
    among those this run's space trains as they were (no cluster gone unusable, no epoch cap
    newly exceeded) and apart from the pick. Each is set against a measurement, not a prediction:
    a prediction at the earlier optimum is optimistic, and mixtures near it nearly tie."""
    if paths.search.reuse_plan.exists():
        return read_json(paths.search.reuse_plan)
    search_cfg = cfg.search
    n = search_cfg.iterations[-1]
    pick = read_json(ep.search.mixture)["weights"]
    first = _in_space(pick, space, search_cfg.min_weight)
    seen = _pick_measured(ep, old, pick) if _same(first, pick) else None
    # The measured weights to the bit (the pick's were normalised again), the seed they had.
    rows = [(seen["weights"] if seen else first, seen["seed"] if seen else search_cfg.seed, seen)]
    kept = [r for r in old if not _same(r["weights"], pick)
            and _same(_in_space(r["weights"], space, search_cfg.min_weight), r["weights"])]
    rows += [(np.asarray(r["weights"], float), r["seed"], r)
             for r in spread_over_values(kept, n - 1, cfg.target.goal)] if n > 1 else []
    plan = {"mixtures": [{"mixture_id": f"{CONFIRMATION}{j:03d}", "weights": np.asarray(w, float).tolist(),
                          "seed": int(seed), "earlier": r["mixture_id"] if r else None,
                          "expected": float(r["objective"]) if r else None}
                         for j, (w, seed, r) in enumerate(rows)]}
    write_json(paths.search.reuse_plan, plan)
    return plan


def confirm(cfg: RunConfig, paths: RunPaths, ex, space: dict, base: str = "") -> dict:
    """Train the confirmation round, decide, and say what the search does next.

    Returns `start` (the first iteration the search runs), `evidence` (records that join this
    run's in the predictor of its iterations: the earlier ones shifted by the bias where the
    evidence holds), `plan_prior` (the feature its iterations' predictor fits a line in, where
    the evidence drifted), `pick_prior` (the feature of the final pick) and `summary`."""
    search_cfg = cfg.search
    ep = earlier(cfg)
    old = earlier_records(ep)
    if len(old) < 2:
        raise InputError(f"search.reuse {search_cfg.reuse}: its search holds {len(old)} successful proxies; a "
                         "predictor needs at least 2")
    plan = confirmation_plan(cfg, paths, space, ep, old)
    done = {(r["mixture_id"], r["seed"]) for r in read_results(paths)
            if not results_log.retry(r, search_cfg.retry_failed)}
    todo = [m for m in plan["mixtures"] if (m["mixture_id"], m["seed"]) not in done]
    if todo:
        log.info("search.reuse %s: confirmation round, %d proxies (%d already done)", search_cfg.reuse, len(todo),
                 len(plan["mixtures"]) - len(todo))
        run_proxies(cfg, ex, [proxy_task(cfg, paths, m["mixture_id"], 0, m["weights"], m["seed"], base=base)
                              for m in todo], "confirmation round", lambda i, rec: append(paths, rec))
    measured = {r["mixture_id"]: r["objective"] for r in ok_sorted(read_results(paths))}
    pairs = [(m["expected"], measured[m["mixture_id"]]) for m in plan["mixtures"]
             if m["expected"] is not None and m["mixture_id"] in measured]
    fit = agreement([e for e, _ in pairs], [v for _, v in pairs])
    quality = read_json(ep.search.quality)
    noise = difference_noise(quality)
    noise_df = quality.get("noise_df")
    decision, why = decide(fit, noise, quality.get("swarm_sd"), noise_df)
    t = len(search_cfg.iterations)
    start = {"holds": t - 1, "drifted": max(0, t - 2), "fails": 0}[decision]
    summary = {"earlier": search_cfg.reuse, "mode": "same", "decision": decision, "why": why, **fit, "noise": noise,
               "paired_sd": quality.get("paired_sd"), "noise_df": noise_df,
               "residual_limit": residual_limit(noise, fit["n"], noise_df) if noise and fit["n"] > 1 else None,
               "confirmation_proxies": len(plan["mixtures"]),
               "replicates_inherited": bool(decision != "fails" and quality.get("replicates")),
               "earlier_proxies": len(old), "iterations_run": list(range(start + 1, t + 1)),
               "thresholds": {"residual_alpha": HOLD_RESIDUAL_ALPHA, "spearman": HOLD_SPEARMAN,
                              "bias_spread": HOLD_BIAS_SPREAD, "drift_spearman": DRIFT_SPEARMAN}}
    write_json(paths.search.reuse, summary)
    (log.warning if decision != "holds" else log.info)("%s", sentence(summary))
    feature = None
    if decision != "fails":
        X, y = np.array([r["weights"] for r in old]), np.array([r["objective"] for r in old])
        feature = EarlierFeature(make_predictor(search_cfg.predictor, seed=search_cfg.seed).fit(X, y))
    evidence = []
    if decision == "holds":
        evidence = [{"mixture_id": f"earlier:{r['mixture_id']}", "iteration": -1, "status": "ok",
                     "weights": r["weights"], "objective": r["objective"] + fit["bias"]} for r in old]
    # Seed noise is the proxies' (the same [proxy], tokenizer and target, which `check` holds to), and the
    # round just found the earlier landscape within it: where the evidence holds or drifted, the earlier
    # run's replicate seeds stand for this run's, and none train again. Where it fails they do.
    inherited = quality.get("replicates") if decision != "fails" else None
    return {"start": start, "evidence": evidence, "plan_prior": feature if decision == "drifted" else None,
            "pick_prior": feature, "summary": summary, "replicates": inherited or None}


def sentence(s: dict) -> str:
    """What reuse did, in one line (the log, the report)."""
    if s.get("mode") == "virtual":
        from climb.stages.search.virtual import sentence as across_clusters
        return across_clusters(s)

    def f(v, spec=".4g"):
        return "n/a" if v is None else format(v, spec)
    figures = (f"{s['confirmation_proxies']} confirmation proxies repeating its measurements: Spearman "
               f"{f(s['spearman'], '.2f')}, bias {f(s['bias'], '+.4g')}, residual sd {f(s['residual_sd'])} "
               f"(noise of a difference {f(s['noise'])}, the residual's bound {f(s.get('residual_limit'))})")
    its = s["iterations_run"]
    then = {"holds": f"its evidence holds, shifted by the bias; the search ran iteration {its[0]} alone",
            "drifted": f"it drifted ({s['why']}): its predictor entered as a discounted feature and the search ran "
                       f"iterations {', '.join(map(str, its))}",
            "fails": f"it fails ({s['why']}): the search ran in full, the earlier records unused"}[s["decision"]]
    reps = "; its replicate seeds stand for this run's" if s.get("replicates_inherited") else ""
    return f"search.reuse {s['earlier']}: {figures}; {then}{reps}"
