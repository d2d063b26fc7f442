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

`--tune-sample N` (0: off) adds the two students of `climb.stages.embed.tuned`,
taught by the torch default on N documents drawn (by the seeded hash of their ids)
from the corpus's other documents, every source, none of the measured ones: T, the
static model trained to the teacher's PCA'd vectors, and L, the static embedding
with a ridge map into the teacher's space. For each, the seconds of the teacher's
pass over the sample and of the fit, its own documents per second, and the corpus
size from which its end-to-end rate (teacher pass and fit counted) reaches 20x the
torch default's (BENCHMARKS.md, "A static embedding trained on the corpus").
"""
from __future__ import annotations

import argparse

import numpy as np
import pyarrow.parquet as pq

from common import RESULTS, go_offline, machine, shared_or_skip, show, timer, write_result


def labelled_docs(corpus, n: int) -> tuple[list[str], list[str], list[str], list[str]]:
    texts, labels, sources, ids = [], [], [], []
    for f in sorted(corpus.glob("part-*.parquet")):
        t = pq.read_table(f, columns=["id", "text", "label", "source"]).to_pydict()
        for i, text, label, source in zip(t["id"], t["text"], t["label"], t["source"]):
            if source != "wikipedia" and label:
                texts.append(text)
                labels.append(label)
                sources.append(source)
                ids.append(i)
                if len(texts) == n:
                    return texts, labels, sources, ids
    return texts, labels, sources, ids


def sample_docs(corpus, n: int, exclude: set[str], seed: int = 0) -> tuple[list[str], list[str]]:
    """`n` documents of the whole corpus, none of `exclude`, by climb's seeded hash of their ids."""
    from climb.stages.embed.tuned import draw_sample
    files = sorted(corpus.glob("part-*.parquet"))
    ids = [i for f in files for i in pq.read_table(f, columns=["id"]).column("id").to_pylist() if i not in exclude]
    chosen = draw_sample(ids, n, seed)
    want = set(chosen)
    text = {}
    for f in files:
        t = pq.read_table(f, columns=["id", "text"]).to_pydict()
        text.update((i, x) for i, x in zip(t["id"], t["text"]) if i in want)
    return chosen, [text[i] for i in chosen]


def break_even(teacher_seconds: float, fit_seconds: float, student_rate: float, torch_rate: float,
               ratio: float = 20.0) -> int | None:
    """The smallest corpus size N at which N / (teacher + fit + N / student) >= ratio x torch's rate."""
    gain = 1.0 / torch_rate - ratio / student_rate
    if gain <= 0:
        return None  # the student alone is not `ratio` x faster: no size reaches it
    return int(np.ceil(ratio * (teacher_seconds + fit_seconds) / gain))


def agreement(emb: np.ndarray, labels: list[str], sources: list[str], ks=(20, 50), seed: int = 0) -> dict:
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

    from climb.stages.cluster.kmeans import assign, train_kmeans
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
    ap.add_argument("--tune-sample", type=int, default=0,
                    help="documents the students T and L learn from (0: measure the static and torch backends only)")
    ap.add_argument("--out", default=str(RESULTS / "embed_static.json"))
    a = ap.parse_args(argv)
    corpus = shared_or_skip("corpus", "embed_static", "*.parquet")
    if corpus is None:
        return 0
    go_offline()
    from climb.config import EmbedConfig
    from climb.stages.embed import encode, load_model
    texts, labels, sources, ids = labelled_docs(corpus, a.docs)
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
    if a.tune_sample:
        tune(res, corpus, texts, labels, sources, set(ids), a.tune_sample)
    b = res["backends"]
    res["static_speedup"] = round(b["static"]["docs_per_s"] / b["torch"]["docs_per_s"], 1)
    res["target"] = "static >= 20x the torch default's docs/s"
    res["environment"] = machine("python", "torch", "cpus", "load_avg", "date")
    write_result(a.out, res)
    show(res, "docs", "static_speedup")
    return 0


def tune(res: dict, corpus, texts, labels, sources, exclude: set[str], n: int) -> None:
    """T and L taught by the torch default on `n` other documents; measured as the backends are."""
    from climb.config import EmbedConfig
    from climb.stages.embed import encode, load_model
    from climb.stages.embed.tuned import TunedEncoder, fit_linear, fit_tuned
    cfg = EmbedConfig(backend="torch")
    window = cfg.max_seq_length
    _, sample = sample_docs(corpus, n, exclude)
    teacher = load_model(cfg)
    with timer() as t_teacher:
        targets = encode(teacher, sample, cfg)
    static = load_model(EmbedConfig(backend="static")).model
    torch_rate = res["backends"]["torch"]["docs_per_s"]
    res["tune"] = {"sample": len(sample), "teacher_seconds": round(t_teacher.seconds, 1),
                   "teacher_docs_per_s": round(len(sample) / t_teacher.seconds, 1)}
    with timer() as t_fit:
        tuned = fit_tuned(static, sample, targets, window)
    students = {"T": (TunedEncoder(tuned, None, window, "tuned"), t_fit.seconds)}
    raw = TunedEncoder(static, None, window, "static")
    with timer() as t_fit:
        linear = fit_linear(raw.encode(sample, normalize_embeddings=False), targets)
    students["L"] = (TunedEncoder(static, linear, window, "linear"), t_fit.seconds)
    res["tune"]["ridge_alpha"] = linear["alpha"]
    for name, (model, fit_seconds) in students.items():
        model.encode(texts[:64])  # warm-up
        with timer() as t:
            emb = model.encode(texts)
        rate = len(texts) / t.seconds
        res["backends"][name] = {
            "backend": model.climb_backend, "dims": int(emb.shape[1]), "fit_seconds": round(fit_seconds, 1),
            "seconds": round(t.seconds, 2), "docs_per_s": round(rate, 1),
            "agreement": agreement(emb, labels, sources),
            "twenty_x_from_docs": break_even(t_teacher.seconds, fit_seconds, rate, torch_rate)}


if __name__ == "__main__":
    raise SystemExit(main())
