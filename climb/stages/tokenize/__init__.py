"""Stage 3, tokenize: the proxies' tokenizer and the per-cluster token store.

Reads: `<run>/cluster/assign/` and the corpus; the target, to decontaminate.
Writes: `<run>/tokenize/`: `tokenizer.json` and the per-cluster token store `tokens/`.
Rooms: `contamination` (the target's n-grams in the store).

A byte-level BPE tokenizer is trained on `proxy.tokenizer_docs` documents drawn
evenly from the corpus files (or `proxy.tokenizer` names one to use). Every
clustered document (pruned ones aside) is then tokenised, one task per corpus
shard, into the shard's part of the token store, and the parts are merged into
one token file per cluster (proxies.tokens). Outputs, under `<run>/tokenize/`:

- `tokenizer.json`
- `tokens/`: `cluster_XXXXX.bin` (token ids, EOS after each document; at most
  `tokenize.cap` of a cluster, a representative part of it: each shard in
  proportion to its tokens, proxies.tokens), `index.json` (tokens, bytes and
  documents per cluster, counted in full; the cap and the tokens stored), and
  `parts/<shard>/`, whose
  `doc_tokens.npy` gives each kept document's token count (EOS included) in
  corpus order: the export sizes documents by it. The parts' own token files
  are deleted once the merge is complete (they would hold every token twice).

The cap (`tokenize.cap`, "auto": steps x batch_size x (seq_len + 1) of the proxies,
climb.config.checks.token_cap) is what a proxy can read of a cluster, so the proxies
train on the same batches as from an uncapped store; it is part of the stage's key. It
is not part of what later stages key on (the manifest's `hash`, `_passed_on`): a model
reading n tokens of a cluster gets the same n from any store capped at n or more, so a
larger cap (validate.enabled sizes the store for the validation model) reruns no search;
a stage whose models read more than the store keeps adds the cap to its key (`short_of`).
A change of the cap alone keeps the tokenizer and the parts: the store is merged again at
the new cap, and the shards whose share of a cluster grew are tokenised again. Under
"auto", a finished store capped higher (or not capped) serves as it is (`store_cap`).

A shard whose part is complete is not tokenised again, so a killed stage resumes
shard by shard; a merged store found damaged later tokenises its shards again. When
only the corpus changed (a shard added or replaced, the clusters kept: climb.stages.cluster),
the tokenizer is kept and only the shards whose assignments changed are tokenised; the
others' tokens come from the merged store (each part records the assignments it was
made from).
More than FRESH_EVERY shards are tokenised, on the local executor, in a child process replaced
every FRESH_EVERY shards, so the stage's memory does not grow with the corpus.
The search trains proxies on the store; the export counts and cuts documents
with the tokenizer.

    climb tokenize --config pipelines/demo.toml --run runs/demo
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from climb.config import CorpusConfig, RunConfig, digest
from climb.io.files import fingerprint, read_aligned, read_documents, read_json
from climb.runtime.stage import execute, older_key, output_digest, upstream_key, upstream_resume
from climb.runtime.layout import RunPaths

log = logging.getLogger(__name__)

# The BPE encoder keeps about 8 MB of native memory a 50,000-document shard for the life of its
# process, whatever tokenizer object encoded it (2.07 GB for the stage at 10^7 documents, 0.71 GB at
# 10^6): past this many shards, a local run tokenises them in a child process replaced after
# this many (the same parts; a few seconds to start one).
FRESH_EVERY = 16


@dataclass(frozen=True)
class TokenizeTask:
    """One corpus shard to tokenise into the store's part for it."""
    shard: str
    path: str
    corpus: CorpusConfig
    tokenizer: str
    assignments: str
    store: str
    source: str = ""  # the assignments' digest, kept in the part's done.json
    # target.decontaminate: the target's n-gram hashes (climb.stages.tokenize.contamination) and their
    # length; a document holding one is left out of the store.
    ngrams: str = ""
    n: int = 0
    cap: int = 0  # tokens of a cluster the part keeps (0: all); every document counted in full


