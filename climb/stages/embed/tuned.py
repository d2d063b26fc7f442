"""A static embedding taught by the transformer on a sample of the run's own corpus.

The distilled static embedding (`embed_static`) knows each token's vector only from
passing the token alone through the transformer; documents of a given corpus are
placed less well than the transformer places them (BENCHMARKS.md, "A static
embedding"). Two students close the gap from a sample of that corpus, embedded once
by the teacher (the transformer `embed.model` names, as the embed stage runs it):

- `fit_tuned` (T, tokenlearn's recipe): model2vec's `StaticModelForSimilarity`
  trained so that its mean-pooled vector matches, in cosine, the teacher's vector
  reduced by PCA (fit on the sample) to the static model's dimensions. What it
  learns is the token vectors (and their weights), so it embeds as fast as the
  static model it started from.
- `fit_linear` (L, sample and assign): the static embedding followed by a ridge
  map into the teacher's space, alpha chosen by cross-validation on the sample.
- R (`embed_tfidf`): the document's TF-IDF vector (vocabulary fit on the sample) ridge-mapped
  into the teacher's space; it keeps the teacher's 384 dimensions.

`embed.student` picks which one "tuned" trains ("tokens", "linear", "tfidf").

`draw_sample` picks the sample by a seeded hash of document ids: the same corpus
gives the same sample whatever the order or number of its files.

    from climb.stages.embed.tuned import fit_tuned, TunedEncoder
    model = fit_tuned(static_model, texts, teacher_vectors, window=256)
    TunedEncoder(model, None, window=256).encode(texts)
"""
from __future__ import annotations

import copy
import hashlib
import logging
import os
from collections.abc import Callable, Iterable, Sequence
import dataclasses
from dataclasses import dataclass

import numpy as np

from climb.stages.embed.static import StaticEncoder

log = logging.getLogger(__name__)


def sample_rank(doc_id: str, seed: int = 0) -> int:
    """A document's place in the seeded order the sample is drawn from (smallest first)."""
    h = hashlib.blake2b(f"{seed}\x00{doc_id}".encode(), digest_size=8)
    return int.from_bytes(h.digest(), "big")


def draw_sample(ids: Iterable[str], n: int, seed: int = 0) -> list[str]:
    """The ids of the `n` documents first in the seeded hash order, in that order."""
    import heapq
    return [i for _, i in heapq.nsmallest(n, ((sample_rank(str(i), seed), str(i)) for i in ids))]


def _clip(texts: Sequence[str], window: int) -> list[str]:
    # As embed.encode clips: the window's tokens come from the first ~12 characters a token.
    return [t[:window * 12] for t in texts]


def fit_tuned(static_model, texts: Sequence[str], targets: np.ndarray, window: int, seed: int = 42,
              batch_size: int = 256, max_epochs: int = -1, device: str = "cpu"):
    """T: a model2vec StaticModel trained to match the teacher's vectors (PCA'd to its dimensions)
    of `texts` in cosine. `targets` are the teacher's embeddings of `texts`, one row each."""
    import torch
    from model2vec.train import StaticModelForSimilarity
    from sklearn.decomposition import PCA
    targets = np.asarray(targets, dtype=np.float32)
    dims = int(static_model.dim)
    if targets.shape[1] > dims:
        # A sample smaller than the dimensions has fewer components: the rest are zero.
        k = min(dims, len(targets))
        reduced = PCA(n_components=k, random_state=seed).fit_transform(targets).astype(np.float32)
        targets = np.pad(reduced, ((0, 0), (0, dims - k)))
    elif targets.shape[1] < dims:
        raise ValueError(f"the teacher's vectors have {targets.shape[1]} dimensions, fewer than the static "
                         f"model's {dims}")
    threads, quiet = torch.get_num_threads(), os.environ.get("TQDM_DISABLE")
    os.environ["TQDM_DISABLE"] = "1"  # model2vec's per-step bars
    # A copy: the student's tensors may share memory with the model it starts from.
    student = StaticModelForSimilarity.from_static_model(model=copy.deepcopy(static_model), n_layers=0,
                                                         max_length=window)
    try:
        student.fit(_clip(texts, window), torch.from_numpy(targets), batch_size=batch_size, random_seed=seed,
                    max_epochs=max_epochs, device=device)
    finally:
        torch.set_num_threads(threads)
        if quiet is None:
            os.environ.pop("TQDM_DISABLE", None)
        else:
            os.environ["TQDM_DISABLE"] = quiet
    return student.to_static_model()


def fit_linear(static_vectors: np.ndarray, targets: np.ndarray, alphas=(1e-3, 1e-2, 0.1, 1.0, 10.0, 100.0)) -> dict:
    """L: the ridge map (W, b) from the static embedding into the teacher's space, alpha by
    5-fold cross-validation on the sample. Returns {"W", "b", "alpha"}."""
    from sklearn.linear_model import RidgeCV
    r = RidgeCV(alphas=list(alphas), cv=5).fit(np.asarray(static_vectors, np.float64),
                                               np.asarray(targets, np.float64))
    return {"W": r.coef_.T.astype(np.float32), "b": r.intercept_.astype(np.float32), "alpha": float(r.alpha_)}


