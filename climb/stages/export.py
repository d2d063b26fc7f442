"""Stage 6, export: the optimised dataset as Parquet shards plus blend files.

Documents are chosen per cluster in proportion to the final weights up to a
token budget, counted in the unit `export.tokenizer` names (climb.stages.export_units:
by default the proxies' tokens, EOS included; or a trainer's tokenizer.json or
installed model, or UTF-8 bytes; every document counts its true length): each cluster's documents are taken in a seeded random order
without replacement until the cluster runs dry, then again in the same order
(epoch 2, 3, ...) up to `search.epoch_cap` epochs. No cluster exceeds its
share, however long its documents: the document that would cross it is cut to
fit (`export.long_docs = "truncate"`), or passed over for shorter ones
("skip"). A cluster whose share would need more than its cap, or that runs
short of documents that fit, falls short, and that is reported; the weights
reached are compared with those asked for, with a warning beyond
`export.weight_tolerance`. With `export.token_budget = 0` the budget is the
largest one at which no cluster exceeds its cap.

Output, under `<run>/export/`, by `export.format` ("parquet", the default; "megatron"; "both"):
- `data/cluster_XXXXX/<shard>-<n>.parquet`: id, text, cluster, epoch (parquet), `<shard>` the
  corpus file's name (`part-00000-000.parquet` for the corpus's `part-00000.parquet`)
- `megatron/cluster_XXXXX.{bin,idx}`: one Megatron indexed dataset per cluster, in the
  trainer's token ids (megatron; climb.stages.export_megatron)
- `mixture.json`: weights per cluster, realised tokens, files
- `megatron_blend.txt`: `w1 prefix1 w2 prefix2 ...` for Megatron-LM's `--data-path`,
  the weights realised in the trainer's tokens (megatron)
- `interleave.json`: file lists, row probabilities that realise the token weights, and
  the stopping strategy that reads every row once, for `datasets.interleave_datasets` (parquet)
- `README.md`: the dataset card (climb.stages.export_card), so that
  `datasets.load_dataset(<folder>)` reads the data as it is, here or on the Hub
- `counts/<key>/<shard>.npy`: each document's size in `export.tokenizer`'s unit, where
  that is not the proxies' tokenizer (counted once, one task per shard), and for Megatron
  `<shard>.ids.npy`, the documents' ids; `<key>` is the tokenizer's and the clusters', so
  another export of the same run (other weights, another format) counts nothing again

A corpus shard whose files are written is not written again (`plan/<shard>.done.json`),
so a killed export resumes shard by shard.

With `export.destination` (a folder, or a URL such as s3://bucket/prefix) the
data and the three blend files go there instead, the blend files naming the
shards by their full path or URL, ready for a trainer reading from there. Each
worker writes its own shards (tasks carry the URL, not data), each object under
a hidden staging key first and moved into place whole (climb.io.remote); the blend
files are written last, once every shard they name is in place. `<run>/export`
keeps the plan, the manifest, a copy of the blend files and `destination.json`,
the size and ETag of every object written: an object deleted or changed since
is found on the next run, which exports again. Objects a previous export to the
same destination wrote and this one did not are deleted; nothing else there is
touched.

    climb export --config pipelines/demo.toml --run runs/demo
    climb export --config pipelines/demo.toml --set 'export.destination="s3://bucket/mix-1"'
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from climb.config import CorpusConfig, RunConfig, digest
from climb.io.files import (InputError, file_stamp, is_url, join, local_path, read_aligned, read_json,
                            strict_json, write_json, write_npy, write_parquet, write_text)
from climb.io.mixture import check_weights
from climb.runtime.stage import RunPaths, execute, upstream_key
from climb.stages import export_megatron, export_units
from climb.stages.cluster import load_assignments

log = logging.getLogger(__name__)


def budget_for(weights: np.ndarray, cluster_tokens: np.ndarray, cap: float, budget: int) -> int:
    if budget:
        return int(budget)
    pos = weights > 0
    return int(np.floor(np.min(cap * cluster_tokens[pos] / weights[pos])))


def _fill(order: np.ndarray, tokens: np.ndarray, want: int, long_docs: str) -> tuple[np.ndarray, int, int]:
    """One partial pass over a cluster's documents (in `order`) toward `want` tokens.

    Returns the documents taken whole, the document cut to fit (-1: none) and the
    tokens it keeps. "truncate" takes documents in order and cuts the one that
    would cross `want`; "skip" passes over documents that do not fit in what is
    left and takes later, shorter ones; neither ever exceeds `want`.
    """
    cum = np.cumsum(tokens[order])
    n = int(np.searchsorted(cum, want, side="right"))  # the longest prefix that fits whole
    got = int(cum[n - 1]) if n else 0
    if n == len(order) or got == want:
        return order[:n], -1, 0
    left = want - got
    if long_docs == "truncate":
        # A cut document keeps at least one token of text besides its EOS.
        return (order[:n], int(order[n]), left) if left >= 2 else (order[:n], -1, 0)
    rest = order[n:]
    fits = tokens[rest] <= left
    take = list(order[:n])
    if fits.any():
        # Greedy over the rest, in order: documents that fit in what is still wanted.
        suffix_min = np.minimum.accumulate(tokens[rest][::-1])[::-1]
        for j in np.flatnonzero(fits):
            if suffix_min[j] > left:
                break
            t = int(tokens[rest[j]])
            if t <= left:
                take.append(rest[j])
                left -= t
    return np.asarray(take, dtype=order.dtype), -1, 0


def select(doc_cluster: np.ndarray, doc_tokens: np.ndarray, weights: np.ndarray, budget: int,
           cap: float, seed: int, long_docs: str = "truncate") -> tuple[np.ndarray, dict]:
    """How many times each document is exported (0, 1, 2, ...) and per-cluster stats.

    Within a cluster documents are visited in one seeded order; pass e takes them
    again in that order, so repeats are even: no document is taken k+1 times
    while another of its cluster is taken fewer than k times. The last, partial
    pass stops at the cluster's share of the budget whatever the document lengths
    (see `_fill`); `info["cut"]` maps a document cut to fit to the tokens (EOS
    included) its last copy keeps.
    """
    rng = np.random.default_rng(seed)
    copies = np.zeros(len(doc_cluster), dtype=np.int64)
    cut: dict[int, int] = {}
    per = []
    for c, w in enumerate(weights):
        members = np.flatnonzero(doc_cluster == c)
        have = int(doc_tokens[members].sum())
        want = w * budget
        limit = cap * have
        goal = int(round(min(want, limit)))
        taken = 0
        if goal > 0 and len(members):
            order = members[rng.permutation(len(members))]
            full, rest = divmod(goal, have)
            copies[order] += full
            taken = full * have
            if rest > 0:
                whole, part, keep = _fill(order, doc_tokens, rest, long_docs)
                copies[whole] += 1
                taken += int(doc_tokens[whole].sum())
                if part >= 0:
                    copies[part] += 1
                    cut[part] = keep
                    taken += keep
        per.append({"cluster": c, "weight": float(w), "tokens_wanted": int(round(want)),
                    "tokens": taken, "tokens_available": have, "capped": bool(want > limit + 0.5),
                    "shortfall": max(0, goal - taken), "epochs": round(taken / have, 4) if have else 0.0})
    return copies, {"clusters": per, "cut": cut}


def _shard_docs(paths: RunPaths, store, shard: str, units: str) -> tuple[np.ndarray, np.ndarray]:
    """Cluster and size (in export.tokenizer's unit) of each kept document of a shard, in corpus order;
    a document the token store left out (target.decontaminate) is not kept."""
    clusters = load_assignments(paths, shard)["cluster"].to_numpy().copy()
    done = paths.tokenize.store / "parts" / shard / "done.json"
    if done.exists():
        gone = read_json(done).get("decontaminated", [])
        clusters[np.asarray(gone, dtype=np.int64)] = -1
    kept = clusters >= 0
    tokens = np.zeros(len(clusters), dtype=np.int64)
    if units != export_units.PROXY:
        tokens[kept] = np.load(counts_file(paths, shard, units))[kept]
        return clusters, tokens
    try:
        tokens[kept] = store.doc_tokens(shard)
    except (OSError, ValueError) as e:
        raise InputError(f"{store.path}: cannot read the document token counts of shard {shard} ({e}); run "
                         "`climb tokenize` (same --config and --run) to re-create them") from None
    return clusters, tokens


@dataclass(frozen=True)
class ExportTask:
    """One corpus shard's chosen documents to write (the plan files give copies, cluster and cut per row)."""
    shard: str
    path: str
    corpus: CorpusConfig
    copies: str
    clusters: str
    cut: str
    tokenizer: str
    units: str
    dest: str
    rows_per_shard: int
    seed: int
    done: str
    # export.format, and for Megatron: the counting pass's sizes and ids, the end-of-document
    # id, the token dtype and where the shard's parts of each cluster go.
    format: str = "parquet"
    counts: str = ""
    ids: str = ""
    eod: int = -1
    dtype: str = ""
    parts: str = ""


@dataclass(frozen=True)
class CountTask:
    """One corpus shard whose documents to size in export.tokenizer's unit (and, for Megatron,
    whose ids to keep: `ids`, of `dtype`)."""
    shard: str
    path: str
    corpus: CorpusConfig
    assignments: str
    units: str
    out: str
    ids: str = ""
    dtype: str = ""


def counts_file(paths: RunPaths, shard: str, units: str) -> Path:
    """A shard's document sizes in `units` (export.tokenizer), under a folder keyed by the unit
    and the clusters they were counted for."""
    return paths.export.dir / "counts" / digest(export_units.key(units), units, upstream_key(paths, "cluster"))[:16] \
        / f"{shard}.npy"


def count_shard(task: CountTask) -> int:
    """Each document's size in the unit (0 for pruned ones), saved for the shard; with `ids`,
    the kept documents' ids too, from the same tokenisation."""
    from climb.stages.cluster import read_assignments
    clusters = read_assignments(Path(task.assignments))["cluster"].to_numpy()
    units = export_units.load(task.units)
    sizes = np.zeros(len(clusters), dtype=np.int64)
    kept_ids: list[np.ndarray] = []
    for start, b in read_aligned(task.path, task.corpus, len(clusters)):
        rows = np.arange(start, start + len(b.texts))
        keep = clusters[rows] >= 0
        if not keep.any():
            continue
        texts = [t for t, k in zip(b.texts, keep) if k]
        if task.ids:
            ids = units.encode(texts)
            sizes[rows[keep]] = [len(x) + 1 for x in ids]  # + the end-of-document token
            kept_ids += ids
        else:
            sizes[rows[keep]] = units.count(texts)
    Path(task.out).parent.mkdir(parents=True, exist_ok=True)
    if task.ids:  # the ids first: a shard with its counts file is counted
        export_megatron.write_ids(Path(task.ids), kept_ids, np.dtype(task.dtype))
    write_npy(task.out, sizes)
    return len(clusters)


def _already_written(task: ExportTask) -> dict | None:
    """The result of a shard an interrupted export finished, if its files are all still there."""
    done = Path(task.done)
    if not done.exists():
        return None
    try:
        got = read_json(done)
    except ValueError:
        return None
    files = [f for fs in got["files"].values() for f in fs]
    if not is_url(task.dest) and not all((Path(task.dest) / f).is_file() for f in files):
        return None
    if export_megatron.wants(task.format, "megatron") and not all(
            Path(f"{Path(task.parts) / rel}.idx").is_file() for rel in got.get("megatron", {}).values()):
        return None
    return got


def write_shard(task: ExportTask) -> dict:
    """Write the chosen documents of one corpus shard, grouped by cluster (once: see `_already_written`):
    Parquet files, and/or the shard's part of each cluster's Megatron dataset."""
    got = _already_written(task)
    if got is not None:
        return got
    copies = np.load(task.copies)
    clusters = np.load(task.clusters)
    cut = np.load(task.cut)
    parquet, megatron = export_megatron.wants(task.format, "parquet"), export_megatron.wants(task.format, "megatron")
    ids = (export_megatron.doc_ids(np.load(task.counts), np.load(task.ids), np.flatnonzero(copies))
           if megatron else {})
    cutter = None
    rows: dict[int, dict[str, list]] = {}
    for start, b in read_aligned(task.path, task.corpus, len(copies)):
        for row, (doc_id, text) in enumerate(zip(b.ids, b.texts), start):
            for e in range(int(copies[row])):
                r = rows.setdefault(int(clusters[row]), {"id": [], "text": [], "epoch": [], "ids": []})
                r["id"].append(doc_id)
                last_cut = bool(cut[row]) and e == copies[row] - 1
                if megatron:  # a cut document keeps its first ids and, after them, the end-of-document token
                    r["ids"].append(ids[row][:int(cut[row]) - 1] if last_cut else ids[row])
                if not parquet:
                    r["text"].append("")
                elif last_cut:
                    cutter = cutter or _cutter(task)
                    r["text"].append(cutter(text, int(cut[row])))
                else:
                    r["text"].append(text)
                r["epoch"].append(e)
    files, parts = {}, {}
    rng = np.random.default_rng(task.seed)
    schema = pa.schema([("id", pa.string()), ("text", pa.string()), ("cluster", pa.int32()), ("epoch", pa.int32())])
    for c, r in sorted(rows.items()):
        order = rng.permutation(len(r["id"]))
        n = len(order)
        if megatron:  # in the order of the Parquet rows
            rel = f"cluster_{c:05d}/{task.shard}"
            export_megatron.write_part(Path(task.parts) / rel, [r["ids"][i] for i in order], task.eod,
                                       np.dtype(task.dtype))
            parts[c] = rel
        if not parquet:
            continue
        for part, s in enumerate(range(0, n, task.rows_per_shard)):
            idx = order[s:s + task.rows_per_shard]
            table = pa.table({"id": [r["id"][i] for i in idx], "text": [r["text"][i] for i in idx],
                              "cluster": np.full(len(idx), c, np.int32), "epoch": [r["epoch"][i] for i in idx]},
                             schema=schema)
            rel = f"data/cluster_{c:05d}/{task.shard}-{part:03d}.parquet"
            dest = task.dest
            write_parquet(join(dest, rel), table, staging=dest if is_url(dest) else None)
            files.setdefault(c, []).append(rel)
    got = {"shard": task.shard, "files": files, "rows": int(copies.sum()),
           **({"megatron": parts} if megatron else {})}
    write_json(task.done, got)
    return got


def _cutter(task: ExportTask):
    """cut(text, keep): the start of a text that is `keep` of the export's units long."""
    if task.units != export_units.PROXY:
        return export_units.load(task.units).truncate
    from proxies.tokenizer import load_tokenizer
    tok = load_tokenizer(task.tokenizer)
    return lambda text, keep: truncate(text, keep, tok)


def truncate(text: str, keep: int, tok) -> str:
    """The start of `text` that is `keep` tokens long with its EOS (as the export counts them)."""
    n = keep - 1
    chars = max(64, 8 * n)
    while True:
        ids = tok.encode(text[:chars])
        # More than n tokens: the n kept end before the last one, which the cut may have changed.
        if len(ids) > n or chars >= len(text):
            return tok.decode(ids[:n])
        chars *= 2


def destination(cfg: RunConfig, paths: RunPaths) -> str | None:
    """Where the dataset goes when not to <run>/export: a URL, or an absolute folder."""
    d = cfg.export.destination.replace("{run}", str(paths.root)).rstrip("/")
    if not d:
        return None
    return d if is_url(d) else str(local_path(d).resolve())


def check_destination(cfg: RunConfig, paths: RunPaths) -> None:
    """Fail before any stage runs where the destination cannot work (no package, no bucket, no access)
    or export.tokenizer cannot be loaded."""
    export_units.check(cfg.export.tokenizer)
    export_megatron.check_ready(cfg.export.tokenizer, cfg.export.format)
    if export_megatron.wants(cfg.export.format, "megatron"):
        export_units.load(cfg.export.tokenizer).eod_id(cfg.export.eod)
    dest = destination(cfg, paths)
    if dest and is_url(dest):
        from climb.io.remote import check_destination as check
        check(dest)


def key(cfg: RunConfig, paths: RunPaths, weights: list[float] | None = None) -> str:
    return digest(upstream_key(paths, "tokenize"), upstream_key(paths, "search"), cfg.export, cfg.search.epoch_cap,
                  weights, export_units.key(cfg.export.tokenizer))


def _listing(dest: str) -> dict[str, list]:
    """{path relative to dest: [size, tag]} of what is there now (local: size and mtime_ns)."""
    if is_url(dest):
        from climb.io.remote import listing
        return listing(dest)
    root = Path(dest)
    return {p.relative_to(root).as_posix(): file_stamp(p)
            for p in root.rglob("*") if p.is_file() and not any(
                s.startswith(".") for s in p.relative_to(root).parts)} if root.is_dir() else {}


def _remove(target: str) -> None:
    if is_url(target):
        from climb.io.remote import remove
        remove(target)
    else:
        Path(target).unlink(missing_ok=True)


def damaged_destination(paths: RunPaths) -> list[str]:
    """Objects an export wrote to its destination that are missing or changed since."""
    rec = paths.export.destination
    if not rec.exists():
        return []
    written = read_json(rec)
    now = _listing(written["destination"])
    return [join(written["destination"], rel) for rel, fp in written["files"].items() if now.get(rel) != fp]


def _previous_outputs(paths: RunPaths, dest: str | None) -> list[str]:
    """What an earlier export wrote to this destination (read before `begin` clears the folder)."""
    rec = paths.export.destination
    try:
        written = read_json(rec) if dest and rec.exists() else {}
    except ValueError:
        return []
    return list(written.get("files", {})) if written.get("destination") == dest else []


def _publish(paths: RunPaths, dest: str, previous: list[str], blends: dict[str, str], shards: list[str]) -> None:
    """The blend files to the destination, after every shard they name is in place; then
    what a previous export there wrote and this one did not goes, and what is there now
    is recorded in <run>/export/destination.json."""
    for name, text in blends.items():
        write_text(join(dest, name), text, staging=dest if is_url(dest) else None)
    ours = set(shards) | set(blends)
    for rel in sorted(set(previous) - ours):
        _remove(join(dest, rel))
    now = _listing(dest)
    missing = sorted(ours - set(now))
    if missing:
        raise InputError(f"{join(dest, missing[0])} is not there right after it was written; is something else "
                         "writing to export.destination?")
    write_json(paths.export.destination,
               {"destination": dest, "files": {rel: now[rel] for rel in sorted(ours)}})


def run(cfg: RunConfig, paths: RunPaths, weights: list[float] | None = None) -> dict:
    """Export the search's mixture (or `weights`, one per cluster)."""
    k = key(cfg, paths, weights)
    dest = destination(cfg, paths)
    check_destination(cfg, paths)
    manifest = paths.manifest("export")
    if manifest.exists() and read_json(manifest).get("key", read_json(manifest).get("hash")) == k:
        bad = damaged_destination(paths)
        if bad:
            more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
            log.warning("export: %s is missing or changed since it was written%s; exporting again", bad[0], more)
            manifest.unlink()
            for done in paths.export.dir.glob("plan/*.done.json"):  # every shard is written again
                done.unlink()
    previous = _previous_outputs(paths, dest)  # read before the stage's folder is cleared
    return execute(paths, "export", k, lambda folder, ex: _export(cfg, paths, weights, dest, previous, ex),
                   executor=cfg.executor, keep_dirs=("counts",))


def _export(cfg: RunConfig, paths: RunPaths, weights: list[float] | None, dest: str | None, previous: list[str],
            ex) -> dict:
    mix_file = paths.search.mixture
    w = check_weights(weights if weights is not None else read_json(mix_file)["weights"], paths.n_clusters(),
                      "weights given" if weights is not None else str(mix_file))
    megatron = export_megatron.wants(cfg.export.format, "megatron")
    trainer = megatron and _megatron_settings(cfg)
    if cfg.export.tokenizer != export_units.PROXY:
        _count(cfg, paths, ex, trainer)
    plan = _plan(cfg, paths, w)
    tasks = _shard_tasks(cfg, paths, plan, dest, trainer)
    parts = ex.map(write_shard, tasks, desc="export")
    by_cluster: dict[int, list[str]] = {}
    for p in parts:
        for c, fs in p["files"].items():
            by_cluster.setdefault(int(c), []).extend(fs)
    realised = np.array([c["tokens"] for c in plan["selection"]["clusters"]], dtype=np.float64)
    total = realised.sum()
    if total == 0:
        raise InputError("the export selected no documents; check the weights and export.token_budget")
    real_w = realised / total
    rels = [f for fs in by_cluster.values() for f in fs]
    prefixes: dict[int, str] = {}
    if megatron:
        prefixes = export_megatron.merge_clusters(paths.export.dir / "megatron-parts", paths.export.dir,
                                                  plan["shards"], parts, np.dtype(trainer["dtype"]), dest)
        rels += [f"megatron/cluster_{c:05d}{ext}" for c in prefixes for ext in (".bin", ".idx")]
    if dest:  # the blend files name the shards where they are
        by_cluster = {c: [join(dest, f) for f in fs] for c, fs in by_cluster.items()}
    blends = _blend_files(w, real_w, plan, by_cluster, prefixes)
    stats = _stats(cfg, w, real_w, plan, by_cluster, dest)
    if megatron:
        stats["megatron"] = {**export_megatron.stats_of(prefixes, paths.export.dir, dest), "dtype": trainer["dtype"],
                             "eod": trainer["eod"]}
    from climb.stages.export_card import card
    blends["README.md"] = card(cfg, paths, w, real_w, plan, by_cluster, stats, weights is not None)
    for name, text in blends.items():
        write_text(str(paths.export.dir / name), text)
    if dest:
        _publish(paths, dest, previous, blends, rels)
    return stats


def _megatron_settings(cfg: RunConfig) -> dict:
    """The trainer's end-of-document id and the token dtype megatron-core picks for its vocabulary."""
    units = export_units.load(cfg.export.tokenizer)
    return {"eod": units.eod_id(cfg.export.eod), "dtype": export_megatron.dtype_for(units.vocab_size).name}


def _count(cfg: RunConfig, paths: RunPaths, ex, trainer: dict | bool = False) -> None:
    """Size every kept document in export.tokenizer's unit, one task per shard not yet counted;
    for Megatron (`trainer`) keep their ids from the same pass."""
    files = paths.shard_files(cfg)

    units = cfg.export.tokenizer

    def ids(s: str) -> str:
        return str(export_megatron.ids_file(counts_file(paths, s, units))) if trainer else ""
    tasks = [CountTask(shard=s, path=str(files[s]), corpus=cfg.corpus, assignments=str(paths.cluster.assignments(s)),
                       units=units, out=str(counts_file(paths, s, units)), ids=ids(s),
                       dtype=trainer["dtype"] if trainer else "")
             for s in paths.shards()
             if not counts_file(paths, s, units).exists() or (trainer and not Path(ids(s)).exists())]
    if tasks:
        ex.map(count_shard, tasks, desc="export: count")


def _plan(cfg: RunConfig, paths: RunPaths, w: np.ndarray) -> dict:
    """How many copies of each document (in shard order) to export, which are cut, and per-cluster stats."""
    from proxies.tokens import TokenStore
    store = TokenStore(paths.tokenize.store)
    names = paths.shards()
    per_shard = [_shard_docs(paths, store, s, cfg.export.tokenizer) for s in names]
    doc_cluster = np.concatenate([p[0] for p in per_shard])
    doc_tokens = np.concatenate([p[1] for p in per_shard])
    cluster_tokens = np.bincount(doc_cluster[doc_cluster >= 0], weights=doc_tokens[doc_cluster >= 0],
                                 minlength=len(w))
    budget = budget_for(w, cluster_tokens, cfg.search.epoch_cap, cfg.export.token_budget)
    copies, selection = select(doc_cluster, doc_tokens, w, budget, cfg.search.epoch_cap, cfg.export.seed,
                               cfg.export.long_docs)
    cut = np.zeros(len(copies), dtype=np.int64)
    for d, keep in selection.pop("cut").items():
        cut[d] = keep
    return {"shards": names, "shard_clusters": [p[0] for p in per_shard], "copies": copies, "cut": cut,
            "budget": budget, "selection": selection, "unit": cfg.export.tokenizer}


def _shard_tasks(cfg: RunConfig, paths: RunPaths, plan: dict, dest: str | None,
                 trainer: dict | bool = False) -> list[ExportTask]:
    """One task per corpus shard, its part of the plan saved under export/plan/."""
    out, files = paths.export, paths.shard_files(cfg)
    tasks, start = [], 0
    for i, (s, cl) in enumerate(zip(plan["shards"], plan["shard_clusters"])):
        copies_file, clusters_file, cut_file = out.plan(s)
        copies_file.parent.mkdir(parents=True, exist_ok=True)
        np.save(copies_file, plan["copies"][start:start + len(cl)])
        np.save(clusters_file, cl)
        np.save(cut_file, plan["cut"][start:start + len(cl)])
        tasks.append(ExportTask(shard=s, path=str(files[s]), corpus=cfg.corpus, copies=str(copies_file),
                                clusters=str(clusters_file), cut=str(cut_file), tokenizer=str(paths.tokenize.tokenizer),
                                units=cfg.export.tokenizer, dest=dest or str(out.dir),
                                rows_per_shard=cfg.export.rows_per_shard, seed=cfg.export.seed + i,
                                done=str(copies_file.with_name(f"{s}.done.json")), format=cfg.export.format,
                                **({"counts": str(counts_file(paths, s, cfg.export.tokenizer)),
                                    "ids": str(export_megatron.ids_file(counts_file(paths, s,
                                                                                    cfg.export.tokenizer))),
                                    "eod": trainer["eod"], "dtype": trainer["dtype"],
                                    "parts": str(out.dir / "megatron-parts")} if trainer else {})))
        start += len(cl)
    return tasks


def cluster_rows(plan: dict) -> np.ndarray:
    """Rows the export writes per cluster (every copy of a document is a row)."""
    doc_cluster = np.concatenate(plan["shard_clusters"])
    kept = doc_cluster >= 0
    k = len(plan["selection"]["clusters"])
    return np.bincount(doc_cluster[kept], weights=plan["copies"][kept], minlength=k).astype(np.int64)


def row_probabilities(plan: dict, clusters: list[int]) -> list[float]:
    """`datasets.interleave_datasets` probabilities for these clusters' files: each cluster's
    share of the rows. Interleaving draws rows, not tokens; drawn by these, every cluster
    runs out at about the same time, so that reading every row once (the stopping strategy
    "all_exhausted_without_replacement") yields the realised token weights, with the
    clusters mixed evenly along the way (a cluster of long documents is not over-weighted,
    nor one of short ones left half unread)."""
    rows = cluster_rows(plan)[clusters].astype(np.float64)
    return (rows / rows.sum()).tolist()


def _blend_files(w: np.ndarray, real_w: np.ndarray, plan: dict, by_cluster: dict[int, list[str]],
                 prefixes: dict[int, str] | None = None) -> dict[str, str]:
    """mixture.json, and interleave.json (Parquet) and megatron_blend.txt (Megatron), as text."""
    mixture = {"weights": w.tolist(), "realised_weights": real_w.tolist(), "token_budget": plan["budget"],
               **({"unit": plan["unit"]} if plan.get("unit") else {}),
               "tokens": int(sum(c["tokens"] for c in plan["selection"]["clusters"])), **plan["selection"],
               "rows": cluster_rows(plan).tolist(),
               "files": {str(c): fs for c, fs in sorted(by_cluster.items())},
               **({"megatron": {str(c): p for c, p in sorted(prefixes.items())}} if prefixes else {})}
    out = {"mixture.json": strict_json(mixture, indent=2) + "\n"}
    if by_cluster:
        clusters = sorted(by_cluster)
        interleave = {
            "data_files": [by_cluster[c] for c in clusters],
            "probabilities": row_probabilities(plan, clusters),
            "stopping_strategy": "all_exhausted_without_replacement",
            "token_weights": [float(real_w[c]) for c in clusters],
            "usage": "datasets.interleave_datasets([load_dataset('parquet', data_files=f, split='train') "
                     "for f in data_files], probabilities=probabilities, seed=0, "
                     "stopping_strategy=stopping_strategy); the files are relative to this file's folder "
                     "unless export.destination made them URLs or absolute paths"}
        out["interleave.json"] = strict_json(interleave, indent=2) + "\n"
    if prefixes:
        out["megatron_blend.txt"] = export_megatron.blend_text(real_w, prefixes)
    return out


def _stats(cfg: RunConfig, w: np.ndarray, real_w: np.ndarray, plan: dict, by_cluster: dict, dest: str | None) -> dict:
    """The stage's stats, with a warning for each way the realised mixture falls short of the one asked for."""
    clusters, copies, cut = plan["selection"]["clusters"], plan["copies"], plan["cut"]
    total = int(sum(c["tokens"] for c in clusters))
    capped = [c["cluster"] for c in clusters if c["capped"]]
    short = {c["cluster"]: c["shortfall"] for c in clusters if c["shortfall"]}
    off = {c: [round(float(w[c]), 4), round(float(real_w[c]), 4)] for c in range(len(w))
           if abs(real_w[c] - w[c]) > cfg.export.weight_tolerance}
    stats = {"docs": int((copies > 0).sum()), "rows": int(copies.sum()), "tokens": total, "budget": plan["budget"],
             "capped_clusters": capped, "max_abs_weight_error": float(np.abs(real_w - w).max()),
             "weights_off": off, "truncated_docs": int((cut > 0).sum()), "shortfall": short,
             "files": sum(len(v) for v in by_cluster.values())}
    if cfg.export.tokenizer:
        stats["unit"] = cfg.export.tokenizer
    if capped:
        log.warning("export: clusters %s hit the epoch cap (%.1f); their realised weight is below the target",
                    capped, cfg.search.epoch_cap)
    if short:
        log.warning("export: clusters %s fell short of their share by %s tokens (export.long_docs=%r: no "
                    "document left fits)", sorted(short), [short[c] for c in sorted(short)], cfg.export.long_docs)
    if off:
        log.warning("export: realised weights differ from those asked for by more than export.weight_tolerance"
                    "=%g: %s", cfg.export.weight_tolerance,
                    ", ".join(f"cluster {c} {a:.3f} asked, {r:.3f} reached" for c, (a, r) in off.items()))
    log.info("export: %d rows (%d distinct docs), %d tokens, %d files%s", stats["rows"], stats["docs"], total,
             stats["files"], f" in {dest}" if dest else "")
    return stats
