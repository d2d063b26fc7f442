"""Half the proxy compute, the same answer? The cheaper searches against the default on the demo.

Each arm is a `climb run` of `pipelines/demo.toml` with a few settings changed, one
run per fresh search seed, paired with the default's run of the same seed (BENCHMARKS.md,
"Half the proxy compute", holds the rule this applies, fixed before the runs):

- H: fewer proxies, `search.iterations = [4, 4, 2, 2]`;
- S: successive halving on the curves, `[8, 8, 2]` with `search.halving = [0.25, 0.25]`;
- E: expert features, `[4, 2, 2]` with `search.experts = 0.25`.

The arms train no baselines (`search.baselines = []`): uniform and natural are the same
mixtures with the same comparison seeds in every run, so each arm is judged against its
seed's default run's (`variant_pair.py --baselines-from-b`, which checks that). Per arm:

- (a) `compute_fraction`: its search compute (search, replicate and expert proxies) over
  the default's, at most 0.5;
- (b) every seed's found mixture beats uniform and natural at 95%;
- (c) every found mixture's tech share is at least 0.6 (`demo_answer.py`);
- (d) the found-mixture bpb minus the default's, paired by search seed: the 95% interval's
  upper end below +0.01;
- and against H (the obvious way to spend half), the mean difference.

    # train what is missing (about 5 min a run on 2 cores), then judge
    python benchmarks/cheaper_search.py --train --json benchmarks/results/cheaper_search.json
    python benchmarks/cheaper_search.py --default 'runs/pair_torch_s{seed}' --arm 'runs/arm_{arm}_s{seed}'

`--preset bench` does the same on `pipelines/bench.toml` (2 shards; target the mean gold
loss per byte of PIQA, ARC-Easy and HellaSwag; needs ../shared/data). Only the search
differs between its runs, so embed, cluster and tokenize run once, in `runs/cbench_base`,
and every run is a copy of that folder (modification times kept, so the copies' manifests
hold) on which `climb search` runs. The default's runs compare with uniform and natural
only: the preset's third baseline, one-shot, is a comparison and no part of choosing, and
leaving it out saves 30 proxies a run. Criterion (c) is the demo's known answer and has no
counterpart there.

    python benchmarks/cheaper_search.py --preset bench --arms E --seeds 10 11 12 13 14 --train \
        --json benchmarks/results/cheaper_search_bench.json

`--preset tech` and `--preset sport` are the demo on a base folder too (`runs/ctech_base`,
`runs/csport_base`; sport: `corpus.build = "demo:sport"`, the target 80 held-out sport
articles), with criterion (c) on the held-out section's share. `--share-baselines`: the
default's run of the first seed alone trains uniform and natural, and every run of every
arm and the default is judged against those (the same mixtures with the same comparison
seeds on the same base give the same proxies; the script checks the mixtures). `--runs
PREFIX` names the runs `PREFIX_<arm>_s<seed>` (the default's arm is `default`), and the
base `PREFIX_base` unless the preset shares one. `--json` then writes one file per arm,
`<json stem>_<arm>.json`.

    python benchmarks/cheaper_search.py --preset bench --runs runs/g32bench --arms B M \
        --seeds 20 21 22 23 24 25 26 27 --share-baselines --train --json benchmarks/results/cheap32_bench.json

`--records DIR` (default `benchmarks/results/records`): every finished run's record
(`variant_pair.record`, with the held-out section's share where the preset has a known
answer) is kept there as `<run name>.json`, and a run whose folder is gone is judged from its
record, so a measurement goes on in a later session, on another machine, from the records
alone: only the seeds not yet recorded are trained. The shared baselines stand for a run only
when both searched on the same base (the record's base digest); a later session whose base
came out otherwise trains them again in its first default run.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from common import write_result

ARMS = {
    "H": ["search.iterations=[4,4,2,2]"],
    "S": ["search.iterations=[8,8,2]", "search.halving=[0.25,0.25]"],
    "E": ["search.iterations=[4,2,2]", "search.experts=0.25"],
    # A shared base (BENCHMARKS.md, "From a shared base, on task targets too?"): every search proxy and
    # replicate continues one base trained 0.55 of the steps on the natural mixture.
    "B": ["search.experts=0", "search.iterations=[8,8,8,4]", "search.base=0.55"],
    # Merged models of the base's continuations per cluster as the predictor's feature, fewer proxies.
    "M": ["search.experts=0", "search.iterations=[6,6,4]", "search.base=0.6", "search.merge=true",
          "search.merge_pool=256", "search.merge_tokens=2048"],
}
TECH_MIN, MARGIN, FRACTION_MAX = 0.6, 0.01, 0.5
# The bench's margin is tighter (the shared-base rule): its gain over natural is 0.013-0.027, so a
# 0.01 margin would allow losing half of it. `--margin` overrides either.
PRESET_MARGIN = {"bench": 0.0075}


PRESETS = {
    # The default search, named: the demo preset's own search is E since the ten-seed test.
    "demo": {"config": "pipelines/demo.toml", "sets": [],
             "default_sets": ["search.experts=0", "search.iterations=[8,8,8,4]"], "command": "run", "base": None,
             "known_answer": True, "default": "runs/pair_torch_s{seed}", "arm": "runs/arm_{arm}_s{seed}"},
    "bench": {"config": "pipelines/bench.toml", "sets": ["corpus.max_shards=2"],
              "default_sets": ["search.experts=0", "search.iterations=[8,8,8,4]",
                               'search.baselines=["uniform","natural"]'], "command": "search",
              "base": "runs/cbench_base", "known_answer": False,
              "default": "runs/cbench_default_s{seed}", "arm": "runs/cbench_{arm}_s{seed}"},
    "tech": {"config": "pipelines/demo.toml", "sets": [],
             "default_sets": ["search.experts=0", "search.iterations=[8,8,8,4]"], "command": "search",
             "base": "runs/ctech_base", "known_answer": True,
             "default": "runs/ctech_default_s{seed}", "arm": "runs/ctech_{arm}_s{seed}"},
    "sport": {"config": "pipelines/demo.toml",
              "sets": ['corpus.build="demo:sport"', 'target.texts=["{run}/data/target/sport_heldout.jsonl"]'],
              "default_sets": ["search.experts=0", "search.iterations=[8,8,8,4]"], "command": "search",
              "base": "runs/csport_base", "known_answer": True,
              "default": "runs/csport_default_s{seed}", "arm": "runs/csport_{arm}_s{seed}"},
}


def _climb(args: list[str], log_path: str) -> None:
    cmd = [sys.executable, "-m", "climb.cli"] + args
    print(" ".join(cmd), flush=True)
    with open(log_path, "w") as log:
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT,
                       env=dict(os.environ, HF_HUB_OFFLINE="1"))


def _finished(run: Path, command: str) -> bool:
    return (run / "report" / "summary.json").exists() if command == "run" else (run / "search" / "manifest.json").exists()


def _common(preset: dict) -> list[str]:
    return ["--config", preset["config"]] + [a for s in preset["sets"] for a in ("--set", s)]


def _build_base(preset: dict) -> Path:
    """The preset's base folder, embed, cluster and tokenize run there first if need be."""
    base = Path(preset["base"])
    if not (base / "tokenize" / "manifest.json").exists():
        _climb(["tokenize", "--run", str(base)] + _common(preset), f"{base}.log")
    return base


