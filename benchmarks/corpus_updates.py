"""Corpus updates: a search reused from the earlier run against a full search, update by update.

The rule and the sequence are in docs/benchmarks/corpus-updates.md (committed before the runs):
the demo corpus split into bbc-0 ... bbc-3 and code, five versions (v1 bbc-0,1; + bbc-2; + bbc-3;
+ code with the clusters fitted again; - bbc-1), the tech target. On each version after the first,
a full search and a reused one (`search.reuse` naming the same seed's run of the version before)
per search seed, and the earlier answer kept as it was, each trained on the version's five
comparison seeds.

    python benchmarks/corpus_updates.py prepare                 # shards, version bases (about 5 min)
    python benchmarks/corpus_updates.py train --seeds 0 1 2     # every run missing; resumes
    python benchmarks/corpus_updates.py judge --seeds 0 1 2 --json benchmarks/results/corpus_updates.json

`train --updates 1 2` limits training to the first updates (their runs are judged as they finish:
`judge` reads the updates whose runs are all there). Each run folder is a copy of its version's
base (`runs/g52/base_v<n>`), a copy redoing no stage; a killed run resumes when trained again.

`--preset bench` runs the same sequence on the bench corpus (the shared corpus's parts 0-3 read
where they lie, the demo's code chunks as the new source, the bench preset's task target and
search; its own rule in docs/benchmarks/corpus-updates.md). Its v1 is the bench preset itself, so
v1's full search of seed s is steady_pick's bench run of that seed (`runs/g49bench_default_s<s>`).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from common import OFFLINE, ROOT, write_result  # noqa: F401  (ROOT on sys.path first)

from benchmarks import steady_pick
from benchmarks.steady_pick import _climb, record

G = ROOT / "runs" / "g52"
DATA = G / "data"
RECORDS = ROOT / "benchmarks" / "results" / "records"
CONFIG = "pipelines/demo.toml"
EVAL_SEEDS = 5
SEARCH = ["search.experts=0", "search.iterations=[8,8,8,4]", f"search.eval_seeds={EVAL_SEEDS}",
          "search.target_prior=0.5"]
PRESET = "demo"
PREFIX = "g52"  # records g52_<arm>_v<n>_s<seed>.json
MARGIN = 0.01  # each update's reused - full: the upper end of its interval below this
BASELINES: list[str] = []  # the first full search of a version trains these (the preset's own where empty)
# On the bench the chains run side by side, one per seed, so one seed's chain trains each version's
# baselines (None: whichever full search of the version comes first, as the demo's chains ran).
BASELINE_SEED: int | None = None
# The `reused` arm's own settings: on the demo, the component kept as found, as that sequence was
# measured (the library's default became 4 after it); on the bench, the library's defaults.
REUSED: list[str] = ["search.reuse_sharpen=0"]
# version -> (shards, extra settings); each version's base is a copy of the one before.
VERSIONS = {
    1: (["bbc-0", "bbc-1"], []),
    2: (["bbc-0", "bbc-1", "bbc-2"], []),
    3: (["bbc-0", "bbc-1", "bbc-2", "bbc-3"], []),
    4: (["bbc-0", "bbc-1", "bbc-2", "bbc-3", "code"], ["cluster.refit=true", "TOKENIZER"]),
    5: (["bbc-0", "bbc-2", "bbc-3", "code"], ["TOKENIZER"]),
}
UPDATES = {1: "a shard added (bbc-2)", 2: "a shard added (bbc-3)", 3: "a new source (code), clusters fitted again",
           4: "a shard removed (bbc-1)"}


def use(preset: str) -> None:
    """Point the module at a preset's sequence: the demo's (above) or the bench corpus's."""
    global G, DATA, CONFIG, SEARCH, PRESET, PREFIX, MARGIN, BASELINES, BASELINE_SEED, VERSIONS, UPDATES, REUSED
    if preset == "demo":
        return
    PRESET, PREFIX, MARGIN = "bench", "g52bench", 0.005
    G = ROOT / "runs" / "g52bench"
    DATA = G / "data"
    CONFIG = steady_pick.PRESETS["bench"]["config"]
    SEARCH = ["corpus.max_shards=0"]  # the preset's own search (iterations 8, 8, 8, 4; ten comparison seeds)
    BASELINES = ['search.baselines=["uniform","natural"]']
    BASELINE_SEED = 20
    REUSED = []
    parts = [f"part-0000{i}" for i in range(4)]
    VERSIONS = {
        1: (parts[:2], []),  # the bench preset's corpus (corpus.max_shards = 2)
        2: (parts[:3], []),
        3: (parts, []),
        4: (parts + ["code"], ["cluster.refit=true", "TOKENIZER"]),
        5: ([parts[0]] + parts[2:] + ["code"], ["TOKENIZER"]),
    }
    UPDATES = {1: "a shard added (part 2)", 2: "a shard added (part 3)",
               3: "a new source (the demo's code chunks), clusters fitted again", 4: "a shard removed (part 1)"}


