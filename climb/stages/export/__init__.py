"""Stage 6, export: the optimised dataset as Parquet shards (and/or Megatron indexed datasets) plus

Reads: `<run>/search/mixture.json` (or `--weights`), `<run>/cluster/assign/` and the corpus.
Writes: `<run>/export/` (or `export.destination`): Parquet shards and/or Megatron indexed
datasets, `megatron_blend.txt`, `interleave.json`, `mixture.json` and the dataset card.
Rooms: `plan` (documents per cluster within the budget and epoch cap), `units` (the budget's
token unit), `megatron` (indexed datasets), `publish` (the destination), `card` (the card).
blend files. The plan is climb/stages/export/plan.py, the destination climb/stages/export/publish.py,
the Megatron writer climb/stages/export/megatron.py.

Documents are chosen per cluster in proportion to the final weights up to a
token budget, counted in the unit `export.tokenizer` names (climb.stages.export.units:
by default the proxies' tokens, EOS included; or a trainer's tokenizer.json or
installed model, or UTF-8 bytes; every document counts its true length): each
cluster's documents are taken without replacement until the cluster runs dry,
then again (epoch 2, 3, ...) up to `search.epoch_cap` epochs, the last, partial
epoch in a seeded order (a hash of `export.seed` and each document's id), planned
one corpus shard at a time in memory that does not grow with the corpus
(climb.stages.export.plan). No cluster exceeds its
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
  trainer's token ids (megatron; climb.stages.export.megatron)
- `mixture.json`: weights per cluster, realised tokens, files, and the mixture by source
  (`by_source`: each source's tokens and share in the export, and the share the weights asked for)
- `megatron_blend.txt`: `w1 prefix1 w2 prefix2 ...` for Megatron-LM's `--data-path`,
  the weights realised in the trainer's tokens (megatron)
- `interleave.json`: file lists, row probabilities that realise the token weights, and
  the stopping strategy that reads every row once, for `datasets.interleave_datasets` (parquet)
- `README.md`: the dataset card (climb.stages.export.card), so that
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
from climb.io.files import (InputError, is_url, join, read_aligned, read_json, strict_json, write_json, write_npy,
                            write_parquet, write_text)
from climb.io.mixture import check_weights
from climb.runtime.stage import execute, upstream_key
from climb.runtime.layout import RunPaths
from climb.stages.export import megatron as export_megatron
from climb.stages.export import plan as export_plan
from climb.stages.export import units as export_units
from climb.stages.export.plan import (  # noqa: F401
    _plan, budget_for, cluster_rows, counts_file, doc_keys, plan_shards, row_probabilities, select,
)
from climb.stages.export.publish import (_previous_outputs, _publish, check_destination,  # noqa: F401
                                         damaged_destination, destination)

log = logging.getLogger(__name__)


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


def key(cfg: RunConfig, paths: RunPaths, weights: list[float] | None = None) -> str:
    return digest(upstream_key(paths, "tokenize"), upstream_key(paths, "search"), cfg.export, cfg.search.epoch_cap,
                  weights, export_units.key(cfg.export.tokenizer), export_plan.ORDER)


def run(cfg: RunConfig, paths: RunPaths, weights: list[float] | None = None) -> dict:
    """Export the search's mixture (or `weights`, one per cluster)."""
    k = key(cfg, paths, weights)
    if weights is not None:  # refused before a previous export's files are removed
        check_weights(weights, paths.n_clusters(), "weights given")
        _check_bounds(cfg, paths, weights)
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
    stats = _stats(cfg, w, real_w, plan, by_cluster, dest)
    sources = _by_source(cfg, paths, w, plan)
    if sources is not None:
        stats["by_source"] = sources
    blends = _blend_files(w, real_w, plan, by_cluster, prefixes, sources)
    b = _bounds(cfg, paths)
    if b is not None:
        from climb.optimize.bounds import broken
        stats["bounds_off"] = broken(real_w, b, tol=cfg.export.weight_tolerance, caps=False)
        if stats["bounds_off"]:
            log.warning("export: the realised weights break %s (beyond export.weight_tolerance = %g)",
                        "; ".join(stats["bounds_off"]), cfg.export.weight_tolerance)
    if megatron:
        stats["megatron"] = {**export_megatron.stats_of(prefixes, paths.export.dir, dest), "dtype": trainer["dtype"],
                             "eod": trainer["eod"]}
    from climb.stages.export.card import card
    blends["README.md"] = card(cfg, paths, w, real_w, plan, by_cluster, stats, weights is not None)
    for name, text in blends.items():
        write_text(str(paths.export.dir / name), text)
    if dest:
        _publish(paths, dest, previous, blends, rels)
    return stats


def _bounds(cfg: RunConfig, paths: RunPaths):
    """The search's bounds (climb.optimize.bounds.Bounds; None without search.bounds and search.kl_max)."""
    if not cfg.search.bounds and not cfg.search.kl_max:
        return None
    from climb.stages.search.common import run_space
    return run_space(cfg, paths)["bounds"]