def tokenize_shard(task: TokenizeTask) -> dict:
    from climb.stages.cluster import read_assignments
    from proxies.tokenizer import load_tokenizer
    from proxies.tokens import write_shard_tokens
    tok = load_tokenizer(task.tokenizer)
    table = read_assignments(Path(task.assignments))
    clusters = table["cluster"].to_numpy()
    dup = table["duplicate"].to_numpy() if "duplicate" in table.column_names else np.zeros(len(clusters), np.int8)
    dup_cluster = (table["duplicate_cluster"].to_numpy() if "duplicate_cluster" in table.column_names
                   else np.full(len(clusters), -1))
    texts, cl, kept_dup, rows = [], [], [], []
    dropped: dict[int, list[str]] = {}
    for start, b in read_aligned(task.path, task.corpus, len(clusters)):
        for row, text in enumerate(b.texts, start):
            if clusters[row] >= 0:  # pruned documents never reach a proxy
                texts.append(text)
                cl.append(int(clusters[row]))
                kept_dup.append(bool(dup[row]))
                rows.append(row)
            elif dup[row] and dup_cluster[row] >= 0:  # dropped as a duplicate: counted, not stored
                dropped.setdefault(int(dup_cluster[row]), []).append(text)
    left_out: list[int] = []
    done_file = Path(task.store) / "parts" / task.shard / "done.json"
    if task.ngrams and not done_file.exists():
        from climb.stages.tokenize.contamination import doc_is_contaminated
        bad = doc_is_contaminated(tok.encode_batch(texts), np.load(task.ngrams), task.n)
        left_out = [r for r, b in zip(rows, bad) if b]
        texts = [t for t, b in zip(texts, bad) if not b]
        cl = [c for c, b in zip(cl, bad) if not b]
        kept_dup = [d for d, b in zip(kept_dup, bad) if not b]
    elif task.ngrams:
        import json
        left_out = json.loads(done_file.read_text()).get("decontaminated", [])
        gone = set(left_out)
        keep = [r not in gone for r in rows]
        texts = [t for t, k in zip(texts, keep) if k]
        cl = [c for c, k in zip(cl, keep) if k]
        kept_dup = [d for d, k in zip(kept_dup, keep) if k]
    stats = write_shard_tokens(texts, np.asarray(cl, dtype=np.int64), tok, task.store, task.shard, cap=task.cap)
    if (stats.get("source") != task.source or "duplicate_tokens" not in stats
            or stats.get("decontaminated", []) != left_out):
        from climb.io.files import write_json
        doc_tokens = np.load(Path(task.store) / "parts" / task.shard / "doc_tokens.npy")
        in_store = {}
        for c, n, d in zip(cl, doc_tokens, kept_dup):
            if d:
                in_store[c] = in_store.get(c, 0) + int(n)
        stats = {**stats, "source": task.source, "duplicate_tokens": in_store, "decontaminated": left_out,
                 "dropped_duplicate_tokens": {c: int(sum(len(ids) + 1 for ids in tok.encode_batch(ts)))
                                              for c, ts in dropped.items()}}
        write_json(Path(task.store) / "parts" / task.shard / "done.json", stats)
    return stats


