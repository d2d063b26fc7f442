"""Does a finished demo run find the demo's known answer?

The demo's target is bits per byte on held-out BBC *tech* articles, so the
right mixture leans on the clusters rich in tech news. The demo corpus keeps
each document's section in its `label` column (the pipeline never reads it);
this script uses it to measure, for a finished run:

- each cluster's tech share: the share of its proxy tokens that come from tech
  articles;
- each mixture's tech share: its weights times those cluster shares;
- Spearman(tech share, objective) over the search's proxies (the proxies see
  the answer when it is strongly negative for a loss);
- the found mixture's tech share, against the natural and uniform ones;
- the predictor's out-of-fold Spearman and the comparison verdicts, read from
  the run's quality and comparison files.

    python benchmarks/demo_answer.py --run runs/demo [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from scipy.stats import spearmanr

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGET_LABEL = "tech"


def cluster_label_shares(run: Path, label: str = TARGET_LABEL) -> np.ndarray:
    """Per cluster, the share of its tokens from documents with `label` (pruned documents skipped)."""
    from proxies.tokenizer import load_tokenizer
    tok = load_tokenizer(run / "tokenize" / "tokenizer.json")
    n_clusters = json.loads((run / "cluster" / "clusters.json").read_text())["n_clusters"]
    hit = np.zeros(n_clusters)
    total = np.zeros(n_clusters)
    for f in sorted((run / "data" / "corpus").glob("*.parquet")):
        docs = pq.read_table(f, columns=["text", "label"]).to_pylist()
        clusters = pq.read_table(run / "cluster" / "assign" / f"{f.stem}.parquet",
                                 columns=["cluster"])["cluster"].to_numpy()
        if len(clusters) != len(docs):
            raise SystemExit(f"{f} has {len(docs)} rows but its assignments {len(clusters)}: a stale run")
        lengths = [len(ids) + 1 for ids in tok.encode_batch([d["text"] for d in docs])]  # + EOS, as the store
        for d, c, n in zip(docs, clusters, lengths):
            if c >= 0:
                total[c] += n
                hit[c] += n * (d["label"] == label)
    return np.divide(hit, total, out=np.zeros_like(hit), where=total > 0)


def analyse(run: Path) -> dict:
    shares = cluster_label_shares(run)
    recs = [json.loads(line) for line in (run / "search" / "results.jsonl").read_text().splitlines() if line.strip()]
    ok = [r for r in recs if r.get("status") == "ok" and r.get("objective") is not None]
    tech = np.array([np.asarray(r["weights"]) @ shares for r in ok])
    obj = np.array([r["objective"] for r in ok])
    rho = float(spearmanr(tech, obj).statistic) if len(ok) > 2 else None
    mix = json.loads((run / "search" / "mixture.json").read_text())
    out = {"run": str(run), "proxies": len(ok), "spearman_tech_share_objective": rho,
           "tech_share": {k: float(np.asarray(mix[k]) @ shares) for k in ("weights", "natural", "uniform")},
           "cluster_tech_share": [round(float(s), 4) for s in shares]}
    out["tech_share"]["climb"] = out["tech_share"].pop("weights")
    quality = run / "search" / "quality.json"
    if quality.exists():
        q = json.loads(quality.read_text())
        out["oof_spearman_last"] = (q.get("predictor_oof_spearman") or [None])[-1]
        out["snr"] = q.get("snr")
        out["comparison"] = q.get("comparison")
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", default="runs/demo")
    ap.add_argument("--json", default="", help="also write the figures here")
    a = ap.parse_args(argv)
    out = analyse(Path(a.run))
    text = json.dumps(out, indent=1)
    print(text)
    if a.json:
        Path(a.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
