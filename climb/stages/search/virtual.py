"""Reuse across other clusters: the earlier run's found mixture as one fixed component.

A corpus update that changes the clusters (`cluster.refit = true`, another `cluster.k`; most
often a source added that forms clusters of its own) leaves the earlier run's records over
clusters this run does not have: neither its proxies' values nor its predictor say anything
about a mixture of the new clusters. Its answer still does, read through the documents: the
earlier found mixture draws a share of its tokens from each document, and those documents are
still in the corpus, now in this run's clusters. So (Olmix's "mixture reuse", arXiv 2602.12237)
that mixture enters this search as ONE fixed component, a mixture v over this run's clusters, and
the search runs over v and the clusters that are new. `search.reuse` names the earlier run as for
a corpus update under the same clusters (climb/stages/search/reuse.py); `reuse.check` tells the two
apart, and refuses another tokenizer, target or proxies in both.

1. `earlier_component` (before any proxy trains; saved in `search/reuse_plan.json`, so a resumed
   search reads the same component): documents are matched by id, per shard, between the
   earlier run's token store and this one's (`load_assignments`, `store_documents`). A document
   d of earlier cluster c holds w_old[c] x tokens(d) / (tokens of c among the documents still
   present) of the earlier mixture: each cluster's weight spread over its documents by their
   tokens, as a proxy reads a cluster. v_j is the sum over the documents now in cluster j.
   Documents of shards (or sources) gone from the corpus carry nothing; an earlier cluster none of
   whose documents is left loses its weight and v is renormalised. `removed_share` says how much
   of the earlier mixture lay on the documents gone. A cluster of this run is **new** where at
   least NEW_SHARE of its tokens come from documents the earlier run did not hold. v is then put
   inside this run's space (usable clusters, epoch caps, min_weight, search.bounds, kl_max).
2. `component_pool`: the candidates are w = a_0 v + sum_j a_j e_j over the new clusters j, the
   coefficients a drawn from a Dirichlet on the simplex of 1 + len(new) components around their
   natural shares (search.temperature, search.concentrations, as the ordinary pool draws around
   the clusters'), v alone first and the other corners last, duplicates dropped (`expand` gives
   the cluster weights of a). Each is brought inside the bounds (epoch caps, min_weight,
   search.bounds, kl_max: climb/optimize/bounds.py) along its segment to v, which holds them, so
   it stays a mixture of the component and the new clusters (`toward`). With
   `search.reuse_sharpen` = G > 1 (4 by default; 0 keeps the component as found), every other
   draw uses the component raised to a power in [1, G] and renormalised (`sharpened`), and the component sharpened alone to SHARPENED_ALONE
   powers up to G follows v at the head of the pool: a frozen component keeps the earlier blend
   of its own clusters, where refitted clusters may want more weight on its heaviest ones.
3. The search (climb.stages.search) proposes and picks from that pool alone, as it does from a
   fixed candidate set, over `search.iterations[-2:]` (8 then 4 with the default 8, 8, 8, 4), its
   first round starting with v. The earlier search already chose among the old clusters; what
   is left to choose is how much of the new ones to add, a space of 1 + len(new) dimensions, not
   one of k. With no new cluster (a shard removed, or a refit that made nothing new) nothing is
   left to choose: no search proxy trains, the pick is v, and the comparison with the baselines
   runs as in any search.

What happened goes to `search/reuse.json` and quality.json's `reuse` (`"mode": "virtual"`: the
component's weights, the new clusters, removed_share, the proxies trained) and one line for the
log and the report (`sentence`).
"""
from __future__ import annotations

import logging

import numpy as np

from climb.config import RunConfig
from climb.io.errors import InputError
from climb.io.files import read_json, write_json
from climb.runtime.layout import RunPaths

log = logging.getLogger(__name__)