def shard_path(name: str) -> Path:
    """Where a version's shard lies: the shared corpus's parts are read where they are."""
    if PRESET == "bench" and name.startswith("part-"):
        from common import CORPUS
        return CORPUS / f"{name}.parquet"
    return DATA / "shards" / f"{name}.parquet"


def _bench_preset_run(v: int, arm: str = "full") -> bool:
    """On the bench, v1 is the bench preset itself: its base and full runs are steady_pick's."""
    return PRESET == "bench" and v == 1 and arm == "full"


def base(v: int) -> Path:
    return steady_pick.names("bench") if _bench_preset_run(v) else G / f"base_v{v}"


def run_dir(arm: str, v: int, seed: int) -> Path:
    return steady_pick.names("bench", seed, "default") if _bench_preset_run(v, arm) else G / f"{arm}_v{v}_s{seed}"


def record_file(arm: str, v: int, seed: int) -> Path:
    name = run_dir(arm, v, seed).name if _bench_preset_run(v, arm) else f"{PREFIX}_{arm}_v{v}_s{seed}"
    return RECORDS / f"{name}.json"


def version_sets(v: int) -> list[str]:
    shards, extra = VERSIONS[v]
    paths = ", ".join(f'"{shard_path(s)}"' for s in shards)
    tok = f'proxy.tokenizer="{base(1) / "tokenize" / "tokenizer.json"}"'
    target = [] if PRESET == "bench" else [f'target.texts=["{DATA / "target" / "tech_heldout.jsonl"}"]']
    return (['corpus.build=""', f"corpus.paths=[{paths}]"] + target
            + [tok if e == "TOKENIZER" else e for e in extra])


def _args(v: int, more: list[str]) -> list[str]:
    return ["--config", CONFIG] + [a for s in version_sets(v) + more for a in ("--set", s)]


