"""Does a finished demo run find the demo's known answer?

The demo's target is bits per byte on held-out BBC *tech* articles, so the
right mixture leans on the clusters rich in tech news (or on another section's, with
`corpus.build = "demo:<section>"`: the figures below are then that section's, still
under the names `tech_share`). The demo corpus keeps
each document's section in its `label` column (the pipeline never reads it);
this script uses it to measure, for a finished run:

- each cluster's tech share: the share of its proxy tokens that come from tech
  articles;
- each mixture's tech share: its weights times those cluster shares;
- Spearman(tech share, objective) over the search's proxies (the proxies see
  the answer when it is strongly negative for a loss);
- the found mixture's tech share, against the natural and uniform ones;
- the predictor's out-of-fold Spearman and the comparison verdicts, read from
  the run's quality and comparison files, and each compared mixture's mean score.

    python benchmarks/demo_answer.py --run runs/demo [--json out.json]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from scipy.stats import spearmanr

from common import run_paths, show, write_result

TARGET_LABEL = "tech"


def cluster_label_shares(run: Path, label: str = TARGET_LABEL) -> np.ndarray:
    """Per cluster, the share of its tokens from documents with `label` (pruned documents skipped)."""
    from climb.config import load_config
    from proxies.tokenizer import load_tokenizer
    paths = run_paths(run)
    tok = load_tokenizer(paths.tokenize.tokenizer)
    files = paths.shard_files(load_config(paths.config))
    hit = np.zeros(paths.n_clusters())
    total = np.zeros(paths.n_clusters())
    for shard in paths.shards():
        f = files[shard]
        docs = pq.read_table(f, columns=["text", "label"]).to_pylist()
        clusters = pq.read_table(paths.cluster.assignments(shard), columns=["cluster"])["cluster"].to_numpy()
        if len(clusters) != len(docs):
            raise SystemExit(f"{f} has {len(docs)} rows but its assignments {len(clusters)}: a stale run")
        lengths = [len(ids) + 1 for ids in tok.encode_batch([d["text"] for d in docs])]  # + EOS, as the store
        for d, c, n in zip(docs, clusters, lengths):
            if c >= 0:
                total[c] += n
                hit[c] += n * (d["label"] == label)
    return np.divide(hit, total, out=np.zeros_like(hit), where=total > 0)


def held_out_label(run: Path) -> str:
    """The label of the run's held-out section (the code domain's documents are "python")."""
    from climb.config import load_config
    from climb.stages.embed.demo import section
    build = load_config(run_paths(run).config).corpus.build or "demo"
    name = section(build)
    return "python" if name == "code" else name


def analyse(run: Path) -> dict:
    paths = run_paths(run)
    label = held_out_label(run)
    shares = cluster_label_shares(run, label)
    recs = [json.loads(line) for line in paths.search.results.read_text().splitlines() if line.strip()]
    ok = [r for r in recs if r.get("status") == "ok" and r.get("objective") is not None]
    tech = np.array([np.asarray(r["weights"]) @ shares for r in ok])
    obj = np.array([r["objective"] for r in ok])
    rho = float(spearmanr(tech, obj).statistic) if len(ok) > 2 else None
    mix = json.loads(paths.search.mixture.read_text())
    out = {"run": str(run), "held_out": label, "proxies": len(ok), "spearman_tech_share_objective": rho,
           "tech_share": {k: float(np.asarray(mix[k]) @ shares) for k in ("weights", "natural", "uniform")},
           "cluster_tech_share": [round(float(s), 4) for s in shares]}
    out["tech_share"]["climb"] = out["tech_share"].pop("weights")
    if paths.search.quality.exists():
        q = json.loads(paths.search.quality.read_text())
        out["oof_spearman_last"] = (q.get("predictor_oof_spearman") or [None])[-1]
        out["snr"] = q.get("snr")
        out["comparison"] = q.get("comparison")
    if paths.manifest("search").exists():  # each compared mixture's mean target score over the comparison seeds
        out["score"] = paths.stats("search").get("comparison")
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", default="runs/demo")
    ap.add_argument("--json", default="", help="also write the figures here")
    a = ap.parse_args(argv)
    out = analyse(Path(a.run))
    show(out, indent=1)
    if a.json:
        write_result(Path(a.json), out, indent=1)


if __name__ == "__main__":
    main()
