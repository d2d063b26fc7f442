"""Is one pipeline variant's found mixture at least as good as another's, over search seeds?

A variant that changes what the search sees (another embedding backend, another
cluster count) cannot be judged by one run: the search seed moves the found
mixture by as much as the variant might. This script takes finished demo-style
runs of two variants, one pair per search seed, and compares the found mixtures'
target scores:

- for each run, the found mixture's mean score over its comparison seeds (the
  search stage's own comparison table; the comparison seeds must be the same);
- per search seed, A's mean minus B's;
- over the search seeds, the paired 95% t-interval of that difference and its
  verdict (`climb.optimize.quality.paired_comparison`);
- non-inferiority: A is "no worse" when the interval's upper end (for a loss) is
  below `--margin`;
- `compute_fraction`: the proxy compute A's searches spent (their search,
  base, merge, replicate and expert proxies, tokens x parameters; `summary.json["compute"]`)
  over B's;
- `baselines`: each run's found mixture against the baselines (uniform, natural)
  paired by comparison seed. With `--baselines-from-b`, an A run that trained no
  baselines of its own (`search.baselines = []`) is judged against its B run's,
  which is sound only when they are the same mixtures with the same seeds: the
  script checks that both runs' uniform and natural weights are equal.

    python benchmarks/variant_pair.py --a runs/ov_s0 runs/ov_s1 --b runs/t_s0 runs/t_s1 \
        --names openvino torch --margin 0.01 --json benchmarks/results/variant_pair.json

A run may also be given as its **record** (`record(run)`, kept as one small JSON file): what
judging reads of a finished run (the comparison's proxies, the mixtures, the compute, the
search's quality figures) and a digest of the base it searched on (centroids and tokenizer),
so a measurement of many seeds outlives its run folders; two runs whose baselines stand for
each other must have the same base digest.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from common import run_paths, write_result


def found_mixture(run: Path) -> dict:
    """The found mixture's mean target score and the search seed of one finished run."""
    from climb.config import load_config
    paths = run_paths(run)
    cfg = load_config(paths.config)
    score = paths.stats("search").get("comparison", {}).get("climb")  # the search's own comparison table
    if score is None:
        raise SystemExit(f"{run}: no finished comparison of the found mixture")
    return {"run": str(run), "search_seed": cfg.search.seed, "goal": cfg.target.goal,
            "comparison_seeds": [cfg.search.eval_seed + s for s in range(cfg.search.eval_seeds)],
            "score": float(score), "search_compute": search_compute(paths)}


def base_digest(run: Path) -> str | None:
    """sha256 (16 hex) of what a search starts from: the centroids and the proxies' tokenizer."""
    import hashlib
    paths = run_paths(run)
    files = [paths.cluster.centroids, paths.cluster.cluster_centroids, paths.tokenize.tokenizer]
    if not all(f.exists() for f in files):
        return None
    h = hashlib.sha256()
    for f in files:
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def record(run: Path) -> dict:
    """A finished run as judging reads it, in one JSON-able dict (see the module's docstring)."""
    from climb.io.files import read_json
    paths = run_paths(run)
    rec = found_mixture(run)
    s = paths.search
    for key, path in (("comparison", s.comparison), ("mixtures", s.mixture), ("quality", s.quality)):
        rec[key] = read_json(path) if path.exists() else None
    rec["stats"] = paths.stats("search")
    rec["base"] = base_digest(run)
    return rec


def as_record(run) -> dict:
    """`run` as a record: a dict is one already, a folder is read."""
    return run if isinstance(run, dict) else record(Path(run))


SEARCH_PURPOSES = ("search", "base", "merge", "replicates", "experts", "finalists")


def search_compute(paths) -> dict | None:
    """The proxy compute the search spent to choose (its own proxies, base, merged models,
    replicates and experts, not the comparison): {"tokens": ..., "token_params": ... or None
    where a record has no parameter count}."""
    from climb.stages.search.summary import compute_account
    by = compute_account(paths)["by_purpose"]
    parts = [by[p] for p in SEARCH_PURPOSES if p in by]
    if not parts:
        return None
    tp = [p["token_params"] for p in parts]
    return {"tokens": float(sum(p["tokens"] for p in parts)),
            "token_params": None if None in tp else float(sum(tp))}


def compute_fraction(ca: list, cb: list) -> float | None:
    """A's search compute over B's: tokens x parameters where every run has them, else tokens."""
    if None in ca + cb:
        return None
    unit = "token_params" if all(c["token_params"] is not None for c in ca + cb) else "tokens"
    total_b = sum(c[unit] for c in cb)
    return sum(c[unit] for c in ca) / total_b if total_b else None


def baseline_verdicts(run, source=None) -> dict:
    """{baseline: paired verdict of run's found mixture against it} over the comparison seeds;
    the baselines' proxies are read from `source` (default: the run itself). Each is a run
    folder or its record."""
    from climb.optimize.quality import paired_comparison
    rec = as_record(run)
    src = rec if source is None else as_record(source)
    ours, theirs = rec["comparison"], src["comparison"]
    if ours is None or theirs is None:  # no comparison records kept (a summary-only run)
        return {}
    if source is not None:
        if rec.get("base") and src.get("base") and rec["base"] != src["base"]:
            raise SystemExit(f"{rec['run']} and {src['run']} searched on different bases "
                             f"({rec['base']}, {src['base']}): their baselines are not shared")
        mine, other = rec["mixtures"], src["mixtures"]
        for name in ("uniform", "natural"):
            if len(mine[name]) != len(other[name]) or max(abs(x - y) for x, y in zip(mine[name], other[name])) > 1e-9:
                raise SystemExit(f"{rec['run']} and {src['run']} have different {name} mixtures: "
                                 "their baselines are not shared")
    seeds = rec["comparison_seeds"]
    out = {}
    for name in ("uniform", "natural", "one-shot"):
        if all(f"{name}/{s}" in theirs for s in seeds):
            out[name] = paired_comparison([ours[f"climb/{s}"]["objective"] for s in seeds],
                                          [theirs[f"{name}/{s}"]["objective"] for s in seeds], rec["goal"])
    return out