# A cluster of this run is new where at least this share of its tokens come from documents the
# earlier run's token store did not hold: it is more the added data than the earlier corpus regrouped.
NEW_SHARE = 0.5
# Candidates the component pool draws per component: its space has 1 + len(new) dimensions, not k,
# and rows closer than 1e-3 (L1) are duplicates, so a few thousand per dimension cover it.
POOL_PER_COMPONENT = 2000
VIRTUAL = "virtual"
# With search.reuse_sharpen = G: the component sharpened to these many powers in (1, G], alone (no new
# cluster), follow v at the head of the pool.
SHARPENED_ALONE = 3


# ----------------------------------------------------------------- the component
def _ids(paths: RunPaths, shard: str) -> np.ndarray:
    from climb.stages.cluster import load_assignments
    return np.asarray(load_assignments(paths, shard)["id"].to_pylist(), dtype=object)


def _documents(paths: RunPaths, shard: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids, cluster, tokens) of a shard's documents in the run's token store, corpus order."""
    from climb.stages.search.sources import store_documents
    clusters, tokens = store_documents(paths, shard)
    ids = _ids(paths, shard)
    kept = clusters >= 0
    return ids[kept], clusters[kept], tokens[kept]


def earlier_component(cfg: RunConfig, paths: RunPaths, ep: RunPaths, space: dict | None = None) -> dict:
    """The earlier run's found mixture over THIS run's clusters, through the documents both hold.

    Returns {"weights": v inside this run's space (sums to 1), "from_documents": v as the documents
    give it, before the space, "new_clusters": this run's usable clusters at least NEW_SHARE of whose
    tokens come from documents the earlier run did not hold, "removed_share": the earlier mixture's
    weight on documents gone, "lost_clusters": earlier clusters none of whose documents is left
    (their weight renormalised away), "matched_docs": documents in both token stores,
    "earlier_clusters", "clusters", "new_token_share": each cluster's share of tokens from documents
    the earlier run did not hold}. `space`: the search's mixture space (None: built as the search
    builds it)."""
    from climb.stages.search.common import run_space
    if space is None:
        space = run_space(cfg, paths)
    w_old = np.asarray(read_json(ep.search.mixture)["weights"], float)
    k_old, k = ep.n_clusters(), len(space["natural"])
    if len(w_old) != k_old:
        raise InputError(f"search.reuse {cfg.search.reuse}: its mixture.json has {len(w_old)} weights for its "
                         f"{k_old} clusters; run `climb search --run {cfg.search.reuse}` to repair it")
    from climb.stages.search.sources import store_documents
    held_old = np.zeros(k_old)  # each earlier cluster's tokens in the earlier store, shards gone included
    for shard in ep.shards():
        c, t = store_documents(ep, shard)
        held_old += np.bincount(c[c >= 0], weights=t[c >= 0], minlength=k_old)[:k_old]
    match_old, match_new, match_tokens = [], [], []
    total_new, unheld_new = np.zeros(k), np.zeros(k)
    before = set(ep.shards())
    for shard in paths.shards():  # one shard of each run in memory at a time
        ids, c, t = _documents(paths, shard)
        total_new += np.bincount(c, weights=t, minlength=k)[:k]
        if shard not in before:
            unheld_new += np.bincount(c, weights=t, minlength=k)[:k]
            continue
        ids_old, c_old, t_old = _documents(ep, shard)
        _, i_old, i_new = np.intersect1d(ids_old, ids, assume_unique=False, return_indices=True)
        match_old.append(c_old[i_old])
        match_new.append(c[i_new])
        match_tokens.append(t_old[i_old])
        unheld = np.ones(len(ids), bool)
        unheld[i_new] = False
        unheld_new += np.bincount(c[unheld], weights=t[unheld], minlength=k)[:k]
    c_old = np.concatenate(match_old) if match_old else np.zeros(0, np.int64)
    c_new = np.concatenate(match_new) if match_new else np.zeros(0, np.int64)
    t_old = np.concatenate(match_tokens).astype(float) if match_tokens else np.zeros(0)
    present = np.bincount(c_old, weights=t_old, minlength=k_old)[:k_old]  # tokens still present
    share = np.divide(w_old, present, out=np.zeros(k_old), where=present > 0)
    v = np.bincount(c_new, weights=share[c_old] * t_old, minlength=k)[:k]
    if v.sum() <= 0:
        raise InputError(f"search.reuse {cfg.search.reuse}: none of the documents its found mixture draws on is in "
                         "this run's token store (matched by id within each shard); name a run of this corpus")
    v = v / v.sum()
    gone = np.divide(held_old - present, held_old, out=np.zeros(k_old), where=held_old > 0)
    lost = [int(c) for c in np.flatnonzero((present <= 0) & (w_old > 0))]
    frac = np.divide(unheld_new, total_new, out=np.zeros(k), where=total_new > 0)
    new = [int(j) for j in np.flatnonzero((frac >= NEW_SHARE) & (total_new > 0) & space["usable"])]
    return {"weights": inside(v, space, cfg.search.min_weight).tolist(), "from_documents": v.tolist(),
            "new_clusters": new, "removed_share": float(np.clip((w_old * gone).sum(), 0.0, 1.0)),
            "lost_clusters": lost, "matched_docs": int(len(c_old)), "earlier_clusters": int(k_old),
            "clusters": int(k), "new_token_share": [round(float(f), 6) for f in frac]}


def _bounds(space: dict, min_weight: float):
    """The space's Bounds (search.bounds, kl_max, caps, min_weight), or the caps and min_weight alone."""
    from climb.optimize.bounds import from_config
    b = space.get("bounds")
    return b if b is not None else from_config({}, space, min_weight)


