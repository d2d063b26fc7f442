"""What a finished search found and how far to trust it, as one dict: the report's
`summary.json` and the exported dataset's card are both made from it."""
from __future__ import annotations

from climb.config import RunConfig
from climb.config.objective import describe
from climb.io.files import read_json
from climb.runtime.layout import RunPaths


# The compute account's names for the purposes climb.runtime.results.proxy_records gives, in its order.
_PURPOSES = {"search": "search", "base": "base", "merge": "merge", "experts": "experts", "replicate": "replicates", "finalists": "finalists",
             "comparison": "comparison", "one-shot": "one-shot", "validation": "validate"}


def compute_account(paths: RunPaths) -> dict:
    """The proxy compute the run spent, by purpose and in all: proxies, tokens trained on,
    tokens × parameters (and 6× that as training FLOPs; null where a trainer did not report
    its parameters), and the proxies' own seconds (summed, not wall-clock). The shared base
    counts once ("base"); the proxies that continue it count only their own steps; merged
    models' evaluations count a third of a training token per token scored ("merge")."""
    def account(recs: list[dict]) -> dict:
        tp = [r.get("tokens", 0) * r["params"] for r in recs if "params" in r]
        known = all("params" in r for r in recs if r.get("status") == "ok")
        # A merged-model scoring entry (merge.json) charges forward passes, and trains no proxy.
        return {"proxies": sum("forward_tokens" not in r for r in recs),
                "tokens": int(sum(r.get("tokens", 0) or 0 for r in recs)),
                "token_params": int(sum(tp)) if known else None,
                "flops": 6 * int(sum(tp)) if known else None,
                "seconds": round(float(sum(r.get("seconds", 0) or 0 for r in recs)), 1)}
    from climb.runtime.results import proxy_records
    recs: dict[str, list[dict]] = {name: [] for name in _PURPOSES.values()}
    for purpose, rec in proxy_records(paths):
        recs[_PURPOSES[purpose]].append(rec)
    return {"by_purpose": {k: account(v) for k, v in recs.items() if v},
            "total": account([r for v in recs.values() for r in v])}


def compute_table(compute: dict) -> str:
    """The compute account as a Markdown table."""
    def row(name: str, a: dict) -> str:
        tp = "n/a" if a["token_params"] is None else f"{a['token_params']:.3g}"
        return f"| {name} | {a['proxies']} | {a['tokens']:,} | {tp} | {a['seconds']:,.0f} |"
    lines = ["| purpose | proxies | tokens | tokens × parameters | proxy seconds |", "| --- | --- | --- | --- | --- |"]
    lines += [row(k, v) for k, v in compute["by_purpose"].items()]
    return "\n".join(lines + [row("**total**", compute["total"])])


def search_summary(cfg: RunConfig, paths: RunPaths, n_results: int, n_clusters: int) -> dict:
    """Target, the comparison's means and verdicts, the run's noise figures, the proxies trained and
    the mixtures by source (`by_source`, where the sources are known: climb.stages.search.sources)."""
    sstats = paths.stats("search")
    comp = sstats["comparison"]
    qfile = paths.search.quality
    quality = read_json(qfile) if qfile.exists() else {}
    out = {"target": {"name": describe(cfg.target), "goal": cfg.target.goal},
            "results": {k: float(v) for k, v in comp.items() if v is not None},
            "comparison": sstats.get("verdicts", {}),
            "quality": {k: quality.get(k) for k in ("seed_sd", "paired_sd", "swarm_sd", "snr",
                                                    "predictor_oof_spearman", "experts_spearman", "merge_spearman",
                                                    "warnings")},
            "proxies_trained": sstats.get("proxies", n_results) + sstats.get("replicate_proxies", 0)
            + sstats.get("comparison_proxies", len(comp) * cfg.search.eval_seeds)
            + sstats.get("one_shot_proxies", 0) + sstats.get("expert_proxies", 0)
            + sstats.get("base_proxies", 0) + sstats.get("merge_proxies", 0),
            "clusters": n_clusters,
            "compute": compute_account(paths)}
    out["verdict"] = verdict(out)
    if quality.get("steadiness"):
        out["steadiness"] = quality["steadiness"]
    from climb.stages.search.sources import mixture_by_source
    found = mixture_by_source(cfg, paths)
    if found is not None:  # the found, natural and uniform mixtures, each a share per source
        out["by_source"] = found
    return out


