"""Clustering quality of a finished run against the corpus's own labels.

The pipeline never reads labels; this script uses them only to measure: NMI and
purity of the fine (k-means) and final (merged) clusters against `source` and
`label` columns of the corpus.

    python benchmarks/cluster_quality.py --run runs/bench [--config pipelines/bench.toml]
"""
from __future__ import annotations

import argparse

import numpy as np
import pyarrow.parquet as pq
from sklearn.metrics import normalized_mutual_info_score

from common import run_paths, show
from climb.config import load_config
from climb.stages.embed import shard_name


def purity(clusters: np.ndarray, labels: np.ndarray) -> float:
    total = 0
    for c in np.unique(clusters):
        _, counts = np.unique(labels[clusters == c], return_counts=True)
        total += counts.max()
    return total / len(labels)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--run", required=True)
    ap.add_argument("--config", default=None, help="defaults to <run>/config.toml")
    args = ap.parse_args()
    paths = run_paths(args.run)
    cfg = load_config(args.config or paths.root / "config.toml")
    files = {shard_name(f): f for f in paths.corpus_files(cfg)}
    fine, final, labs = [], [], {"source": [], "label": []}
    for s in paths.shards():
        a = pq.read_table(paths.cluster.assignments(s))
        cols = [c for c in ("id", "source", "label") if c in pq.read_schema(files[s]).names]
        meta = pq.read_table(files[s], columns=cols).to_pydict()
        by_id = {i: k for k, i in enumerate(meta["id"])}
        rows = [by_id[i] for i in a["id"].to_pylist()]
        fine.append(a["fine"].to_numpy())
        final.append(a["cluster"].to_numpy())
        for c in labs:
            labs[c] += [meta[c][r] if c in meta else "" for r in rows]
    fine_a, final_a = np.concatenate(fine), np.concatenate(final)
    out = {"docs": int(len(fine_a)), "k": int(fine_a.max() + 1), "clusters": int(final_a.max() + 1)}
    for c, values in labs.items():
        y = np.array([v or "none" for v in values])
        if len(set(y)) < 2:
            continue
        out[f"nmi_fine_vs_{c}"] = round(normalized_mutual_info_score(y, fine_a), 4)
        out[f"nmi_merged_vs_{c}"] = round(normalized_mutual_info_score(y, final_a), 4)
        out[f"purity_fine_vs_{c}"] = round(purity(fine_a, y), 4)
        out[f"purity_merged_vs_{c}"] = round(purity(final_a, y), 4)
    show(out, indent=2)


if __name__ == "__main__":
    main()