def inside(w, space: dict, min_weight: float) -> np.ndarray:
    """A mixture put inside this run's space: weight off unusable clusters, then the nearest mixture
    that holds the epoch caps, min_weight, search.bounds and kl_max (as reuse._in_space puts an
    earlier mixture inside the caps, with the team's bounds too). InputError where none near holds them."""
    from climb.optimize.bounds import broken, project, satisfied
    w = np.where(space["usable"], np.asarray(w, float), 0.0)
    w = w / w.sum()
    b = _bounds(space, min_weight)
    p = project(w[None], b)[0]
    if not satisfied(p[None], b)[0]:
        raise InputError("search.reuse: the earlier run's mixture, read over this run's clusters, could not be "
                         f"brought inside this run's bounds ({'; '.join(broken(p, b))}); loosen them")
    return p


# ----------------------------------------------------------------- the pool over the component basis
def expand(a, v, new, k: int) -> np.ndarray:
    """The cluster weights of component coefficients `a` (..., 1 + len(new)): a_0 v + sum_j a_j e_new[j]
    (`v` one component, or one per row of `a`)."""
    a, v = np.asarray(a, float), np.asarray(v, float)
    W = a[..., :1] * (v if v.ndim > 1 else v.reshape(k))
    if len(new):
        W[..., np.asarray(new, int)] += a[..., 1:]
    return W