# ----------------------------------------------------------------- prepare
def prepare() -> None:
    """The shards (from the demo build) and each version's base: embedded, clustered, tokenised."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    shards = DATA / "shards"
    if not (shards / "code.parquet").exists():
        build = G / "build"
        if not (build / "corpus").exists():
            import subprocess
            subprocess.run([sys.executable, str(ROOT / "data" / "build_demo.py"), "--out", str(build)], check=True,
                           cwd=ROOT)
        shards.mkdir(parents=True, exist_ok=True)
        (DATA / "target").mkdir(parents=True, exist_ok=True)
        shutil.copy2(build / "target" / "tech_heldout.jsonl", DATA / "target" / "tech_heldout.jsonl")
        parts = sorted((build / "corpus").glob("*.parquet"))
        tables = [pq.read_table(p) for p in parts]
        for i, t in enumerate(tables):
            if PRESET == "demo":
                pq.write_table(t.filter(pc.equal(t["source"], "bbc")), shards / f"bbc-{i}.parquet")
        import pyarrow as pa
        code = pa.concat_tables([t.filter(pc.equal(t["source"], "code")) for t in tables])
        pq.write_table(code, shards / "code.parquet")
        print(f"shards: {', '.join(f'{p.stem} {pq.read_metadata(p).num_rows}' for p in sorted(shards.glob('*')))}",
              flush=True)
    if PRESET == "bench":  # the bench preset's base, built under the lock the steady-answer items share
        steady_pick.ensure_base("bench")
    for v in VERSIONS:
        b = base(v)
        if (b / "tokenize" / "manifest.json").exists() and (b / "config.toml").exists():
            continue
        if v > 1 and not b.exists():
            shutil.copytree(base(v - 1), b, copy_function=shutil.copy2)
        _climb(["tokenize", "--run", str(b)] + _args(v, []), G / f"base_v{v}.log")
        print(f"base v{v} ready", flush=True)


# ----------------------------------------------------------------- train
def _search(arm: str, v: int, seed: int, sets: list[str]) -> Path:
    run = run_dir(arm, v, seed)
    if not (run / "search" / "manifest.json").exists():
        if not run.exists():
            shutil.copytree(base(v), run, copy_function=shutil.copy2)
        _climb(["search", "--run", str(run)] + _args(v, [f"search.seed={seed}"] + SEARCH + sets),
               run.with_suffix(".log"))
    return run


def _keep(arm: str, v: int, seed: int, run: Path) -> None:
    f = record_file(arm, v, seed)
    if not f.exists():
        rec = record(run, known_answer=PRESET == "demo")
        from benchmarks.variant_pair import search_compute
        from climb.runtime.layout import RunPaths
        # None where the search trained no proxy to choose (a shard removed): nothing spent.
        rec["search_compute"] = search_compute(RunPaths(run)) or {"tokens": 0.0, "token_params": 0.0}
        reuse = run / "search" / "reuse.json"
        if reuse.exists():
            rec["reuse"] = json.loads(reuse.read_text())
        write_result(f, rec, indent=1)
        print(f"recorded {f.name}: found {rec['score']:.4f}", flush=True)


def _baselines_trained(v: int) -> bool:
    return any(json.loads(f.read_text()).get("comparison", {}).get(f"uniform/{c}")
               for f in RECORDS.glob(f"{PREFIX}_full_v{v}_s*.json")
               for c in json.loads(f.read_text())["comparison_seeds"][:1])


def kept_mixture(v: int, seed: int) -> list[float]:
    """The earlier answer on version v as it was: the earlier run's found mixture (same clusters) or,
    where the clusters were fitted again, the reused run's component (read through the documents)."""
    earlier = run_dir("full" if v == 2 else "reused", v - 1, seed)
    plan = run_dir("reused", v, seed) / "search" / "reuse_plan.json"
    if plan.exists() and json.loads(plan.read_text()).get("mode") == "virtual":
        return json.loads(plan.read_text())["weights"]
    return json.loads((earlier / "search" / "mixture.json").read_text())["weights"]


def _kept(v: int, seed: int) -> None:
    """The earlier answer unchanged, on the comparison seeds in the version's base."""
    f = record_file("kept", v, seed)
    have = json.loads(f.read_text()) if f.exists() else {}
    rec = json.loads(record_file("full", v, seed).read_text())
    cs = rec["comparison_seeds"]
    if len(have.get("objective", {})) == len(cs):
        return
    from climb.config import load_config
    from climb.runtime.executor import make_executor
    from climb.runtime.layout import RunPaths
    from climb.stages.search.common import proxy_task, run_proxies
    w = have.get("weights") or kept_mixture(v, seed)  # a kept file holds its mixture from its first proxy on
    reused = json.loads(record_file("reused", v, seed).read_text())
    if max(abs(a - b) for a, b in zip(w, reused["mixtures"]["weights"])) < 1e-12:  # the reused pick itself
        have = {"weights": w, "same_as": "reused", "objective": {str(c): reused["comparison"][f"climb/{c}"]["objective"]
                                                                  for c in cs}}
    else:
        cfg = load_config(ROOT / CONFIG, version_sets(v) + SEARCH + [f"search.seed={seed}"])
        have = {"weights": w, "objective": dict(have.get("objective", {}))}
        todo = [c for c in cs if str(c) not in have["objective"]]

        def got(i, r):
            have["objective"][str(todo[i])] = r["objective"]
            write_result(f, have, indent=1)
        with make_executor(cfg.executor, 1) as ex:
            run_proxies(cfg, ex, [proxy_task(cfg, RunPaths(base(v)), f"kept-v{v}-s{seed}-{c}", -1, w, c) for c in todo],
                        f"kept v{v} s{seed}", got)
    if "cluster_held_out_share" in rec:
        have["held_out_share"] = float(sum(a * b for a, b in zip(w, rec["cluster_held_out_share"])))
    write_result(f, have, indent=1)
    print(f"kept v{v} s{seed}: {sum(have['objective'].values()) / len(cs):.4f}", flush=True)