class TunedEncoder(StaticEncoder):
    """The static encoder (`embed_static.StaticEncoder`), then for L its linear map."""

    def __init__(self, model, linear: dict | None, window: int, backend: str = "tuned"):
        self.linear = linear
        super().__init__(model, window, "")
        self.climb_backend = f"{backend}-{self.get_embedding_dimension()}"

    def get_embedding_dimension(self) -> int:
        return int(self.linear["W"].shape[1] if self.linear else self.model.dim)

    def encode(self, texts, batch_size: int = 1024, normalize_embeddings: bool = True, **_) -> np.ndarray:
        emb = super().encode(texts, batch_size, normalize_embeddings=normalize_embeddings and not self.linear)
        if self.linear:
            emb = emb @ self.linear["W"] + self.linear["b"]
            if normalize_embeddings:
                emb /= np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
        return emb


# ---------------------------------------------------------------------------------------------
# embed.backend = "tuned": the student the embed stage uses, made once per run.

STUDENT = "tokens"  # the student "tuned" trains unless embed.student says: "tokens" (T), "linear" (L), "tfidf" (R)
_DONE = "student.json"


def read_sample(files, corpus, n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """The ids and texts of the corpus's `n` documents first in the seeded order (`draw_sample`'s),
    in that order: one streaming pass over every file, holding `n` documents at most."""
    import heapq

    from climb.io.files import read_documents
    docs = ((sample_rank(str(i), seed), str(i), t) for f in files
            for batch in read_documents(f, corpus.text_column, corpus.id_column, batch_rows=corpus.batch_rows)
            for i, t in zip(batch.ids, batch.texts))
    chosen = heapq.nsmallest(n, docs)
    return [i for _, i, _ in chosen], [t for _, _, t in chosen]


def _sample_digest(ids: Sequence[str], texts: Sequence[str]) -> str:
    h = hashlib.sha256()
    for i, t in zip(ids, texts):
        h.update(i.encode() + b"\x00" + t.encode() + b"\x01")
    return h.hexdigest()


@dataclass(frozen=True)
class Teacher:
    """What a student learns from, as the embed stage gives it: `vectors(texts)`, the
    transformer's embeddings of texts; `static()`, the static model the student starts from;
    `key`, what those depend on (the model, its window, device and precision, the static
    dimensions)."""
    name: str
    window: int
    vectors: Callable[[list[str]], np.ndarray]
    static: Callable[[], object]
    key: tuple


def student_key(teacher: Teacher, ids, texts, kind: str = STUDENT) -> str:
    """What a student depends on: its kind, the teacher and how it runs, the library versions
    and the sample's ids and texts."""
    import model2vec
    import sklearn

    from climb.config import digest
    return digest(kind, list(teacher.key), model2vec.__version__, sklearn.__version__,
                  _sample_digest(ids, texts))[:16]


def prepare(cfg, files, folder, teacher: Teacher) -> tuple[str, dict]:
    """The run's student: `<embed folder>/student`, made on the first embed of a run. Once made it
    stays for the run (shards added later are embedded with it, so earlier shards' vectors stay
    valid); a change of embed settings clears the stage folder and with it the student. Its
    making (the sample read, the teacher's pass, the fit) is cached under
    `$HF_HOME/climb/tuned/`, keyed on the sample's content, so another run on the same corpus
    copies it."""
    import json
    import shutil
    import time
    from pathlib import Path

    from climb.stages.embed.backend import build_once, cache_root, cache_slug
    dest = Path(folder) / "student"
    if (dest / _DONE).exists():
        return str(dest), json.loads((dest / _DONE).read_text())
    t0 = time.time()
    ids, texts = read_sample(files, cfg.corpus, cfg.embed.tune_sample)
    if len(ids) < 10:
        from climb.io.files import InputError
        raise InputError(f"embed.backend=\"tuned\" learns from a sample of the corpus, but it has {len(ids)} "
                         "documents; use embed.backend=\"torch\" for a corpus this small")
    read_seconds = time.time() - t0
    kind = cfg.embed.student
    key = student_key(teacher, ids, texts, kind)
    cached = cache_root() / "tuned" / f"{cache_slug(cfg.embed.model)}-{key}"

    # The teacher's pass is kept chunk by chunk beside the cache: a stage killed during it
    # resumes at the chunk in flight.
    chunks = cached.with_name(f".{cached.name}.teacher")
    resumable = dataclasses.replace(teacher, vectors=checkpointed(teacher.vectors, chunks))

    def write(tmp: Path) -> None:
        write_student(tmp, resumable, ids, texts, {"key": key, "read_seconds": round(read_seconds, 2)}, kind)
    build_once(cached, _DONE, write, f"teaching a student ({kind}) on {len(ids)} documents of the corpus")
    shutil.rmtree(chunks, ignore_errors=True)
    tmp = dest.with_name(f".student.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(cached, tmp)
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    info = json.loads((dest / _DONE).read_text())
    log.info("embed: the student (%s, %d documents, %s) in %s", info["kind"], info["sample"], key, dest)
    return str(dest), info


TEACHER_CHUNK = 2048  # documents per kept chunk of the teacher's pass


def checkpointed(vectors: Callable[[list[str]], np.ndarray], folder, chunk: int | None = None):
    """`vectors` run `chunk` texts at a time, each chunk's result kept in `folder` (written whole
    or not at all) and read back, not computed, when it is there. The folder must be keyed on
    the texts and on what computes them (prepare names it after the student's key)."""
    from pathlib import Path

    from tqdm.auto import tqdm

    from climb.io.files import write_npy
    folder, chunk = Path(folder), chunk or TEACHER_CHUNK

    def run(texts: list[str]) -> np.ndarray:
        folder.mkdir(parents=True, exist_ok=True)
        starts = range(0, len(texts), chunk)
        kept = sum((folder / f"{i:05d}.npy").exists() for i in range(len(starts)))
        if kept:
            log.info("embed: the teacher's pass resumes; %d of %d chunks were done before", kept, len(starts))
        parts = []
        bar = tqdm(starts, desc="embed: the teacher's pass over the sample", unit="chunk", leave=False, mininterval=5)
        for i, a in enumerate(bar):
            path = folder / f"{i:05d}.npy"
            if path.exists():
                parts.append(np.load(path))
                continue
            v = np.asarray(vectors(texts[a:a + chunk]), dtype=np.float32)
            write_npy(path, v)
            parts.append(v)
        return np.concatenate(parts) if parts else np.zeros((0, 0), np.float32)
    return run


# What a fit on 20,000 sample documents took on 2 cores (BENCHMARKS.md: tokens 2,354 s, linear
# 50 s, tfidf 136 s in the 10M scale run), for the log line before it starts.
FIT_TIME = {"tokens": "tens of minutes", "tfidf": "a few minutes", "linear": "about a minute"}


def write_student(folder, teacher: Teacher, ids, texts, extra: dict | None = None, kind: str = STUDENT) -> dict:
    """Teach a student on (ids, texts) and save it in `folder` (its static model, the linear map
    for L) with `student.json` last."""
    import json
    import time
    from pathlib import Path
    folder = Path(folder)
    window = teacher.window
    t0 = time.time()
    targets = teacher.vectors(list(texts))
    teacher_seconds = time.time() - t0
    log.info("embed: the teacher embedded %d sample documents in %.0f s; fitting the %s student (on 2 CPU "
             "cores a fit on 20,000 documents takes %s)", len(ids), teacher_seconds, kind,
             FIT_TIME.get(kind, "a while"))
    t0 = time.time()
    linear, extra_info = None, {}
    if kind == "tfidf":
        from climb.stages.embed import tfidf as embed_tfidf
        student = embed_tfidf.fit_tfidf(texts, targets, window)
        embed_tfidf.save(student, folder / "tfidf")
        extra_info = {"ridge_alpha": student["alpha"], "cv_cosine": student["cv_cosine"],
                      "terms": len(student["terms"])}
    elif kind == "linear":
        static = teacher.static()
        raw = TunedEncoder(static, None, window).encode(_clip(texts, window), normalize_embeddings=False)
        linear = fit_linear(raw, targets)
        static.save_pretrained(str(folder / "static"))
        np.savez(folder / "linear.npz", W=linear["W"], b=linear["b"])
    elif kind == "tokens":
        fit_tuned(teacher.static(), texts, targets, window).save_pretrained(str(folder / "static"))
    else:
        raise ValueError(f"unknown student {kind!r}")
    info = {"kind": kind, "sample": len(ids), "teacher": teacher.name, "window": window,
            "teacher_seconds": round(teacher_seconds, 2), "fit_seconds": round(time.time() - t0, 2),
            "teacher_docs_per_s": round(len(ids) / max(teacher_seconds, 1e-9), 1),
            **({"ridge_alpha": linear["alpha"]} if linear else {}), **extra_info, **(extra or {})}
    (folder / _DONE).write_text(json.dumps(info, indent=1) + "\n")
    return info


def load_student(folder, window: int):
    """The student `write_student` saved in `folder`, as an encoder the embed stage uses."""
    from pathlib import Path

    from model2vec import StaticModel
    folder = Path(folder)
    if (folder / "tfidf").exists():
        from climb.stages.embed import tfidf as embed_tfidf
        return embed_tfidf.TfidfEncoder(embed_tfidf.load(folder / "tfidf"), window, "tuned")
    static = StaticModel.from_pretrained(str(folder / "static"))
    linear = None
    if (folder / "linear.npz").exists():
        with np.load(folder / "linear.npz") as z:
            linear = {"W": z["W"], "b": z["b"]}
    return TunedEncoder(static, linear, window, "tuned")