def component_pool(cfg: RunConfig, space: dict, v, new, n: int, seed: int) -> np.ndarray:
    """Up to n distinct mixtures a_0 v + sum_j a_j e_j (j in `new`), each inside the space's bounds
    (`toward`): v alone first, then Dirichlet draws of a around the components' natural shares (v's:
    the share of the clusters that are not new), in random order, then the other corners. With
    search.reuse_sharpen = G > 1, every other Dirichlet draw takes the component sharpened
    (`sharpened`, a power drawn log-uniform in [1, G]) in place of v, and the component sharpened
    alone to SHARPENED_ALONE powers up to G follows v at the head of the pool (so a first round,
    which takes the head, measures them), so the search can also move weight onto the component's
    heaviest clusters."""
    from climb.optimize.bounds import satisfied
    from climb.optimize.candidates import dedupe, sample_candidates
    search_cfg = cfg.search
    v = np.asarray(v, float)
    k, m = len(v), 1 + len(new)
    if not len(new):
        return v[None]
    natural = np.asarray(space["natural"], float)
    prior = np.r_[max(1.0 - float(natural[new].sum()), 1e-6), natural[new]]
    A = sample_candidates(prior / prior.sum(), max(n - m, 1), np.random.default_rng(seed),
                          concentrations=tuple(c * m for c in search_cfg.concentrations),
                          temperature=search_cfg.temperature, dedupe_l1=0.0)
    corners = np.eye(m)
    A = np.vstack([corners[:1], A, corners[1:]])
    b = _bounds(space, search_cfg.min_weight)
    W = expand(A, v, new, k)
    if search_cfg.reuse_sharpen:  # every other draw with the component sharpened (not v alone, not the corners)
        rows = np.arange(2, len(A) - (m - 1), 2)
        gammas = np.exp(np.random.default_rng([seed, 1]).uniform(0.0, np.log(search_cfg.reuse_sharpen), len(rows)))
        W[rows] = expand(A[rows], sharpened(v, gammas, search_cfg.min_weight), new, k)
        # and the component itself sharpened, alone, right after v: a first round measures them
        alone = sharpened(v, np.geomspace(1.0, search_cfg.reuse_sharpen, SHARPENED_ALONE + 1)[1:], search_cfg.min_weight)
        W = np.vstack([W[:1], alone, W[1:]])
    W = toward(W, v, b)
    return dedupe(W[satisfied(W, b)], 1e-3)[:n]


def sharpened(v, gammas, min_weight: float = 0.0) -> np.ndarray:
    """The component raised to each power in `gammas` (rows), renormalised; a cluster that falls
    below `min_weight` leaves it (the rest renormalised), as a pool mixture would."""
    v = np.asarray(v, float)
    P = np.where(v > 0, v, 0.0)[None] ** np.asarray(gammas, float)[:, None]
    P /= P.sum(1, keepdims=True)
    if min_weight:
        P = np.where(P < min_weight, 0.0, P)
        P /= P.sum(1, keepdims=True)
    return P


def toward(W, v, b, steps: int = 48) -> np.ndarray:
    """Rows of W moved along the segment to v (which holds every bound) as far from v as they still
    hold them all: a row a_0 v + sum_j a_j e_j stays one (a_0 grows), where the nearest mixture that
    holds them would spread the excess over every cluster and leave the component's basis. Bisection
    keeps the last point that holds, so a row comes inside under min_weight too (not convex)."""
    from climb.optimize.bounds import satisfied
    W, v = np.atleast_2d(np.asarray(W, float)).copy(), np.asarray(v, float)
    out = np.flatnonzero(~satisfied(W, b))
    if not len(out):
        return W
    Y = W[out]
    lo, hi = np.zeros(len(out)), np.ones(len(out))
    tol = 1e-9 if satisfied(v[None], b, tol=1e-9)[0] else None  # as closely as v itself holds them
    for _ in range(steps):
        mid = (lo + hi) / 2
        ok = satisfied(v + mid[:, None] * (Y - v), b, **({"tol": tol} if tol else {}))
        lo, hi = np.where(ok, mid, lo), np.where(ok, hi, mid)
    W[out] = v + lo[:, None] * (Y - v)
    return W