def _check_bounds(cfg: RunConfig, paths: RunPaths, weights) -> None:
    """Weights given by hand hold search.bounds and search.kl_max, or are refused naming the first they break."""
    from climb.optimize.bounds import broken
    b = _bounds(cfg, paths)
    bad = broken(np.asarray(weights, float), b, caps=False) if b is not None else []
    if bad:
        raise InputError(f"the weights given break {bad[0]}; give weights inside search.bounds / search.kl_max "
                         "or change them")


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


def _shard_tasks(cfg: RunConfig, paths: RunPaths, plan: dict, dest: str | None,
                 trainer: dict | bool = False) -> list[ExportTask]:
    """One task per corpus shard, reading its part of the plan (saved under export/plan/ by `_plan`)."""
    out, files = paths.export, paths.shard_files(cfg)
    tasks = []
    for i, s in enumerate(plan["shards"]):
        copies_file, clusters_file, cut_file = out.plan(s)
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
    return tasks


def _blend_files(w: np.ndarray, real_w: np.ndarray, plan: dict, by_cluster: dict[int, list[str]],
                 prefixes: dict[int, str] | None = None, sources: dict | None = None) -> dict[str, str]:
    """mixture.json, and interleave.json (Parquet) and megatron_blend.txt (Megatron), as text."""
    mixture = {"weights": w.tolist(), "realised_weights": real_w.tolist(), "token_budget": plan["budget"],
               **({"unit": plan["unit"]} if plan.get("unit") else {}),
               "tokens": int(sum(c["tokens"] for c in plan["selection"]["clusters"])), **plan["selection"],
               "rows": cluster_rows(plan).tolist(),
               "files": {str(c): fs for c, fs in sorted(by_cluster.items())},
               **({"megatron": {str(c): p for c, p in sorted(prefixes.items())}} if prefixes else {}),
               **({"by_source": sources} if sources is not None else {})}
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


def _by_source(cfg: RunConfig, paths: RunPaths, w: np.ndarray, plan: dict) -> dict | None:
    """The exported mixture by source: {"names", "tokens": each source's tokens in the export (in
    the budget's unit, counted from the plan: every copy of a document, a cut one's kept part),
    "realised_weights": their shares, "weights": the shares the weights asked for (by the search's
    shares of each source in each cluster; absent where those are not known)}. None where the
    sources cannot be read (climb.stages.search.sources)."""
    from climb.stages.search.sources import by_source, load_source_shares, shard_sources
    from proxies.tokens import TokenStore
    store, files = TokenStore(paths.tokenize.store), paths.shard_files(cfg)
    taken: dict[str, int] = {}
    try:
        for s in plan["shards"]:
            copies_file, _, cut_file = paths.export.plan(s)
            copies, cut = np.load(copies_file), np.load(cut_file)
            _, sizes, _ = export_plan._shard_docs(paths, store, s, cfg.export.tokenizer)
            names, codes = shard_sources(cfg, s, files[s], len(copies))
            tokens = copies * sizes - np.where(cut > 0, sizes - cut, 0)
            for name, n in zip(names, np.bincount(codes, weights=tokens, minlength=len(names))):
                taken[name] = taken.get(name, 0) + int(round(n))
    except (InputError, OSError, KeyError) as e:
        log.info("export: the mixture by source is left out: %s", e)
        return None
    names = sorted(taken)
    total = sum(taken.values())
    out = {"names": names, "tokens": [taken[n] for n in names],
           "realised_weights": [taken[n] / total if total else 0.0 for n in names]}
    shares = load_source_shares(cfg, paths)
    if shares is not None and sorted(shares["names"]) == names:
        out["weights"] = by_source(shares, {"w": w})["w"]
    return out


def _stats(cfg: RunConfig, w: np.ndarray, real_w: np.ndarray, plan: dict, by_cluster: dict, dest: str | None) -> dict:
    """The stage's stats, with a warning for each way the realised mixture falls short of the one asked for."""
    clusters = plan["selection"]["clusters"]
    total = int(sum(c["tokens"] for c in clusters))
    capped = [c["cluster"] for c in clusters if c["capped"]]
    short = {c["cluster"]: c["shortfall"] for c in clusters if c["shortfall"]}
    off = {c: [round(float(w[c]), 4), round(float(real_w[c]), 4)] for c in range(len(w))
           if abs(real_w[c] - w[c]) > cfg.export.weight_tolerance}
    stats = {"docs": plan["docs"], "rows": int(cluster_rows(plan).sum()), "tokens": total, "budget": plan["budget"],
             "capped_clusters": capped, "max_abs_weight_error": float(np.abs(real_w - w).max()),
             "weights_off": off, "truncated_docs": plan["truncated"], "shortfall": short,
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
