"""Does the search's answer survive the tuned embedding? Parts (b) and (c) of the rule in
BENCHMARKS.md ("A static embedding trained on the corpus"), run and judged.

    python benchmarks/embed_tuned_demo.py --variant tech --seeds 40 41 ... 49 --train \
        --json benchmarks/results/embed_tuned_demo_tech.json
    python benchmarks/embed_tuned_demo.py --variant sport --seeds 40 ... 49 --train ...
    python benchmarks/embed_tuned_demo.py --student tfidf --variant tech --seeds 50 ... 59 --train \
        --json benchmarks/results/embed_ridge_demo_tech.json   # R's (b), "A TF-IDF student"

For each backend (`torch`, the default, and `tuned` with `embed.tune_sample = 1000`) one base
folder (`runs/e35_<variant>_<backend>_base`; `--student tfidf` names the tuned folders `tfidf`: the demo corpus built, embedded, clustered and
tokenised once), and per search seed its search on a copy (`runs/e35_<variant>_<backend>_s<seed>`),
the demo's own search. Each finished run's record is kept in `--records` (default
`benchmarks/results/records`), so a later session trains only the seeds not recorded and
judges from the records. `--share-baselines`: one run per backend trains uniform and natural
(their proxies are the same mixtures with the same comparison seeds on the same base, so the
same whatever the search seed) and every run is judged against its base's. The verdict: every tuned run beats uniform and natural at 95% (its own
comparison), and tuned minus torch, paired by search seed, has a 95% upper end below +0.01 bpb.
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from common import write_result

ROOT = Path(__file__).resolve().parents[1]
MARGIN = 0.01
VARIANTS = {
    "tech": [],
    "sport": ['corpus.build="demo:sport"', 'target.texts=["{run}/data/target/sport_heldout.jsonl"]'],
}
BACKENDS = {"torch": ['embed.backend="torch"'], "tuned": ['embed.backend="tuned"', "embed.tune_sample=1000"]}


STUDENT = {"tokens": "tuned", "tfidf": "tfidf", "linear": "linear"}  # embed.student -> its folders' name


def _args(variant: str, backend: str) -> list[str]:
    sets = BACKENDS.get(backend) or BACKENDS["tuned"] + [f'embed.student="{_student(backend)}"']
    return ["--config", "pipelines/demo.toml"] + [a for s in VARIANTS[variant] + sets for a in ("--set", s)]


def _student(name: str) -> str:
    return {v: k for k, v in STUDENT.items()}[name]


def train(variant: str, backend: str, seed: int, runs: Path, baselines: bool = True) -> Path:
    """`backend`: "torch", or a student's folder name (STUDENT's values). `baselines=False`: the
    search trains no uniform and natural proxies (another run on the same base holds them)."""
    from cheaper_search import _climb
    run = runs / f"e35_{variant}_{backend}_s{seed}"
    if (run / "search" / "manifest.json").exists():
        return run
    base = runs / f"e35_{variant}_{backend}_base"
    if not (base / "tokenize" / "manifest.json").exists():
        _climb(["tokenize", "--run", str(base)] + _args(variant, backend), f"{base}.log")
    if not run.exists():
        shutil.copytree(base, run, copy_function=shutil.copy2)
    sets = [f"search.seed={seed}"] + ([] if baselines else ["search.baselines=[]"])
    _climb(["search", "--run", str(run)] + _args(variant, backend) + [a for x in sets for a in ("--set", x)],
           f"{run}.log")
    return run


def judge(tuned: list, torch: list, shared: list | None = None) -> dict:
    """`shared`: the runs holding the baselines, one per base (each run is judged against the
    one that searched on its base); None: each run against its own."""
    from benchmarks.variant_pair import compare
    out = compare(tuned, torch, MARGIN, baselines_run=shared or None)
    beats = [all(x["baselines"].get(b, {}).get("verdict") == "better" for b in ("uniform", "natural"))
             for x in out["a"]]
    c = out["comparison"]
    return {"seeds": [x["search_seed"] for x in out["a"]], "tuned_bpb": [x["score"] for x in out["a"]],
            "torch_bpb": [x["score"] for x in out["b"]], "diff": c,
            "held_out_share": {"tuned": [r.get("held_out_share", {}).get("climb") for r in tuned],
                               "torch": [r.get("held_out_share", {}).get("climb") for r in torch]},
            "baselines": [x["baselines"] for x in out["a"]],
            "criteria": {"beats_baselines": all(beats), "non_inferior": bool(out["a_no_worse_than_b"])},
            "passes": all(beats) and bool(out["a_no_worse_than_b"])}


def main(argv=None) -> None:
    sys.path.insert(0, str(ROOT))
    from cheaper_search import _has_baselines, load
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", choices=list(VARIANTS), default="tech")
    ap.add_argument("--seeds", type=int, nargs="+", default=list(range(40, 50)))
    ap.add_argument("--student", choices=list(STUDENT), default="tokens", help="embed.student of the tuned runs")
    ap.add_argument("--runs", default="runs")
    ap.add_argument("--train", action="store_true", help="train the runs not yet recorded first, seed by seed")
    ap.add_argument("--records", default="benchmarks/results/records")
    ap.add_argument("--json", default="")
    ap.add_argument("--share-baselines", action="store_true",
                    help="per backend, one run (the first seed's recorded with them, else the first trained) "
                         "trains uniform and natural and every run on its base is judged against those")
    a = ap.parse_args(argv)
    runs, records = Path(a.runs), Path(a.records)
    names = {"torch": "torch", "tuned": STUDENT[a.student]}
    recs = {b: [] for b in names}
    holders: dict[str, dict] = {}
    for seed in a.seeds:
        for backend, name in names.items():
            run = runs / f"e35_{a.variant}_{name}_s{seed}"
            rec = load(run, records, known_answer=True)
            if rec is None and a.train:
                own = not a.share_baselines or backend not in holders
                rec = load(train(a.variant, name, seed, runs, baselines=own), records, known_answer=True)
            if rec is not None and backend not in holders and _has_baselines(rec):
                holders[backend] = rec
            recs[backend].append(rec)
    done = [i for i, s in enumerate(a.seeds) if all(recs[b][i] is not None for b in names)]
    res = {"variant": a.variant, "student": a.student, "margin": MARGIN, "seeds_done": [a.seeds[i] for i in done],
           "seeds_asked": a.seeds}
    shared = list(holders.values()) if a.share_baselines else None
    if shared:
        res["baselines_runs"] = [h["run"] for h in shared]
    if len(done) >= 2:
        res.update(judge([recs["tuned"][i] for i in done], [recs["torch"][i] for i in done], shared))
    if a.json:
        write_result(a.json, res)
    print({k: res.get(k) for k in ("variant", "seeds_done", "diff", "criteria", "passes")})


if __name__ == "__main__":
    main()