# ----------------------------------------------------------------- the search's side
def prepare(cfg: RunConfig, paths: RunPaths, space: dict, ep: RunPaths, removed: bool = False) -> dict:
    """The component (saved in search/reuse_plan.json before any proxy trains: a resumed search
    reads it), what the search runs, and the summary (search/reuse.json, logged in one line).

    Returns what climb.stages.search expects of a reuse (`start`, `evidence`, `plan_prior`,
    `pick_prior`, `summary`) and `pool(n, seed)` (the component pool), `component` (v) and
    `first` (the iteration whose draws are the swarm and are replicated). `ep`: the earlier run
    (climb.stages.search.reuse.earlier). `removed`: this corpus is the earlier one less some documents
    (climb.stages.search.reuse.removed_only), the reason a reuse under the same clusters comes here."""
    search_cfg = cfg.search
    if paths.search.reuse_plan.exists():
        plan = read_json(paths.search.reuse_plan)
    else:
        plan = {"mode": VIRTUAL, **earlier_component(cfg, paths, ep, space)}
        write_json(paths.search.reuse_plan, plan)
    v = np.asarray(plan["weights"], float)
    new = list(plan["new_clusters"])
    t = len(search_cfg.iterations)
    # Bounds may leave the new clusters no weight (a cap below min_weight, a bound at 0): the pool
    # is then the component alone, and nothing is left to search.
    room = bool(new) and len(component_pool(cfg, space, v, new, 16, search_cfg.seed)) > 1
    start = max(0, t - 2) if room else t
    summary = {"earlier": search_cfg.reuse, "mode": VIRTUAL,
               **{key: plan[key] for key in ("earlier_clusters", "clusters", "new_clusters", "removed_share",
                                             "lost_clusters", "matched_docs")},
               "removed_only": bool(removed),
               "component": plan["weights"], "iterations_run": list(range(start + 1, t + 1)),
               "proxies": int(sum(search_cfg.iterations[start:]))}
    write_json(paths.search.reuse, summary)
    log.info("%s", sentence(summary))

    def pool(n: int, seed: int) -> np.ndarray:
        return component_pool(cfg, space, v, new, min(n, POOL_PER_COMPONENT * (1 + len(new))), seed)
    return {"start": start, "evidence": [], "plan_prior": None, "pick_prior": None, "summary": summary,
            "pool": pool, "component": v, "first": start}


def component_pick(space: dict, v) -> dict:
    """The final mixture where no new cluster was left to choose: v, renormalised over the usable clusters."""
    w = np.where(space["usable"], np.asarray(v, float), 0.0)
    return {"weights": (w / w.sum()).tolist(), "predicted": None, "predictor": None, "best_seen": None,
            "component": True}


def finish(paths: RunPaths, summary: dict, results: list[dict]) -> dict:
    """The summary with the search proxies this run trained, written again to search/reuse.json."""
    summary = {**summary, "proxies": len(results)}
    write_json(paths.search.reuse, summary)
    return summary


def sentence(s: dict) -> str:
    """What a reuse across other clusters did, in one line (the log, the report)."""
    new, its = s["new_clusters"], s["iterations_run"]
    lost = f", its clusters {s['lost_clusters']} wholly gone" if s.get("lost_clusters") else ""
    why = ("the corpus only lost documents since" if s.get("removed_only") else
           f"other clusters ({s['earlier_clusters']} then, {s['clusters']} now)")
    head = (f"search.reuse {s['earlier']}: {why}, so its "
            f"found mixture entered as one fixed component over this run's clusters, read through "
            f"{s['matched_docs']:,} documents both hold ({s['removed_share']:.1%} of it lay on documents gone{lost}, "
            "the rest renormalised)")
    if not new:
        return f"{head}; no cluster is new, so no search proxy trained and the pick is that component"
    plural = "s" if len(new) > 1 else ""
    if not its:
        return (f"{head}; new cluster{plural} {', '.join(map(str, new))}, but the bounds leave "
                f"{'them' if plural else 'it'} no weight, so no search proxy trained and the pick is that component")
    return (f"{head}; new cluster{plural} {', '.join(map(str, new))}: the search ran iteration"
            f"{'s' if len(its) > 1 else ''} {', '.join(map(str, its))} over the component and the new "
            f"cluster{plural} alone, {s['proxies']} proxies")
