"""Sample and assign: a cheap student that places documents in the teacher's clusters.

The transformer (the teacher) embeds a sample of the corpus; k-means on those vectors
gives the centroids. Every other document is then placed by a student that never runs
the transformer: a multinomial logistic regression on the document's TF-IDF vector
(scikit-learn's `TfidfVectorizer`, sublinear term frequencies, fit on the sample's
texts), trained to predict the sample documents' teacher clusters. The student learns
the clusters as the teacher drew them, not the teacher's geometry, so what it is judged
on is that: how often it puts a document where the teacher would, and how well its
clusters agree with labels the corpus carries (BENCHMARKS.md, "Sample and assign").

The regularisation C is chosen by stratified 3-fold cross-validation on the sample
(agreement with the teacher's clusters) among `CS`; everything is deterministic given
the texts, the labels and the seed.

    from climb.stages.embed.student import fit_student, predict
    student = fit_student(sample_texts, teacher_clusters)
    clusters = predict(student, other_texts)
"""
from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

log = logging.getLogger(__name__)

CS = (3.0, 10.0, 30.0)  # the regularisation strengths cross-validation chooses among
MAX_FEATURES = 200_000  # the vocabulary's size cap (the sample's most frequent terms)
WINDOW_CHARS = 256 * 12  # as the embed stage clips: the window's tokens come from ~12 characters each


def _clip(texts: Sequence[str]) -> list[str]:
    return [t[:WINDOW_CHARS] for t in texts]


def _vectorizer():
    from sklearn.feature_extraction.text import TfidfVectorizer
    return TfidfVectorizer(sublinear_tf=True, min_df=2, max_features=MAX_FEATURES, dtype=np.float32)


def _classifier(c: float):
    from sklearn.linear_model import LogisticRegression
    return LogisticRegression(C=c, max_iter=2000)


def fit_student(texts: Sequence[str], labels: Sequence[int], seed: int = 0, cs: Sequence[float] = CS) -> dict:
    """The student of (sample `texts`, their teacher `labels`): {"vectorizer", "classifier", "C",
    "cv_agreement" (per C, the mean held-out agreement), "classes"}."""
    from sklearn.model_selection import StratifiedKFold
    y = np.asarray(labels)
    if len(texts) != len(y):
        raise ValueError(f"{len(texts)} texts but {len(y)} labels: one teacher cluster per sample document")
    classes = np.unique(y)
    if len(classes) < 2:
        raise ValueError("the sample's documents are all in one cluster: nothing for a student to learn")
    clipped = _clip(texts)
    vec = _vectorizer()
    x = vec.fit_transform(clipped)
    scores = {}
    counts = np.bincount(np.searchsorted(classes, y))
    folds = int(min(3, counts.min()))
    if folds >= 2 and len(cs) > 1:
        # The vocabulary is fit on the whole sample once: a fold's held-out texts then share it,
        # a small optimism that is the same for every C and so does not bias the choice.
        split = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
        for c in cs:
            agree = [float(np.mean(_classifier(c).fit(x[tr], y[tr]).predict(x[te]) == y[te]))
                     for tr, te in split.split(x, y)]
            scores[float(c)] = round(float(np.mean(agree)), 4)
            log.info("assign student: C = %g agrees with the teacher on %.3f of held-out sample documents",
                     c, scores[float(c)])
        best = max(scores, key=lambda c: (scores[c], -c))  # ties: the stronger regularisation
    else:
        best = float(cs[len(cs) // 2])
    clf = _classifier(best).fit(x, y)
    return {"vectorizer": vec, "classifier": clf, "C": best, "cv_agreement": scores, "classes": classes}


def predict(student: dict, texts: Sequence[str], batch: int = 4096) -> np.ndarray:
    """Each text's cluster as the student places it (the teacher's cluster ids), int64."""
    out = np.empty(len(texts), dtype=np.int64)
    for i in range(0, len(texts), batch):
        x = student["vectorizer"].transform(_clip(texts[i:i + batch]))
        out[i:i + batch] = student["classifier"].predict(x)
    return out