def tokenizer_texts(cfg: RunConfig, files: list[Path | str]) -> list[str]:
    """The documents a BPE tokenizer is trained on: the first ones of each file, evenly."""
    per_file = max(1, cfg.proxy.tokenizer_docs // max(1, len(files)))
    texts: list[str] = []
    for f in files:
        got = 0
        for b in read_documents(f, cfg.corpus.text_column, cfg.corpus.id_column, batch_rows=cfg.corpus.batch_rows):
            texts += b.texts[: per_file - got]
            got = min(per_file, got + len(b.texts))
            if got >= per_file:
                break
    return texts


def key(cfg: RunConfig, paths: RunPaths, legacy: bool = False, cap: int | None = None) -> str:
    """The stage key: the clusters, the columns, the tokenizer's settings (a given one by what it
    holds; `legacy`: by its path and time, as older run folders keyed it), the cap (`cap`: this one
    instead of the run folder's, `store_cap`) and, with target.decontaminate, the target."""
    cap = store_cap(cfg, paths) if cap is None else cap
    return digest(upstream_key(paths, "cluster"), *_settings(cfg, _given(cfg, paths, legacy), cap),
                  *_decontaminated_target(cfg, paths))


def _given(cfg: RunConfig, paths: RunPaths, legacy: bool = False):
    """A given tokenizer's fingerprint (None: trained on the corpus, or missing: load_tokenizer
    names it when the stage runs)."""
    if not (cfg.proxy.tokenizer and Path(cfg.proxy.tokenizer).exists()):
        return None
    from climb.io.digests import content_fingerprint
    return fingerprint([cfg.proxy.tokenizer]) if legacy else content_fingerprint([cfg.proxy.tokenizer], paths.digests)


def _decontaminated_target(cfg: RunConfig, paths: RunPaths) -> list:
    if not cfg.target.decontaminate:  # the store leaves the target's documents out: it keys on the target
        return []
    from climb.runtime.targets import target_files
    return [cfg.target.contamination, target_files(cfg.target, paths.root, paths.digests)]


def _settings(cfg: RunConfig, given, cap: int | None = None) -> list:
    """The columns, the tokenizer's settings and `cap` (None: the config's, token_cap: a change of
    the proxies' steps moves "auto"); no cap keys as before caps."""
    from climb.config.checks import token_cap
    proxy_cfg = cfg.proxy
    cap = token_cap(cfg) if cap is None else cap
    return [cfg.corpus.text_column, cfg.corpus.id_column,
            {"tokenizer": proxy_cfg.tokenizer, "vocab_size": proxy_cfg.vocab_size,
             "tokenizer_docs": proxy_cfg.tokenizer_docs}, given, *([{"cap": cap}] if cap else [])]


def store_cap(cfg: RunConfig, paths: RunPaths) -> int:
    """The cap the run folder's store has: tokenize.cap resolved (token_cap), or under "auto" the
    cap of the finished store of these settings where it keeps more (or every token): it gives
    every model what it reads, as a store made at the smaller cap would (after `make validate`,
    a run without validation keeps the store sized for the validation model)."""
    return _cap(cfg, _finished_store(cfg, paths))


def _cap(cfg: RunConfig, finished: dict | None) -> int:
    from climb.config.checks import token_cap
    need = token_cap(cfg)
    if cfg.tokenize.cap != "auto" or finished is None:
        return need
    had = int(finished["stats"]["cap"])
    return had if had == 0 or had > need else need


def _finished_store(cfg: RunConfig, paths: RunPaths) -> dict | None:
    """The tokenize manifest where it is of a store of these settings and inputs at the cap it
    records (a store made at another cap, or at this one); None elsewhere."""
    m = paths.manifest("tokenize")
    try:
        manifest = read_json(m) if m.exists() else None
        had = manifest["stats"]["cap"] if manifest else None
    except (ValueError, KeyError, TypeError):
        return None
    if had is None or manifest.get("key", manifest.get("hash")) != key(cfg, paths, cap=int(had)):
        return None
    return manifest


def _passed_on(cfg: RunConfig, paths: RunPaths, k: str, finished: dict | None) -> str:
    """What later stages key on (the manifest's `hash`), for the stage's key `k`: the store's
    settings and inputs, not its cap (the key of an uncapped store of these settings). A store
    made again at another cap passes on what its previous version did, so the stages after it
    keep their keys (the tokenizer and the parts are kept, and the first n tokens of each
    cluster stay the same for every n up to both caps: proxies.token_store)."""
    if finished is None:
        return key(cfg, paths, cap=0)
    if finished.get("key", finished.get("hash")) == k:  # the same store (a repair)
        return finished["hash"]
    # What the later stages took from it (upstream_key), a repair's changed content with it.
    return digest(finished["hash"], finished["content"]) if finished.get("content") else finished["hash"]


def short_of(paths: RunPaths, reads: int) -> list:
    """[the store's cap] where the finished store keeps fewer tokens of a cluster than a model
    reading `reads` of each (0: none) takes from it, so that model trains on less than an uncapped
    store gives it (`climb validate` on a store sized for the proxies); [] elsewhere. A stage
    whose models read the store keys on it beside what the store passes on (upstream_key): the
    two are the store as those models see it."""
    upstream_key(paths, "tokenize")  # the store is there, as the stage left it
    index = read_json(paths.tokenize.store / "index.json")
    cap = int(index.get("cap", 0))
    if not cap or not reads or cap >= reads or all(int(t) <= cap for t in index["tokens"]):
        return []
    return [{"store_cap": cap}]


def resume_key(cfg: RunConfig, paths: RunPaths) -> str:
    """What the tokenizer and the parts depend on besides the assignments and the cap (each part
    records the cap it was made at; the merge takes what each part or the previous merge holds):
    the clusters' own settings (where the clusters are fitted again, cluster.refit, their key: a
    refit moves every document) and the tokenizer's."""
    up = upstream_resume(paths, "cluster")
    return digest(up if up is not None else ["clusters", upstream_key(paths, "cluster")],
                  *_settings(cfg, _given(cfg, paths), 0))


def cluster_tokens(paths: RunPaths) -> np.ndarray:
    """Tokens per cluster (int64) in the finished stage's store, every document counted (a capped
    store's files hold fewer)."""
    from proxies.tokens import TokenStore
    return TokenStore(paths.tokenize.store).tokens.astype(np.int64)


def run(cfg: RunConfig, paths: RunPaths) -> dict:
    finished = _finished_store(cfg, paths)
    cap = _cap(cfg, finished)
    k, resume = key(cfg, paths, cap=cap), resume_key(cfg, paths)
    if finished is not None:
        _resume_at_another_cap(paths, finished, resume)
    # A damaged tokenizer takes the token store made with it along.
    return execute(paths, "tokenize", k, lambda folder, ex: _tokenize(cfg, paths, ex, cap),
                   executor=cfg.executor, cascade={"tokenizer.json": "tokens"},
                   digest_files=("tokenizer.json", "tokens/index.json"),
                   legacy_key=older_key(paths, "tokenize", lambda: key(cfg, paths, legacy=True, cap=cap)),
                   resume_key=resume, passes_on=_passed_on(cfg, paths, k, finished))


def _resume_at_another_cap(paths: RunPaths, finished: dict, resume: str) -> None:
    """A finished store of these settings at another cap is resumed, not made anew: where its
    stage state holds another resume key (one of an older run folder, which keyed the parts on
    the cap too), it is given this one."""
    from climb.io.files import write_json
    from climb.runtime.stage import state_file
    state = state_file(paths.tokenize.dir)
    try:
        held = read_json(state) if state.exists() else {}
    except ValueError:
        held = {}
    if held.get("resume") != resume:
        write_json(state, {**held, "hash": held.get("hash", finished.get("key", finished["hash"])), "resume": resume})


def _tokenize(cfg: RunConfig, paths: RunPaths, ex, cap: int) -> dict:
    from proxies.tokenizer import load_tokenizer, train_bpe
    from proxies.tokens import PartsNeeded, TokenStore, drop_merged_parts, merge_token_stores, store_is_complete
    out = paths.tokenize
    if out.tokenizer.exists():
        tok = load_tokenizer(out.tokenizer)
    elif cfg.proxy.tokenizer:
        tok = load_tokenizer(cfg.proxy.tokenizer)
        tok.save(out.tokenizer)
    else:
        tok = train_bpe(tokenizer_texts(cfg, paths.corpus_files(cfg)), cfg.proxy.vocab_size, out.tokenizer)
    names = paths.shards()
    sources = {s: output_digest(paths, "cluster", f"assign/{s}.parquet") or "" for s in names}
    ngrams = _target_ngrams(cfg, paths, tok) if cfg.target.decontaminate else ""
    if ngrams:  # a part left out other documents for another target
        from climb.io.digests import file_digest
        sources = {s: f"{src}:{file_digest(ngrams)}" for s, src in sources.items()}
    todo = _parts_to_tokenize(out.store, names, sources)
    index = out.store / "index.json"
    merged = (store_is_complete(out.store) and index.exists() and read_json(index).get("shards") == names
              and int(read_json(index).get("cap", 0)) == cap)
    if todo or not merged:
        files = paths.shard_files(cfg)

        def tokenize(shards) -> None:
            tasks = [TokenizeTask(shard=s, path=str(files[s]), corpus=cfg.corpus, tokenizer=str(out.tokenizer),
                                  assignments=str(paths.cluster.assignments(s)), store=str(out.store),
                                  source=sources[s], ngrams=ngrams, n=cfg.target.contamination, cap=cap)
                     for s in names if s in shards]
            if tasks:
                ex.map(tokenize_shard, tasks, desc="tokenize", fresh_every=FRESH_EVERY)
        tokenize(todo)
        try:
            merge_token_stores(out.store, names, paths.n_clusters(), cap=cap)
        except PartsNeeded as e:
            # A capped store merged again (a shard added, replaced or gone): a kept shard's share of a
            # capped cluster grew past what the previous merge holds of it; its part is made again.
            log.info("tokenize: %s", e)
            todo = set(todo) | set(e.shards)
            tokenize(e.shards)
            merge_token_stores(out.store, names, paths.n_clusters(), cap=cap)
    # The parts' token files would hold every token a second time (half the folder at 1M documents).
    freed = drop_merged_parts(out.store, names)
    if freed:
        log.info("tokenize: merged; dropped the shard parts' token files (%.1f MB)", freed / 1e6)
    store = TokenStore(out.store)
    vocab = tok.vocab_size
    dups = _duplicate_tokens(out.store, names, len(store.tokens))
    log.info("tokenize: %d tokens in %d clusters from %d shards (vocabulary %d)", int(store.tokens.sum()),
             len(store.tokens), len(names), vocab)
    left_out = _decontaminated(out.store, names) if ngrams else None
    if cap:
        log.info("tokenize: %d of them stored (at most %d a cluster: tokenize.cap)", int(store.stored.sum()), cap)
    return {"tokens": int(store.tokens.sum()), "stored_tokens": int(store.stored.sum()), "cap": cap,
            "clusters": len(store.tokens), "shards": names, "vocab_size": vocab, "tokenized_now": sorted(todo),
            **dups, **({"decontaminated": left_out} if left_out is not None else {})}


def _decontaminated(store: Path, names: list[str]) -> int:
    """Documents the parts left out as holding the target's n-grams."""
    import json
    total = 0
    for s in names:
        done = store / "parts" / s / "done.json"
        total += len(json.loads(done.read_text()).get("decontaminated", [])) if done.exists() else 0
    return total


def _target_ngrams(cfg: RunConfig, paths: RunPaths, tok) -> str:
    """target.decontaminate: the target's n-gram hashes in the proxies' tokens, saved for the tasks."""
    from climb.io.files import write_npy
    from climb.runtime.targets import load_target
    from climb.stages.tokenize.contamination import target_ngrams
    target = load_target(cfg.target, paths.root)
    out = paths.tokenize.dir / "target_ngrams.npy"
    write_npy(out, target_ngrams(target["texts"], target["tasks"], tok, cfg.target.contamination))
    return str(out)


def _duplicate_tokens(store: Path, names: list[str], k: int) -> dict:
    """Per cluster, the tokens of duplicates (climb.stages.cluster.dedup) in the store and of those dropped
    from it, from the parts' records; {} where no part has them."""
    import json
    inside, dropped = np.zeros(k, np.int64), np.zeros(k, np.int64)
    seen = False
    for s in names:
        done = store / "parts" / s / "done.json"
        rec = json.loads(done.read_text()) if done.exists() else {}
        if "duplicate_tokens" not in rec:
            continue
        seen = True
        for c, n in rec["duplicate_tokens"].items():
            inside[int(c)] += n
        for c, n in rec.get("dropped_duplicate_tokens", {}).items():
            dropped[int(c)] += n
    return {"duplicate_tokens": inside.tolist(), "dropped_duplicate_tokens": dropped.tolist()} if seen else {}


def _parts_to_tokenize(store: Path, names: list[str], sources: dict[str, str]) -> set[str]:
    """The shards to tokenise: those without a part, whose part was made from other assignments,
    or whose tokens are neither in the part's files nor in the merged store. A shard that left
    the corpus takes its part with it."""
    import shutil

    from proxies.tokens import _bad_parts, _load_shard_stats, part_in_store
    parts = store / "parts"
    if parts.exists():
        for d in parts.iterdir():
            if d.is_dir() and d.name not in names:
                shutil.rmtree(d)
    todo = set()
    for s in names:
        done = parts / s / "done.json"
        if not done.exists():
            todo.add(s)
            continue
        stats = _load_shard_stats(done)
        if sources[s] and stats.get("source", sources[s]) != sources[s]:
            shutil.rmtree(parts / s)  # its assignments changed: its tokens are of other clusters
            todo.add(s)
        elif sources[s] and "source" not in stats and not _bad_parts(parts / s, stats):
            # Written by the part's writer but not yet recorded by its task (the source, the duplicates,
            # the documents decontamination left out): the task was cut short, a kill in between.
            # Unmerged (its token files there), so not a part of an older run: made again.
            shutil.rmtree(parts / s)
            todo.add(s)
        elif _bad_parts(parts / s, stats) and not part_in_store(store, s):
            todo.add(s)
    return todo
