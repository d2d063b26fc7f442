"""benchmarks/scale_corpus.py: N distinct passages of real text, the same files for the same seed."""
from __future__ import annotations

import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from benchmarks import scale_corpus


@pytest.fixture
def source(tmp_path):
    rnd = random.Random(0)
    words = [f"w{i}" for i in range(400)]
    d = tmp_path / "source"
    d.mkdir()
    for s in range(2):
        rows = []
        for i in range(30):
            n = rnd.choice([30, 120, 400, 900])  # words: documents of about 100 to 4,000 characters
            rows.append({"id": f"doc-{s}-{i}", "text": " ".join(rnd.choice(words) for _ in range(n)),
                         "source": f"src{i % 3}", "label": f"lab{i % 5}"})
        rows.append({**rows[-1], "text": rows[0]["text"] + " again"})  # an id the source repeats
        pq.write_table(pa.Table.from_pylist(rows), d / f"part-{s:05d}.parquet")
    return d


def _read(folder):
    return pa.concat_tables([pq.read_table(f) for f in sorted(folder.glob("part-*.parquet"))]).to_pylist()


def test_cut_keeps_words_whole_and_drops_short_passages():
    text = " ".join(f"word{i:03d}" for i in range(100))  # 799 characters
    pieces = scale_corpus.cut(text, 200, 50)
    assert all(len(p) >= scale_corpus.MIN_CHARS for p in pieces)
    assert " ".join(pieces).split() == text.split()[: len(" ".join(pieces).split())]
    assert len(pieces[0]) < len(pieces[1])  # the first cut comes `offset` early


def test_builder_is_deterministic_distinct_and_keeps_the_columns(source, tmp_path):
    docs, seen = {}, {}
    for r in _read(source):  # named as the builder names them: a repeated id gets #2
        seen[r["id"]] = seen.get(r["id"], 0) + 1
        docs[r["id"] if seen[r["id"]] == 1 else f"{r['id']}#{seen[r['id']]}"] = r
    a = scale_corpus.build(source, tmp_path / "a", 150, seed=3, rows_per_shard=64)
    scale_corpus.build(source, tmp_path / "b", 150, seed=3, rows_per_shard=64)
    scale_corpus.build(source, tmp_path / "c", 150, seed=4, rows_per_shard=64)
    files = sorted(p.name for p in (tmp_path / "a").glob("part-*.parquet"))
    assert files == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"] and a["shards"] == 3
    for f in files:
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()
    rows = _read(tmp_path / "a")
    assert len(rows) == 150 and a["docs"] == 150
    assert len({r["id"] for r in rows}) == 150 and len({r["text"] for r in rows}) == 150
    assert [len(pq.read_table(tmp_path / "a" / f)) for f in files] == [64, 64, 22]
    for r in rows:
        src = docs[r["id"].split("~")[0]]
        assert r["text"] in src["text"] and len(r["text"]) >= scale_corpus.MIN_CHARS
        assert (r["source"], r["label"]) == (src["source"], src["label"])
    assert {r["id"] for r in _read(tmp_path / "c")} != {r["id"] for r in rows}  # the seed draws


def test_every_passage_of_the_pool_has_its_own_id_though_the_source_repeats_one(source):
    ids = [i for i, _, _, _ in scale_corpus.passages(sorted(source.glob("*.parquet")))]
    assert len(ids) == len(set(ids)) and any("#2~" in i for i in ids)


def test_a_smaller_corpus_is_the_start_of_a_larger_one(source, tmp_path):
    """One permutation of the pool: every size has the same mix of lengths and sources."""
    scale_corpus.build(source, tmp_path / "small", 40, seed=1, rows_per_shard=1000)
    scale_corpus.build(source, tmp_path / "large", 120, seed=1, rows_per_shard=40)
    small = {r["id"] for r in _read(tmp_path / "small")}
    first = {r["id"] for r in pq.read_table(tmp_path / "large" / "part-00000.parquet").to_pylist()}
    assert small == first


def test_asking_for_more_than_the_pool_is_a_clear_error(source, tmp_path):
    with pytest.raises(SystemExit, match="distinct passages"):
        scale_corpus.build(source, tmp_path / "x", 10**6)


def test_a_corpus_larger_than_the_first_round_takes_more_rounds_of_other_cuts(source, tmp_path):
    files = sorted(source.glob("*.parquet"))
    _, first = scale_corpus.draw(files, 10, seed=0)
    assert first["rounds"] == 1
    want = first["pool_distinct"] + 50
    info = scale_corpus.build(source, tmp_path / "big", want, seed=0, rows_per_shard=10**6)
    assert info["rounds"] == 2 and info["pool_distinct"] >= want
    rows = _read(tmp_path / "big")
    assert len(rows) == want and len({r["id"] for r in rows}) == want and len({r["text"] for r in rows}) == want
    round_two = {f"~p{p}." for p in range(len(scale_corpus.PASSES), 2 * len(scale_corpus.PASSES))}
    assert any(r["id"][r["id"].index("~"):r["id"].index(".") + 1] in round_two for r in rows)
    # Round 0 is today's pool: its passes keep their cuts and ids.
    assert scale_corpus.passes(range(1)) == [(p, n, int(s * n)) for p, (n, s) in enumerate(scale_corpus.PASSES)]
    assert len({(n, o) for _, n, o in scale_corpus.passes(range(scale_corpus.ROUNDS))}) == \
        scale_corpus.ROUNDS * len(scale_corpus.PASSES)  # every round cuts elsewhere