def _reused_sets(v: int, earlier: Path) -> list[str]:
    return [f'search.reuse="{earlier}"', "search.baselines=[]"] + REUSED


def earlier_run(v: int, seed: int) -> Path:
    """The finished run a reused search of version v names: v1's full search, else the chain's
    reused search of the version before. A machine that kept the records and not the run folders
    runs it again (each earlier one first, as the chain did) and checks that it finds its record's
    mixture, so the chain goes on from where its records stop instead of from nothing."""
    import numpy as np
    arm = "full" if v == 2 else "reused"
    run = run_dir(arm, v - 1, seed)
    if (run / "search" / "manifest.json").exists():
        return run
    if _bench_preset_run(v - 1, arm):
        return steady_pick.restore("bench", seed)
    print(f"{run.name}: only its record is here; its search runs again for the chain", flush=True)
    _search(arm, v - 1, seed, ["search.baselines=[]"] if arm == "full" else _reused_sets(v - 1, earlier_run(v - 1, seed)))
    rec = json.loads(record_file(arm, v - 1, seed).read_text())
    got = json.loads((run / "search" / "mixture.json").read_text())["weights"]
    if not np.allclose(got, rec["mixtures"]["weights"], atol=1e-6):
        raise SystemExit(f"{run.name}: run again, it finds another mixture than its record; the chain cannot go "
                         "on from it (its base or search is not the recorded one)")
    return run


def train(seeds: list[int], updates: list[int]) -> None:
    """Every run of the chains that has no record yet, in chain order. A run with a record is not
    trained again (a new machine keeps the records, not the run folders), except a chain's earlier
    run that a reused search still to come must name (`earlier_run`)."""
    prepare()
    for s in seeds:  # the chains' start: v1's full search (on the bench, the bench preset's own run)
        if PRESET == "bench":
            steady_pick.train("bench", [s], "default")
        elif not record_file("full", 1, s).exists():
            _keep("full", 1, s, _search("full", 1, s, ["search.baselines=[]"]))
    for u in updates:
        v = u + 1
        for s in seeds:
            if not record_file("full", v, s).exists():
                first = not _baselines_trained(v) and BASELINE_SEED in (None, s)
                _keep("full", v, s, _search("full", v, s, BASELINES if first else ["search.baselines=[]"]))
            if not record_file("reused", v, s).exists():
                _keep("reused", v, s, _search("reused", v, s, _reused_sets(v, earlier_run(v, s))))
            _kept(v, s)


# Other reused searches, each measured on one update against the same full searches (its own rule in
# docs/benchmarks/corpus-updates.md): arm -> (update, extra settings).
# arm -> (update, extra settings, the arm whose runs of the version before it reuses).
ARMS = {"reused-sharp": (3, ["search.reuse_sharpen=4"], "reused"),  # stopped after seed 0 (the pool of d8b2b1b)
        # the same setting once the component sharpened alone follows v at the head of the pool
        "reused-sharp-alone": (3, ["search.reuse_sharpen=4"], "reused"),
        # u4 on the chain whose u3 was the sharpened component's (the sequence `sharp`)
        "reused-after-sharp": (4, [], "reused-sharp-alone")}
# A sequence judged as a whole: update -> the arm whose runs it reads ("reused" where not named).
SEQUENCES = {"reused": {}, "sharp": {3: "reused-sharp-alone", 4: "reused-after-sharp"}}


