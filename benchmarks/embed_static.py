"""The static embedding against the torch default, side by side on the same documents:
documents per second, and how well k-means on each agrees with the corpus's own labels.

    python benchmarks/embed_static.py [--docs 6000] [--out benchmarks/results/embed_static.json]

The documents are the first `--docs` labelled, non-Wikipedia documents of the shared
corpus's first shards (Wikipedia passages carry no label beyond their source), in
file order. Both backends embed them with climb's own `encode` at the default
window (256 tokens); the static model is distilled first if it is not cached (timed
apart: `static_load_seconds`). Then FAISS k-means (k = 20 and 50, the same seed and
settings for both) on each backend's embeddings, and the normalised mutual
information and adjusted Rand index of the clusters against `label` and `source`.
The labels only measure; nothing in climb reads them.
"""
from __future__ import annotations

import argparse

import numpy as np
import pyarrow.parquet as pq

from common import RESULTS, go_offline, machine, shared_or_skip, show, timer, write_result


def labelled_docs(corpus, n: int) -> tuple[list[str], list[str], list[str]]:
    texts, labels, sources = [], [], []
    for f in sorted(corpus.glob("part-*.parquet")):
        t = pq.read_table(f, columns=["text", "label", "source"]).to_pydict()
        for text, label, source in zip(t["text"], t["label"], t["source"]):
            if source != "wikipedia" and label:
                texts.append(text)
                labels.append(label)
                sources.append(source)
                if len(texts) == n:
                    return texts, labels, sources
    return texts, labels, sources


def agreement(emb: np.ndarray, labels: list[str], sources: list[str], ks=(20, 50), seed: int = 0) -> dict:
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

    from climb.stages.kmeans import assign, train_kmeans
    out = {}
    for k in ks:
        centroids, _ = train_kmeans(emb, k, niter=25, seed=seed)
        cl, _ = assign(emb, centroids)
        out[f"k{k}"] = {"nmi_label": round(float(normalized_mutual_info_score(labels, cl)), 4),
                        "ari_label": round(float(adjusted_rand_score(labels, cl)), 4),
                        "nmi_source": round(float(normalized_mutual_info_score(sources, cl)), 4)}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=6000)
    ap.add_argument("--out", default=str(RESULTS / "embed_static.json"))
    a = ap.parse_args(argv)
    corpus = shared_or_skip("corpus", "embed_static", "*.parquet")
    if corpus is None:
        return 0
    go_offline()
    from climb.config import EmbedConfig
    from climb.stages.embed import encode, load_model
    texts, labels, sources = labelled_docs(corpus, a.docs)
    res = {"name": "embed_static", "docs": len(texts), "labels": len(set(labels)), "sources": len(set(sources)),
           "chars": sum(map(len, texts)), "backends": {}}
    for backend in ("static", "torch"):
        cfg = EmbedConfig(backend=backend)
        with timer() as t_load:
            model = load_model(cfg)
        encode(model, texts[:64], cfg)  # warm-up
        with timer() as t:
            emb = encode(model, texts, cfg)
        res["backends"][backend] = {"backend": model.climb_backend, "dims": int(emb.shape[1]),
                                    "load_seconds": round(t_load.seconds, 1), "seconds": round(t.seconds, 2),
                                    "docs_per_s": round(len(texts) / t.seconds, 1),
                                    "agreement": agreement(emb, labels, sources)}
    b = res["backends"]
    res["static_speedup"] = round(b["static"]["docs_per_s"] / b["torch"]["docs_per_s"], 1)
    res["target"] = "static >= 20x the torch default's docs/s"
    res["environment"] = machine("python", "torch", "cpus", "load_avg", "date")
    write_result(a.out, res)
    show(res, "docs", "static_speedup")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
