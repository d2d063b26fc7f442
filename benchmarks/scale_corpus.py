"""Build a corpus of N distinct real documents (default 1,000,000) from the shared corpus.

    python benchmarks/scale_corpus.py --out runs/scale-corpus/1000000 [--docs 1000000] [--seed 0]
    python benchmarks/scale_corpus.py --out DIR --docs 100000 --source ../shared/data/corpus

The shared corpus holds 98,347 documents (158 M characters). Each *pass* re-cuts
every source document into consecutive passages of one length, starting at an
offset into the first window (word boundaries kept), so the passes see the same
text at different lengths and phases: `PASSES` below, 2,000 down to 300
characters. Together they give a pool of 1.96 M passages, 1.80 M of them distinct
once passages under 100 characters and exact duplicates are dropped. Larger corpora
take further *rounds*: round r repeats the six lengths with every first cut moved on
by r/7 of the length (so the same mixture of lengths, cut at other places), as many
rounds as N needs (10 M takes six; at most `ROUNDS`). N passages are drawn from the
pool by one seeded permutation (so, up to the first round's 1.80 M, the 100k corpus is
the first 100k of the 1M one, and every size has the same mixture of lengths and
sources; with 50,000 rows a shard, the 100k corpus is the 1M one's first two shards,
byte for byte; a corpus that needs more rounds is drawn from a larger pool) and written as
Parquet shards of `--rows-per-shard` rows (default 50,000; zstd, row groups of
2,048) with the columns `id`, `text`, `source`, `label` (the source document's).
Ids name the source document, the pass and the passage:
`<source id>~p<pass>.<k>` (a source id seen before gets `#2`, `#3`, ... after it).

Two reads of the source: the first hashes every passage (a few MB of hashes, to
count, dedupe and draw), the second writes the drawn ones, shard by shard through
one buffered writer each, so memory stays bounded whatever N is. The same
source, N and seed give the same files.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from common import CORPUS, shared_or_skip, timer

log = logging.getLogger("scale_corpus")
# (passage length in characters, offset of the first cut as a share of that length)
PASSES = ((2000, 0.0), (1200, 0.5), (800, 0.25), (600, 0.75), (450, 0.4), (300, 0.6))
ROUNDS = 7  # round r cuts every pass r/ROUNDS of its length further on
MIN_CHARS = 100
SCHEMA = pa.schema([("id", pa.string()), ("text", pa.string()), ("source", pa.string()), ("label", pa.string())])


def cut(text: str, length: int, offset: int) -> list[str]:
    """Consecutive passages of about `length` characters, the first ending `offset` characters
    early; every cut moved forward to the next space, passages stripped."""
    out, start, n = [], 0, len(text)
    end = length - offset if offset else length
    while start < n:
        stop = n if end >= n else text.find(" ", end)
        stop = n if stop < 0 else stop
        piece = text[start:stop].strip()
        if len(piece) >= MIN_CHARS:
            out.append(piece)
        start, end = stop + 1, stop + 1 + length
    return out


def passes(rounds: range) -> list[tuple[int, int, int]]:
    """(pass number, length, offset of the first cut) of every pass of `rounds`; round 0's are `PASSES`."""
    out = []
    for r in rounds:
        for i, (length, share) in enumerate(PASSES):
            out.append((r * len(PASSES) + i, length, int(((share + r / ROUNDS) % 1.0) * length)))
    return out