def verdict(summary: dict) -> dict:
    """The comparison in one plain sentence: better than every baseline, not shown better, or
    worse than one, and which mixture measured best (summary.json's `verdict`)."""
    res, comp, t = summary["results"], summary.get("comparison", {}), summary["target"]
    from climb.optimize.predictor import goal_sign
    if not res or not comp:
        return {"kind": "no comparison", "best_measured": None,
                "sentence": "No baseline was compared, so nothing says the found mixture is better than another."}
    best = min(res, key=lambda k: goal_sign(t["goal"]) * res[k])

    def cell(name):
        c = comp[name]
        return (f"{name}: {c['diff']:+.4f} [{c['ci95'][0]:+.4f}, {c['ci95'][1]:+.4f}]" if c.get("ci95")
                else f"{name}: {c.get('diff', float('nan')):+.4f}, no interval")
    worse = [n for n, c in comp.items() if c.get("verdict") == "worse"]
    unresolved = [n for n, c in comp.items() if c.get("verdict") != "better" and n not in worse]
    if worse:
        kind = "worse"
        text = (f"The found mixture is worse than {' and '.join(worse)} ({'; '.join(cell(n) for n in worse)}, "
                f"climb minus baseline, 95% paired interval); {best} measured best.")
    elif unresolved:
        kind = "not shown better"
        text = (f"The found mixture is not shown better than {' and '.join(unresolved)} (the 95% interval spans "
                f"zero: {'; '.join(cell(n) for n in unresolved)}); {best} measured best.")
    else:
        kind = "better"
        text = f"The found mixture is better than {' and '.join(comp)} at 95% (paired by seed)."
    return {"kind": kind, "best_measured": best, "sentence": text}


def mixture_lines(weights, clusters: list[dict], top: int = 5) -> str:
    """The found mixture's heaviest clusters with their top terms, one line each."""
    import numpy as np
    w = np.asarray(weights, float)
    order = [int(i) for i in np.argsort(-w, kind="stable") if w[i] > 0]
    lines = [f"  cluster {clusters[i]['cluster']:>3}: {w[i]:6.1%}  {', '.join(clusters[i].get('top_terms', [])[:6])}"
             for i in order[:top]]
    rest = order[top:]
    if rest:
        lines.append(f"  {len(rest)} more cluster{'s' if len(rest) > 1 else ''}: {w[rest].sum():6.1%}")
    return "\n".join(lines)


def duplicates(paths: RunPaths) -> dict | None:
    """Per cluster: documents, exact and near duplicates (climb.stages.cluster.dedup), and tokens before and
    after them; None where the run found none (dedup off, or a run from before it)."""
    csum = read_json(paths.cluster.summary)
    clusters = csum["clusters"]
    if not clusters or "duplicates" not in clusters[0]:
        return None
    tstats = paths.stats("tokenize") if paths.manifest("tokenize").exists() else {}
    inside = tstats.get("duplicate_tokens")
    dropped = tstats.get("dropped_duplicate_tokens")
    from climb.stages.tokenize import cluster_tokens
    store = cluster_tokens(paths).tolist() if paths.manifest("tokenize").exists() else None
    rows = []
    for i, c in enumerate(clusters):
        row = {"cluster": c["cluster"], "docs": c["docs"], "exact": c["duplicates"]["exact"],
               "near": c["duplicates"]["near"], "docs_distinct": c["docs_distinct"]}
        if store is not None and inside is not None:
            before = store[i] + (dropped[i] if dropped else 0)
            row.update(tokens_before=int(before), tokens_after=int(before - inside[i] - (dropped[i] if dropped else 0)))
        rows.append(row)
    total = {k: sum(r[k] for r in rows) for k in rows[0] if k != "cluster"}
    drift = csum.get("drift")
    return {"clusters": rows, "total": total, "dropped": bool(dropped and any(dropped)), "drift": drift}


def duplicates_table(d: dict) -> str:
    """The duplicates per cluster as a Markdown table."""
    tokens = "tokens_before" in d["clusters"][0]
    head = "| cluster | documents | exact duplicates | near duplicates | distinct |" + (
        " tokens before | tokens after |" if tokens else "")
    sep = "| --- | --- | --- | --- | --- |" + (" --- | --- |" if tokens else "")
    lines = [head, sep]
    for r in d["clusters"] + [dict(d["total"], cluster="**all**")]:
        lines.append(f"| {r['cluster']} | {r['docs']:,} | {r['exact']:,} | {r['near']:,} | {r['docs_distinct']:,} |"
                     + (f" {r['tokens_before']:,} | {r['tokens_after']:,} |" if tokens else ""))
    return "\n".join(lines)
