"""Duplicates on real text: the shared corpus's own rate per cluster, and planted copies found.

On a finished bench run (embed, cluster; `runs/cbench_base`: the shared corpus's first two
shards), in a copy of it so the run itself is untouched:

1. the corpus as it is: the exact and near duplicates the cluster stage finds (its own
   rate per cluster, per source);
2. planted copies at known rates: `--rate` of the documents copied exactly (case,
   punctuation and spacing changed), `--rate` copied near (a tenth of the words replaced by
   random ones of the corpus, or a sentence cut), each under a new id, in one added shard.
   The added shard alone is embedded and assigned to the kept centroids (climb's own
   incremental path); then recall (a planted copy flagged as its source's duplicate, or
   its source as its) and precision (of the copies flagged, those flagged against their
   source) per kind, and the near threshold's sweep (`--thresholds`), from one kNN pass.
3. the dedup's seconds, against the cluster stage's own.

    python benchmarks/dedup_quality.py --base runs/cbench_base --config pipelines/bench.toml \\
        --set corpus.max_shards=2 --json benchmarks/results/dedup_quality.json
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from common import ROOT, offline_env, write_result


def plant(files: list[Path], out: Path, rate: float, seed: int) -> dict:
    """Write the planted shard; returns {copy id: (source id, kind)}."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    rng = np.random.default_rng(seed)
    docs = [r for f in files for r in pq.read_table(f, columns=["id", "text"]).to_pylist()]
    vocab = [w for d in rng.choice(docs, 500) for w in d["text"].split()]
    n = int(rate * len(docs))
    picks = rng.choice(len(docs), 2 * n, replace=False)
    rows, truth = [], {}
    for j, i in enumerate(picks):
        src = docs[i]
        if j < n:
            text = "  " + src["text"].upper().replace(". ", " .  ") + " ."
            kind = "exact"
        else:
            words = src["text"].split()
            if j % 2 and ". " in src["text"]:  # a sentence cut
                parts = src["text"].split(". ")
                del parts[int(rng.integers(len(parts)))]
                text = ". ".join(parts) if len(parts) > 1 else " ".join(words[: max(1, len(words) - 10)])
            else:  # a tenth of the words replaced
                for k in rng.choice(len(words), max(1, len(words) // 10), replace=False):
                    words[k] = str(rng.choice(vocab))
                text = " ".join(words)
            kind = "near"
        cid = f"planted-{kind}-{j:05d}"
        rows.append({"id": cid, "text": text})
        truth[cid] = (src["id"], kind)
    pq.write_table(pa.table({"id": [r["id"] for r in rows], "text": [r["text"] for r in rows]}), out)
    return truth


def flags(run: Path) -> dict:
    import pyarrow.parquet as pq
    out = {}
    for f in sorted((run / "cluster" / "assign").glob("*.parquet")):
        t = pq.read_table(f, columns=["id", "cluster", "duplicate", "duplicate_of", "duplicate_cluster"]).to_pylist()
        out.update({r["id"]: r for r in t})
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="runs/cbench_base")
    ap.add_argument("--config", default="pipelines/bench.toml")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--work", default="runs/dedup-quality")
    ap.add_argument("--rate", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    base, work = Path(args.base), Path(args.work)
    if not (base / "cluster" / "manifest.json").exists():
        raise SystemExit(f"{base}: no finished cluster stage")
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(base, work, ignore=shutil.ignore_patterns("search*", "export", "report", "tokenize"))
    if "duplicates" not in json.loads((work / "cluster" / "manifest.json").read_text())["stats"]:
        # a base clustered before duplicates were counted: its cluster stage runs again (centroids kept)
        (work / "cluster" / "manifest.json").unlink()
    from climb.config import load_config
    cfg = load_config(args.config, args.set)
    from climb.io.files import resolve_corpus_files
    files = [Path(f) for f in resolve_corpus_files(cfg.corpus.paths)][: cfg.corpus.max_shards or None]

    def cluster(extra: list[str]) -> dict:
        cmd = [sys.executable, "-m", "climb.cli", "cluster", "--config", args.config, "--run", str(work)]
        for s in args.set + extra:
            cmd += ["--set", s]
        t0 = time.time()
        subprocess.run(cmd, check=True, cwd=ROOT, env=offline_env(), stdout=subprocess.DEVNULL)
        st = json.loads((work / "cluster" / "manifest.json").read_text())["stats"]
        return {**st, "wall_seconds": round(time.time() - t0, 1)}
    out: dict = {"base": str(base), "rate": args.rate}
    # 1. the corpus as it is
    st = cluster([])
    summary = json.loads((work / "cluster" / "clusters.json").read_text())
    out["own"] = {"stats": st["duplicates"], "seconds": st["seconds"],
                  "per_cluster": [{"cluster": c["cluster"], "docs": c["docs"], **c["duplicates"],
                                   "top_terms": c["top_terms"][:4]} for c in summary["clusters"]]}
    print("own duplicates:", st["duplicates"])
    # 2. planted copies in an added shard
    planted = work / "planted"
    planted.mkdir(exist_ok=True)
    truth = plant(files, planted / "zz-planted.parquet", args.rate, args.seed)
    paths = [str(f) for f in files] + [str(planted / "zz-planted.parquet")]
    sets = [f"corpus.paths={json.dumps(paths)}", "corpus.max_shards=0"]
    t0 = time.time()
    subprocess.run([sys.executable, "-m", "climb.cli", "embed", "--config", args.config, "--run", str(work)]
                   + [a for s in args.set + sets for a in ("--set", s)], check=True, cwd=ROOT, env=offline_env(),
                   stdout=subprocess.DEVNULL)
    embed_seconds = time.time() - t0
    st2 = cluster(sets)
    got = flags(work)
    res = {}
    for kind in ("exact", "near"):
        ours = {c: s for c, (s, k) in truth.items() if k == kind}
        found = sum((got[c]["duplicate"] > 0 and got[c]["duplicate_of"] == s)
                    or (got[s]["duplicate"] > 0 and got[s]["duplicate_of"] == c) for c, s in ours.items())
        flagged = [c for c in ours if got[c]["duplicate"] > 0]
        right = sum(got[c]["duplicate_of"] == ours[c] for c in flagged)
        res[kind] = {"planted": len(ours), "found": int(found), "recall": found / max(1, len(ours)),
                     "flagged": len(flagged), "precision": right / max(1, len(flagged))}
        print(kind, res[kind])
    fresh = [i for i, r in got.items() if not i.startswith("planted-")]
    res["unplanted_flagged"] = sum(got[i]["duplicate"] > 0 for i in fresh)
    out["planted"] = {**res, "embed_seconds_added_shard": round(embed_seconds, 1), "stats": st2["duplicates"],
                      "assigned_now": st2.get("assigned_now"), "cluster_seconds": st2["seconds"]}
    if args.json:
        write_result(Path(args.json), out, indent=1)


if __name__ == "__main__":
    main()