def passages(files: list[Path], rounds: range = range(1)) -> Iterator[tuple[str, str, str, str]]:
    """(id, text, source, label) of every passage of every pass of `rounds`, in a fixed order."""
    for p, length, offset in passes(rounds):
        seen: dict[str, int] = {}  # the source repeats a few ids (two speeches of one file name)
        for f in files:
            pf = pq.ParquetFile(f)
            for batch in pf.iter_batches(batch_size=2048, columns=["id", "text", "source", "label"]):
                cols = batch.to_pydict()
                for doc_id, text, source, label in zip(cols["id"], cols["text"], cols["source"], cols["label"]):
                    seen[doc_id] = seen.get(doc_id, 0) + 1
                    doc = doc_id if seen[doc_id] == 1 else f"{doc_id}#{seen[doc_id]}"
                    for k, piece in enumerate(cut(text, length, offset)):
                        yield f"{doc}~p{p}.{k}", piece, source, label


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def draw(files: list[Path], n: int, seed: int) -> tuple[np.ndarray, dict]:
    """For each passage in `passages` order (of the rounds returned in the dict's "rounds"), its
    position in the drawn corpus (-1: not drawn). Rounds are added until the pool holds n
    distinct passages."""
    parts: list[np.ndarray] = []
    for r in range(ROUNDS):
        parts.append(np.fromiter((_hash(t) for _, t, _, _ in passages(files, range(r, r + 1))), dtype=np.uint64))
        hashes = np.concatenate(parts)
        _, first = np.unique(hashes, return_index=True)
        unique = np.sort(first)  # keep the first of each set of duplicates
        log.info("scale_corpus: %d round(s) hold %s distinct passages", r + 1, f"{len(unique):,}")
        if n <= len(unique):
            break
    else:
        raise SystemExit(f"scale_corpus: asked for {n:,} documents; {ROUNDS} rounds hold "
                         f"{len(unique):,} distinct passages")
    chosen = unique[np.random.default_rng(seed).permutation(len(unique))[:n]]
    pos = np.full(len(hashes), -1, dtype=np.int64)
    pos[chosen] = np.arange(n)
    return pos, {"pool_passages": int(len(hashes)), "pool_distinct": int(len(unique)), "rounds": r + 1}


class ShardWriters:
    """One buffered Parquet writer per output shard, rows appended as they come."""

    def __init__(self, out: Path, shards: int, row_group: int = 2048):
        self.out, self.row_group = out, row_group
        self.names = [f"part-{i:05d}.parquet" for i in range(shards)]
        self.writers = [None] * shards
        self.buffers: list[list[tuple]] = [[] for _ in range(shards)]

    def add(self, shard: int, row: tuple) -> None:
        self.buffers[shard].append(row)
        if len(self.buffers[shard]) >= self.row_group:
            self._flush(shard)

    def _flush(self, shard: int) -> None:
        rows = self.buffers[shard]
        if not rows:
            return
        if self.writers[shard] is None:
            self.writers[shard] = pq.ParquetWriter(self.out / (self.names[shard] + ".tmp"), SCHEMA,
                                                   compression="zstd")
        cols = list(zip(*rows))
        self.writers[shard].write_table(pa.table([pa.array(c, pa.string()) for c in cols], schema=SCHEMA),
                                        row_group_size=self.row_group)
        self.buffers[shard] = []

    def close(self) -> None:
        for i, name in enumerate(self.names):
            self._flush(i)
            if self.writers[i] is not None:
                self.writers[i].close()
                (self.out / (name + ".tmp")).rename(self.out / name)


def build(source: Path, out: Path, n: int, seed: int = 0, rows_per_shard: int = 50_000) -> dict:
    files = sorted(source.glob("*.parquet"))
    if not files:
        raise SystemExit(f"scale_corpus: no Parquet files in {source}")
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("part-*.parquet*"):
        old.unlink()
    with timer() as t_draw:
        pos, pool = draw(files, n, seed)
    shards = -(-n // rows_per_shard)
    writers = ShardWriters(out, shards)
    chars = 0
    with timer() as t_write:
        for i, row in enumerate(passages(files, range(pool["rounds"]))):
            if pos[i] >= 0:
                writers.add(int(pos[i]) // rows_per_shard, row)
                chars += len(row[1])
        writers.close()
    info = {"docs": n, "seed": seed, "shards": shards, "rows_per_shard": rows_per_shard, "chars": chars,
            "passes": [list(p) for p in PASSES], "source": str(source), "source_files": len(files), **pool,
            "seconds": {"draw": round(t_draw.seconds, 1), "write": round(t_write.seconds, 1)}}
    (out / "corpus.json").write_text(json.dumps(info, indent=1) + "\n")
    return info


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for the shards (emptied of old ones)")
    ap.add_argument("--docs", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rows-per-shard", type=int, default=50_000)
    ap.add_argument("--source", type=Path, default=None, help=f"source corpus (default {CORPUS})")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    source = a.source or shared_or_skip("corpus", "scale_corpus", "*.parquet")
    if source is None:
        return 0
    t0 = time.perf_counter()
    info = build(source, a.out, a.docs, a.seed, a.rows_per_shard)
    log.info("scale_corpus: %s documents (%s characters) in %d shards under %s, %.0f s",
             f"{info['docs']:,}", f"{info['chars']:,}", info["shards"], a.out, time.perf_counter() - t0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