def train_arm(arm: str, seeds: list[int]) -> None:
    """The arm's reused searches on its update, from the earlier runs its entry names."""
    u, sets, before = ARMS[arm]
    v = u + 1
    for s in seeds:
        earlier = run_dir("full" if v == 2 else before, v - 1, s)
        if not (earlier / "search" / "manifest.json").exists():
            print(f"{arm} s{s}: {earlier.name} is not finished yet; skipped", flush=True)
            continue
        _keep(arm, v, s, _search(arm, v, s, [f'search.reuse="{earlier}"', "search.baselines=[]"] + sets))


# ----------------------------------------------------------------- judge
def _baselines(v: int) -> dict:
    for f in sorted(RECORDS.glob(f"{PREFIX}_full_v{v}_s*.json")):
        rec = json.loads(f.read_text())
        cs = rec["comparison_seeds"]
        if f"uniform/{cs[0]}" in rec["comparison"]:
            return {n: {str(c): rec["comparison"][f"{n}/{c}"]["objective"] for c in cs} for n in ("uniform", "natural")}
    return {}


def judge(seeds: list[int], out: str | None, arm: str = "reused", sequence: str | None = None) -> dict:
    """Every update's reused runs against the full searches. `arm` names one arm for every update
    (an arm of one update judges that update alone); `sequence` names the arm per update instead."""
    import numpy as np

    from climb.optimize.quality import paired_comparison
    from scipy import stats as st
    updates, num, den, all_better = {}, 0.0, 0.0, True
    for u in UPDATES:
        v = u + 1
        rows = []
        a_u = SEQUENCES[sequence].get(u, "reused") if sequence else arm
        for s in seeds:
            fr, ff, fk = (record_file(a, v, s) for a in (a_u, "full", "kept"))
            if not (fr.exists() and ff.exists()):
                continue
            r, f = json.loads(fr.read_text()), json.loads(ff.read_text())
            goal = r["goal"]
            cs = [str(c) for c in f["comparison_seeds"]]
            vr = [r["comparison"][f"climb/{c}"]["objective"] for c in cs]
            vf = [f["comparison"][f"climb/{c}"]["objective"] for c in cs]
            base_v = _baselines(v)
            verdicts = {n: paired_comparison(vr, [b[c] for c in cs], r["goal"]) for n, b in base_v.items()}
            row = {"seed": s, "reused": float(np.mean(vr)), "full": float(np.mean(vf)),
                   "d": float(np.mean(vr) - np.mean(vf)), "values": {"reused": vr, "full": vf},
                   "paired": paired_comparison(vr, vf, r["goal"]),
                   "held_out_share": {"reused": r.get("held_out_share", {}).get("climb"),
                                      "full": f.get("held_out_share", {}).get("climb")},
                   "compute": {"reused": r["search_compute"]["token_params"],
                               "full": f["search_compute"]["token_params"]},
                   "decision": {k: r.get("reuse", {}).get(k) for k in ("mode", "decision", "spearman", "bias",
                                                                         "residual_sd", "residual_limit",
                                                                         "new_clusters", "removed_share",
                                                                         "replicates_inherited")},
                   "verdicts": {n: {"diff": x["diff"], "ci95": x["ci95"], "verdict": x["verdict"]}
                                for n, x in verdicts.items()}}
            row["arm"] = a_u
            if a_u == "reused" and fk.exists() and len(json.loads(fk.read_text())["objective"]) == len(cs):
                k = json.loads(fk.read_text())
                vk = [k["objective"][c] for c in cs]
                row["kept"] = {"found": float(np.mean(vk)), "minus_full": paired_comparison(vk, vf, r["goal"]),
                               "held_out_share": k.get("held_out_share")}
                fell_back = row["decision"]["decision"] in ("drifted", "fails")
                if fell_back:
                    worse = row["kept"]["minus_full"]["verdict"] == "worse"
                    row["fallback"] = "right (the kept mixture is worse than the full search's)" if worse else \
                        "not needed (the kept mixture is not resolved worse than the full search's)"
            rows.append(row)
        if not rows:
            continue
        d = np.array([x["d"] for x in rows])
        n = len(d)
        half = float(st.t.ppf(0.975, n - 1) * d.std(ddof=1) / np.sqrt(n)) if n > 1 else float("nan")
        pooled = paired_comparison([a for x in rows for a in x["values"]["reused"]],
                                   [b for x in rows for b in x["values"]["full"]], goal)
        better = all(vv["verdict"] == "better" for x in rows for vv in x["verdicts"].values()) and all(
            len(x["verdicts"]) == 2 for x in rows)
        all_better &= better
        cr, cf = sum(x["compute"]["reused"] for x in rows), sum(x["compute"]["full"] for x in rows)
        num, den = num + cr, den + cf
        updates[f"u{u}"] = {"update": UPDATES[u], "version": f"v{v}", "seeds": [x["seed"] for x in rows],
                            "per_seed": rows, "d_mean": float(d.mean()),
                            "ci95": [float(d.mean() - half), float(d.mean() + half)],
                            "ci95_pooled_comparison_seeds": pooled["ci95"], "compute_fraction": cr / cf,
                            "margin": MARGIN, "upper_below_margin": bool(n > 1 and d.mean() + half < MARGIN),
                            "beats_baselines": better}
    complete = len(updates) == len(UPDATES) and all(len(x["seeds"]) >= 3 for x in updates.values())
    checks = {"complete": complete, "compute": den > 0 and num / den <= 0.33,
              "each_update_upper": all(x["upper_below_margin"] for x in updates.values()),
              "beats_baselines": all_better}
    obj = {"preset": "demo tech, corpus updates" if PRESET == "demo" else "bench tasks, corpus updates",
           "arm": arm, "sequence": sequence,
           "arms": {f"u{u}": (SEQUENCES[sequence].get(u, "reused") if sequence else arm) for u in UPDATES}, "seeds": seeds, "updates": updates,
           "compute_fraction": num / den if den else None, "checks": checks, "passes": all(checks.values())}
    for name, x in updates.items():
        print(f"{name} ({x['update']}): reused - full {x['d_mean']:+.4f} [{x['ci95'][0]:+.4f}, {x['ci95'][1]:+.4f}] "
              f"over {len(x['seeds'])} seeds; compute {x['compute_fraction']:.2f}", flush=True)
        for r in x["per_seed"]:
            kept = f", kept {r['kept']['found']:.4f}" if "kept" in r else ""
            print(f"   s{r['seed']}: reused {r['reused']:.4f} full {r['full']:.4f}{kept}; "
                  f"{r['decision']['mode']} {r['decision']['decision'] or ''}", flush=True)
    print(json.dumps({k: obj[k] for k in ("compute_fraction", "checks", "passes")}, indent=1))
    if out:
        write_result(out, obj)
    return obj


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("verb", choices=["prepare", "train", "judge"])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--updates", type=int, nargs="+", default=list(UPDATES), choices=list(UPDATES))
    ap.add_argument("--arm", default="reused", choices=["reused"] + list(ARMS),
                    help="train / judge: the reused searches of the sequence, or another arm on its update")
    ap.add_argument("--sequence", default=None, choices=list(SEQUENCES),
                    help="judge: the sequence whose arm per update is named in SEQUENCES (instead of --arm)")
    ap.add_argument("--preset", default="demo", choices=["demo", "bench"],
                    help="the demo corpus's sequence, or the bench corpus's (shared data; skipped without it)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    if a.preset == "bench":
        from common import shared_or_skip
        if not shared_or_skip("corpus", "the bench corpus-update sequence", "*.parquet"):
            return
    use(a.preset)
    if a.verb == "prepare":
        prepare()
    elif a.verb == "train":
        train(a.seeds, a.updates) if a.arm == "reused" else train_arm(a.arm, a.seeds)
    else:
        judge(a.seeds, a.json, a.arm, a.sequence)


if __name__ == "__main__":
    main()
