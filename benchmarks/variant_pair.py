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
- `compute_fraction`: the proxy compute A's searches spent (their search and
  replicate proxies, tokens x parameters; `summary.json["compute"]`) over B's.

    python benchmarks/variant_pair.py --a runs/ov_s0 runs/ov_s1 --b runs/t_s0 runs/t_s1 \
        --names openvino torch --margin 0.01 --json benchmarks/results/variant_pair.json
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


def search_compute(paths) -> float | None:
    """The proxy compute the search spent to choose (its own proxies and replicates, not the
    comparison): tokens x parameters where the records give parameters, else tokens."""
    from climb.stages.summary import compute_account
    by = compute_account(paths)["by_purpose"]
    parts = [by[p] for p in ("search", "replicates") if p in by]
    if not parts:
        return None
    if all(p["token_params"] is not None for p in parts):
        return float(sum(p["token_params"] for p in parts))
    return float(sum(p["tokens"] for p in parts)) or None


def compare(a_runs: list[Path], b_runs: list[Path], margin: float) -> dict:
    from climb.optimize.quality import paired_comparison
    if len(a_runs) != len(b_runs):
        raise SystemExit(f"--a has {len(a_runs)} runs and --b {len(b_runs)}: give one pair per search seed")
    a, b = [found_mixture(r) for r in a_runs], [found_mixture(r) for r in b_runs]
    for x, y in zip(a, b):
        if x["search_seed"] != y["search_seed"] or x["comparison_seeds"] != y["comparison_seeds"]:
            raise SystemExit(f"{x['run']} and {y['run']} are not a pair (search seeds {x['search_seed']} and "
                             f"{y['search_seed']}, comparison seeds {x['comparison_seeds']} and {y['comparison_seeds']})")
    goal = a[0]["goal"]
    c = paired_comparison([x["score"] for x in a], [y["score"] for y in b], goal)
    lo, hi = c["ci95"] if c["ci95"] else (None, None)
    no_worse = (hi is not None and hi < margin) if goal == "minimize" else (lo is not None and lo > -margin)
    ca, cb = [x["search_compute"] for x in a], [y["search_compute"] for y in b]
    fraction = sum(ca) / sum(cb) if None not in ca + cb and sum(cb) else None
    return {"goal": goal, "margin": margin, "a": a, "b": b,
            "diff_by_seed": [x["score"] - y["score"] for x, y in zip(a, b)],
            "comparison": c, "a_no_worse_than_b": no_worse, "compute_fraction": fraction}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", nargs="+", type=Path, required=True, help="variant A's runs, one per search seed")
    ap.add_argument("--b", nargs="+", type=Path, required=True, help="variant B's runs, the same search seeds in order")
    ap.add_argument("--names", nargs=2, default=["a", "b"])
    ap.add_argument("--margin", type=float, default=0.01, help="non-inferiority margin, in the target's units")
    ap.add_argument("--json", default="", help="also write the result here")
    args = ap.parse_args(argv)
    out = {"names": args.names, **compare(args.a, args.b, args.margin)}
    c = out["comparison"]
    print(f"{args.names[0]} - {args.names[1]} per search seed: "
          + ", ".join(f"{d:+.4f}" for d in out["diff_by_seed"]))
    ci = "[{:+.4f}, {:+.4f}]".format(*c["ci95"]) if c["ci95"] else "(no interval)"
    print(f"mean {c['diff']:+.4f} {ci} over {c['seeds']} search seeds: {c['verdict']}; "
          f"{args.names[0]} no worse than {args.names[1]} by more than {args.margin}: {out['a_no_worse_than_b']}")
    if out["compute_fraction"] is not None:
        print(f"{args.names[0]}'s search spent {out['compute_fraction']:.3f} of {args.names[1]}'s proxy compute")
    if args.json:
        write_result(Path(args.json), out, indent=1)


if __name__ == "__main__":
    main()