def train(run: Path, seed: int, sets: list[str], baselines: bool, preset: dict) -> None:
    """One run of the preset with `sets` (and search seed `seed`), unless it is finished."""
    if _finished(run, preset["command"]):
        return
    common = _common(preset)
    if preset["base"] and not run.exists():
        base = _build_base(preset)
        if (base / "search").exists():
            raise SystemExit(f"{base} has a search folder: a base holds embed, cluster and tokenize only")
        shutil.copytree(base, run, copy_function=shutil.copy2)  # copy2 keeps the mtimes the manifests hold
    sets = [f"search.seed={seed}"] + sets + ([] if baselines else ["search.baselines=[]"])
    _climb([preset["command"], "--run", str(run)] + common + [a for s in sets for a in ("--set", s)], f"{run}.log")


def load(run: Path, records: Path | None, known_answer: bool) -> dict | None:
    """The run's record: read from its folder when the search there is finished (and kept in
    `records`), else the one kept; None when neither is there."""
    from benchmarks.variant_pair import record
    kept = records / f"{run.name}.json" if records else None
    if (run / "search" / "manifest.json").exists():
        rec = record(run)
        if known_answer:
            from benchmarks.demo_answer import analyse
            rec["held_out_share"] = analyse(run)["tech_share"]
        if kept is not None:
            write_result(kept, rec, indent=1)
        return rec
    return json.loads(kept.read_text()) if kept is not None and kept.exists() else None


