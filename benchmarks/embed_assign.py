"""Sample and assign against the torch default: centroids from the teacher's k-means on a
sample of the corpus, every other document placed by a cheap student that never runs the
transformer. How well do the student's clusters agree with the corpus's labels, and how
fast is it end to end?

    python benchmarks/embed_assign.py --skip 0 --docs 6000 --sample 20000 \\
        --out benchmarks/results/embed_assign.json          # the rule's measurement
    python benchmarks/embed_assign.py --skip 6000 --docs 3000 --sample 10000 --pilot \\
        --out benchmarks/results/embed_assign_pilot.json    # the pilot, on other documents
    python benchmarks/embed_assign.py --skip 0 --docs 6000 --sample 20000 --ridge \\
        --out benchmarks/results/embed_ridge.json           # R, the TF-IDF student in the teacher's space

The measured documents are the labelled non-Wikipedia documents `--skip` .. `--skip +
--docs` of the shared corpus in file order (`embed_static.py`'s are the first 6,000). The
sample is `--sample` documents of the rest of the corpus (every source, by climb's seeded
hash of the ids), none of the first `--skip + --docs` labelled ones.

For k = 20 and 50, NMI with the labels of:

- `torch_kmeans`: k-means on the teacher's vectors of the measured documents (the protocol
  of `embed_static.py`, and the reference the rules compare with);
- `torch_assign`: the teacher's k-means on the sample, each measured document placed by the
  teacher at its nearest centroid (the most sample and assign can reach);
- `student`: the same centroids, each measured document placed by
  `climb.stages.embed.student` (TF-IDF, logistic regression trained on the sample's
  teacher clusters, C by cross-validation on the sample), and `student_agrees`, the share
  of documents it places where `torch_assign` does.

`--pilot` adds the students the pilot compared it with (the static embedding and its ridge
map into the teacher's space, by k-means on the measured documents and at the sample's
centroids; a logistic regression on the static vectors). Speeds: the teacher's documents
per second on the measured documents and on the sample, the student's (TF-IDF and
prediction) and the static embedding's (which a run would still compute for the vectors
later stages read), and the corpus size from which the end-to-end rate (the teacher's pass
over the sample and the student's fit counted) reaches 20x the teacher's.
The teacher's vectors are cached in `--cache` (npz, keyed by the arguments).

`--ridge` measures R instead (`climb.stages.embed.tfidf`: TF-IDF vectors ridge-mapped into
the teacher's space, fit on the sample, k-means on the measured documents' student
vectors): NMI at k-means seeds `--kmeans-seeds` for torch and R, their means, R's cosine
with the teacher, and the speeds, the teacher's timed again beside the student's (on 500
measured and 500 sample documents) so that both see the same load.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from common import RESULTS, go_offline, machine, shared_or_skip, show, write_result
from embed_static import break_even, labelled_docs, sample_docs


def _timed(f, *a):
    t0 = time.perf_counter()
    out = f(*a)
    return out, time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sample", type=int, default=20000)
    ap.add_argument("--skip", type=int, default=0)
    ap.add_argument("--docs", type=int, default=6000)
    ap.add_argument("--pilot", action="store_true", help="also the students the pilot compared")
    ap.add_argument("--ridge", action="store_true", help="measure R, the TF-IDF student in the teacher's space")
    ap.add_argument("--kmeans-seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--cache", default="/tmp")
    ap.add_argument("--out", default=str(RESULTS / "embed_assign.json"))
    a = ap.parse_args(argv)
    corpus = shared_or_skip("corpus", "embed_assign", "*.parquet")
    if corpus is None:
        return 0
    go_offline()
    from sklearn.metrics import normalized_mutual_info_score as nmi

    from climb.config import EmbedConfig
    from climb.stages.embed.student import fit_student, predict
    from climb.stages.embed import encode, load_model
    from climb.stages.cluster.kmeans import assign, train_kmeans

    texts, labels, _, ids = labelled_docs(corpus, a.skip + a.docs)
    texts, labels = texts[a.skip:], labels[a.skip:]
    _, sample = sample_docs(corpus, a.sample, set(ids))
    res = {"name": "embed_assign", "docs": len(texts), "sample": len(sample), "skip": a.skip, "ks": {}}
    cache = Path(a.cache) / f"embed_assign_{a.skip}_{a.docs}_{a.sample}.npz"
    if cache.exists():
        z = np.load(cache)
        t_sample, t_docs, teacher = z["sample"], z["docs"], z["seconds"]
    else:
        cfg = EmbedConfig(backend="torch")
        model = load_model(cfg)
        encode(model, texts[:64], cfg)  # warm-up
        t_docs, s_docs = _timed(encode, model, texts, cfg)
        t_sample, s_sample = _timed(encode, model, sample, cfg)
        teacher = np.array([s_docs, s_sample])
        np.savez(cache, sample=t_sample, docs=t_docs, seconds=teacher)
    if a.ridge:
        res["name"] = "embed_ridge"
        return ridge(res, a, texts, labels, sample, t_docs, t_sample)
    torch_rate, teacher_seconds = len(texts) / float(teacher[0]), float(teacher[1])
    res["teacher"] = {"docs_per_s": round(torch_rate, 1), "sample_seconds": round(teacher_seconds, 1),
                      "sample_docs_per_s": round(len(sample) / teacher_seconds, 1)}
    static_cfg = EmbedConfig(backend="static")
    static = load_model(static_cfg)
    encode(static, texts[:64], static_cfg)  # warm-up
    _, s_static = _timed(encode, static, texts, static_cfg)
    res["static_docs_per_s"] = round(len(texts) / s_static, 1)
    pilot = _pilot_students(static, sample, texts, t_sample) if a.pilot else None
    for k in (20, 50):
        row = {}
        c_docs, _ = train_kmeans(t_docs, k, niter=25, seed=0)
        row["torch_kmeans"] = nmi(labels, assign(t_docs, c_docs)[0])
        cents, _ = train_kmeans(t_sample, k, niter=25, seed=0)
        y_sample = assign(t_sample, cents)[0]
        ref = assign(t_docs, cents)[0]
        row["torch_assign"] = nmi(labels, ref)
        student, fit_s = _timed(fit_student, sample, y_sample)
        placed, pred_s = _timed(predict, student, texts)
        row["student"] = nmi(labels, placed)
        row["student_agrees"] = float(np.mean(placed == ref))
        rate = len(texts) / pred_s
        both = 1.0 / (1.0 / rate + s_static / len(texts))  # the student and the static vectors, per document
        res["ks"][f"k{k}"] = {**{n: round(float(v), 4) for n, v in row.items()},
                              "C": student["C"], "cv_agreement": student["cv_agreement"],
                              "fit_seconds": round(fit_s, 1), "student_docs_per_s": round(rate, 1),
                              "with_static_docs_per_s": round(both, 1),
                              "twenty_x_from_docs": break_even(teacher_seconds, fit_s, both, torch_rate)}
        if pilot is not None:
            res["ks"][f"k{k}"]["pilot"] = pilot(k, labels, cents, y_sample, ref)
    res["environment"] = machine("python", "torch", "cpus", "load_avg", "date")
    write_result(a.out, res)
    show(res, "docs", "sample", "ks")
    return 0


def ridge(res: dict, a, texts, labels, sample, t_docs, t_sample) -> int:
    """R against torch, k-means on the measured documents at several seeds (the rule's (a))."""
    from sklearn.metrics import normalized_mutual_info_score as nmi

    from climb.config import EmbedConfig
    from climb.stages.embed import encode, load_model
    from climb.stages.embed.tfidf import TfidfEncoder, _cosine, fit_tfidf
    from climb.stages.cluster.kmeans import assign, train_kmeans
    cfg = EmbedConfig(backend="torch")
    window = cfg.max_seq_length
    student, fit_s = _timed(fit_tfidf, sample, t_sample, window)
    enc = TfidfEncoder(student, window)
    enc.encode(texts[:64])  # warm-up
    r_docs, r_s = _timed(enc.encode, texts)
    model = load_model(cfg)
    encode(model, texts[:64], cfg)  # warm-up
    _, s_docs = _timed(encode, model, texts[:500], cfg)
    _, s_sample = _timed(encode, model, sample[:500], cfg)
    torch_rate, sample_rate, rate = 500 / s_docs, 500 / s_sample, len(texts) / r_s
    res["teacher"] = {"docs_per_s": round(torch_rate, 2), "sample_docs_per_s": round(sample_rate, 2),
                      "sample_seconds": round(len(sample) / sample_rate, 1)}
    res["student"] = {"alpha": student["alpha"], "cv_cosine": student["cv_cosine"], "terms": len(student["terms"]),
                      "fit_seconds": round(fit_s, 1), "docs_per_s": round(rate, 1),
                      "speedup": round(rate / torch_rate, 1),
                      "cosine_with_teacher": round(_cosine(r_docs, t_docs), 4),
                      "twenty_x_from_docs": break_even(len(sample) / sample_rate, fit_s, rate, torch_rate)}
    for k in (20, 50):
        row = {"torch": [], "R": []}
        for seed in a.kmeans_seeds:
            for name, emb in (("torch", t_docs), ("R", r_docs)):
                emb = np.ascontiguousarray(emb, dtype=np.float32)
                row[name].append(round(float(nmi(labels, assign(emb, train_kmeans(emb, k, niter=25, seed=seed)[0])[0])), 4))
        mean = {n: round(float(np.mean(v)), 4) for n, v in row.items()}
        first = {n: v[0] for n, v in row.items()}
        res["ks"][f"k{k}"] = {"seeds": a.kmeans_seeds, "nmi": row, "mean": mean,
                              "R_minus_torch_mean": round(mean["R"] - mean["torch"], 4),
                              "R_minus_torch_seed0": round(first["R"] - first["torch"], 4),
                              "within_0.03": bool(mean["R"] >= mean["torch"] - 0.03
                                                  and first["R"] >= first["torch"] - 0.03)}
    res["passes_a"] = all(v["within_0.03"] for v in res["ks"].values()) and \
        res["student"]["twenty_x_from_docs"] is not None
    res["environment"] = machine("python", "torch", "cpus", "load_avg", "date")
    write_result(a.out, res)
    show(res, "docs", "sample", "teacher", "student", "ks", "passes_a")
    return 0


def _pilot_students(static, sample, texts, t_sample):
    """The pilot's other students: the static vectors, their ridge map into the teacher's space
    (k-means on the measured documents, or the sample's centroids), a classifier on them."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import normalized_mutual_info_score as nmi

    from climb.stages.embed.tuned import TunedEncoder, fit_linear
    from climb.stages.cluster.kmeans import assign, train_kmeans
    raw = TunedEncoder(static.model, None, 256, "static")
    s_sample, s_docs = raw.encode(sample), raw.encode(texts)
    linear = fit_linear(raw.encode(sample, normalize_embeddings=False), t_sample)
    lin = TunedEncoder(static.model, linear, 256, "linear")
    l_docs = np.ascontiguousarray(lin.encode(texts), dtype=np.float32)

    def measure(k, labels, cents, y_sample, ref):
        out = {}
        for name, emb in (("static_kmeans", s_docs), ("linear_kmeans", l_docs)):
            emb = np.ascontiguousarray(emb, dtype=np.float32)
            out[name] = nmi(labels, assign(emb, train_kmeans(emb, k, niter=25, seed=0)[0])[0])
        placed = {"linear_assign": assign(l_docs, cents)[0],
                  "static_clf": LogisticRegression(C=10.0, max_iter=2000).fit(s_sample, y_sample).predict(s_docs)}
        for name, cl in placed.items():
            out[name] = nmi(labels, cl)
            out[name + "_agrees"] = float(np.mean(cl == ref))
        return {n: round(float(v), 4) for n, v in out.items()}
    return measure


if __name__ == "__main__":
    raise SystemExit(main())