def compare(a_runs: list, b_runs: list, margin: float, baselines_from_b: bool = False,
            baselines_run=None) -> dict:
    """A against B paired by search seed; each run's found mixture against the baselines (its
    own, its B run's with `baselines_from_b`, or with `baselines_run` every run's, A and B,
    against that one run's, or where it is a list, the one's that searched on the same base).
    Runs are folders or records (`record`)."""
    from climb.optimize.quality import paired_comparison
    if len(a_runs) != len(b_runs):
        raise SystemExit(f"--a has {len(a_runs)} runs and --b {len(b_runs)}: give one pair per search seed")
    recs = {}  # each run read once
    a_full, b_full = ([recs.setdefault(id(r), as_record(r)) for r in side] for side in (a_runs, b_runs))
    if baselines_run is None:
        shared = []
    else:
        holders = baselines_run if isinstance(baselines_run, (list, tuple)) else [baselines_run]
        shared = [as_record(r) for r in holders]
    keep = ("run", "search_seed", "goal", "comparison_seeds", "score", "search_compute")
    a, b = [{k: x[k] for k in keep} for x in a_full], [{k: y[k] for k in keep} for y in b_full]
    for x, y in zip(a, b):
        if x["search_seed"] != y["search_seed"] or x["comparison_seeds"] != y["comparison_seeds"]:
            raise SystemExit(f"{x['run']} and {y['run']} are not a pair (search seeds {x['search_seed']} and "
                             f"{y['search_seed']}, comparison seeds {x['comparison_seeds']} and {y['comparison_seeds']})")
    goal = a[0]["goal"]
    c = paired_comparison([x["score"] for x in a], [y["score"] for y in b], goal)
    lo, hi = c["ci95"] if c["ci95"] else (None, None)
    no_worse = (hi is not None and hi < margin) if goal == "minimize" else (lo is not None and lo > -margin)
    fraction = compute_fraction([x["search_compute"] for x in a], [y["search_compute"] for y in b])
    for x, y, xf, yf in zip(a, b, a_full, b_full):
        for side, full, other in ((x, xf, yf), (y, yf, None)):
            source = other if baselines_from_b and other else None
            if shared and side["run"] not in {h["run"] for h in shared}:
                # the baselines trained on this run's base (the first one's when none was: refused below)
                source = next((h for h in shared if h.get("base") == full.get("base")), shared[0])
            side["baselines"] = baseline_verdicts(full, source)
        if baselines_from_b and not any(k in x["baselines"] for k in ("uniform", "natural")):
            raise SystemExit(f"{y['run']} has no uniform or natural proxies to judge {x['run']} against")
    return {"goal": goal, "margin": margin, "a": a, "b": b,
            "diff_by_seed": [x["score"] - y["score"] for x, y in zip(a, b)],
            "comparison": c, "a_no_worse_than_b": no_worse, "compute_fraction": fraction}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", nargs="+", type=Path, required=True, help="variant A's runs, one per search seed")
    ap.add_argument("--b", nargs="+", type=Path, required=True, help="variant B's runs, the same search seeds in order")
    ap.add_argument("--names", nargs=2, default=["a", "b"])
    ap.add_argument("--margin", type=float, default=0.01, help="non-inferiority margin, in the target's units")
    ap.add_argument("--baselines-from-b", action="store_true",
                    help="judge A runs that trained no baselines against their B run's (same mixtures, same seeds)")
    ap.add_argument("--json", default="", help="also write the result here")
    args = ap.parse_args(argv)
    out = {"names": args.names, **compare(args.a, args.b, args.margin, args.baselines_from_b)}
    c = out["comparison"]
    print(f"{args.names[0]} - {args.names[1]} per search seed: "
          + ", ".join(f"{d:+.4f}" for d in out["diff_by_seed"]))
    ci = "[{:+.4f}, {:+.4f}]".format(*c["ci95"]) if c["ci95"] else "(no interval)"
    print(f"mean {c['diff']:+.4f} {ci} over {c['seeds']} search seeds: {c['verdict']}; "
          f"{args.names[0]} no worse than {args.names[1]} by more than {args.margin}: {out['a_no_worse_than_b']}")
    for side, name in (("a", args.names[0]), ("b", args.names[1])):
        for x in out[side]:
            v = x["baselines"]
            if v:
                print(f"{name} seed {x['search_seed']}: " + "; ".join(
                    f"vs {k} {c['diff']:+.4f} [{c['ci95'][0]:+.4f}, {c['ci95'][1]:+.4f}] {c['verdict']}"
                    if c["ci95"] else f"vs {k} {c['verdict']}" for k, c in v.items()))
    if out["compute_fraction"] is not None:
        print(f"{args.names[0]}'s search spent {out['compute_fraction']:.3f} of {args.names[1]}'s proxy compute")
    if args.json:
        write_result(Path(args.json), out, indent=1)


if __name__ == "__main__":
    main()