def _has_baselines(rec: dict) -> bool:
    return any(k.startswith("uniform/") for k in (rec.get("comparison") or {}))


def _base_here(preset: dict, pending: list[Path]) -> str | None:
    """The digest of the base this session's pending runs start from (built first if need be)."""
    from benchmarks.variant_pair import base_digest
    if not pending or not preset["base"]:
        return None
    return base_digest(_build_base(preset))


def judge(arm: str, runs: list, default: list, h: list | None, known_answer: bool = True,
          baselines_run=None, margin: float = MARGIN) -> dict:
    """Runs are records (`load`) or folders."""
    from benchmarks.variant_pair import as_record, compare
    runs = [as_record(r) for r in runs]
    out = compare(runs, default, margin, baselines_from_b=True, baselines_run=baselines_run)
    tech = [r["held_out_share"]["climb"] for r in runs] if known_answer else None
    beats = [all(x["baselines"].get(b, {}).get("verdict") == "better" for b in ("uniform", "natural"))
             for x in out["a"]]
    c = out["comparison"]
    res = {"arm": arm, "settings": ARMS.get(arm, []), "seeds": [x["search_seed"] for x in out["a"]],
           "default_baselines": [x["baselines"] for x in out["b"]],
           "bpb": [x["score"] for x in out["a"]], "default_bpb": [x["score"] for x in out["b"]],
           "diff_vs_default": c, "compute_fraction": out["compute_fraction"], "tech_share": tech,
           "baselines": [x["baselines"] for x in out["a"]],
           "criteria": {"a_half_compute": out["compute_fraction"] is not None
                        and out["compute_fraction"] <= FRACTION_MAX + 1e-9,
                        "b_beats_baselines": all(beats),
                        "d_non_inferior": bool(out["a_no_worse_than_b"])}}
    if tech is not None:
        res["criteria"]["c_tech_share"] = min(tech) >= TECH_MIN
    res["passes"] = all(res["criteria"].values())
    if h is not None:
        vs_h = compare(runs, h, margin)
        res["diff_vs_H"] = vs_h["comparison"]
    return res


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=list(PRESETS), default="demo")
    ap.add_argument("--seeds", type=int, nargs="+", default=[5, 6, 7, 8, 9])
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("--default", default=None, help="the default's run folder per seed (default: the preset's)")
    ap.add_argument("--arm", default=None, help="an arm's run folder per seed (default: the preset's)")
    ap.add_argument("--train", action="store_true", help="train the runs that are missing first")
    ap.add_argument("--runs", default="", help="name the runs PREFIX_<arm>_s<seed> (and the base PREFIX_base)")
    ap.add_argument("--share-baselines", action="store_true",
                    help="only the first seed's default run trains uniform and natural; every run is judged on them")
    ap.add_argument("--order", choices=["arms", "seeds"], default="arms",
                    help="train arm by arm, or seed by seed (every arm of a seed before the next seed)")
    ap.add_argument("--json", default="")
    ap.add_argument("--margin", type=float, default=None,
                    help="criterion (d)'s margin (default: the preset's, 0.0075 on the bench, else 0.01)")
    ap.add_argument("--records", default="benchmarks/results/records",
                    help="keep each finished run's record here, and judge a run whose folder is gone from it")
    args = ap.parse_args(argv)
    margin = args.margin if args.margin is not None else PRESET_MARGIN.get(args.preset, MARGIN)
    records = Path(args.records) if args.records else None
    preset = dict(PRESETS[args.preset])
    if args.runs:
        preset.update(default=f"{args.runs}_default_s{{seed}}", arm=f"{args.runs}_{{arm}}_s{{seed}}")
        if preset["base"] and args.preset != "bench":  # the bench's base is shared with its earlier tests
            preset["base"] = f"{args.runs}_base"
    default = [Path((args.default or preset["default"]).format(seed=s)) for s in args.seeds]
    arms = {a: [Path((args.arm or preset["arm"]).format(arm=a, seed=s)) for s in args.seeds] for a in args.arms}
    ka = preset["known_answer"]
    every = default + [x for runs in arms.values() for x in runs]
    cache: dict = {}

    def rec(r: Path) -> dict | None:  # each run's record read (and kept) once
        if r not in cache:
            cache[r] = load(r, records, ka)
        return cache[r]
    if args.train:
        recorded = {r for r in every if not r.exists() and rec(r) is not None}
        pending = [r for r in every if r not in recorded]
        # With shared baselines one default run trains them on each base the runs search on: a later
        # session whose base came out otherwise (another CPU's embedding digits) trains them again.
        train_baselines = set(default)
        if args.share_baselines:
            here = _base_here(preset, pending)
            holders = [r for r in default if r in recorded and _has_baselines(rec(r))]
            has = any(rec(r).get("base") == here for r in holders) if here else bool(holders)
            first = next((r for r in default if r in pending), None)
            train_baselines = set() if has or first is None else {first}
        jobs = [(default[i], s, preset["default_sets"], default[i] in train_baselines)
                for i, s in enumerate(args.seeds)]
        jobs += [(runs[i], s, ARMS[a], False) for a, runs in arms.items() for i, s in enumerate(args.seeds)]
        jobs = [j for j in jobs if j[0] not in recorded]
        if args.order == "seeds":
            jobs.sort(key=lambda j: args.seeds.index(j[1]))  # stable: the default first in each seed
        jobs.sort(key=lambda j: not j[3])  # a run that trains the baselines goes first
        for run, s, sets, baselines in jobs:
            train(run, s, sets, baselines=baselines, preset=preset)
            cache.pop(run, None)
            rec(run)  # kept at once: a stop loses at most the run in flight
    loaded = {r: rec(r) for r in every}
    missing = [str(r) for r, rec in loaded.items() if rec is None]
    if missing:
        raise SystemExit(f"neither finished nor recorded in {records}: {', '.join(missing)} (--train trains them)")
    default = [loaded[r] for r in default]
    arms = {a: [loaded[r] for r in runs] for a, runs in arms.items()}
    shared = [d for d in default if _has_baselines(d)] if args.share_baselines else None
    results = [judge(a, runs, default, arms.get("H") if a != "H" else None, ka, shared, margin)
               for a, runs in arms.items()]
    for r in results:
        c = r["diff_vs_default"]
        ci = "[{:+.4f}, {:+.4f}]".format(*c["ci95"]) if c["ci95"] else "(no interval)"
        print(f"{r['arm']}: compute {r['compute_fraction']:.3f} of the default's; bpb "
              + ", ".join(f"{b:.4f}" for b in r["bpb"])
              + (f"; tech share {min(r['tech_share']):.2f}-{max(r['tech_share']):.2f}" if r["tech_share"] else "")
              + f"; - default {c['diff']:+.4f} {ci} ({c['verdict']})"
              + (f"; - H {r['diff_vs_H']['diff']:+.4f}" if "diff_vs_H" in r else "")
              + f"; criteria {r['criteria']}; passes: {r['passes']}")
    if args.json and args.runs:  # one file per arm
        for r in results:
            path = Path(args.json)
            write_result(path.with_name(f"{path.stem}_{r['arm']}{path.suffix}"),
                         {"preset": args.preset, "margin": margin, "tech_min": TECH_MIN, "fraction_max": FRACTION_MAX,
                          "default_runs": [d["run"] for d in default],
                          "baselines_runs": [d["run"] for d in shared] if shared else None,
                          **r}, indent=1)
    elif args.json:
        write_result(Path(args.json), {"preset": args.preset, "margin": margin, "tech_min": TECH_MIN,
                                       "fraction_max": FRACTION_MAX, "default_runs": [d["run"] for d in default],
                                       "arms": results}, indent=1)


if __name__ == "__main__":
    main()
