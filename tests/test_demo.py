"""climb.stages.embed.demo: the embedded demo corpus (BBC News articles + Python standard-library chunks).

Builds the real corpus (about half a second) and checks the files, the held-out target
and that a second build is identical."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from climb.stages.embed import demo
from climb.runtime.layout import RunPaths

BBC = {"business": 510, "entertainment": 386, "politics": 417, "sport": 511, "tech": 401}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "data"
    return out, demo.build(out)


def _corpus(out) -> pa.Table:
    return pa.concat_tables([pq.read_table(out / "corpus" / f"part-{i:05d}.parquet") for i in range(demo.SHARDS)])


def test_build_writes_the_expected_files(built):
    out, stats = built
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert files == ["corpus/part-00000.parquet", "corpus/part-00001.parquet", "corpus/part-00002.parquet",
                     "corpus/part-00003.parquet", "done.json", "target/tech_heldout.jsonl"]
    by_label = dict(BBC, tech=BBC["tech"] - demo.HELDOUT_DOCS, python=demo.CODE_CHUNKS)
    assert stats == {"docs": sum(by_label.values()), "target_docs": demo.HELDOUT_DOCS, "shards": demo.SHARDS,
                     "held_out": "tech", "by_label": dict(sorted(by_label.items()))}
    assert json.loads((out / "done.json").read_text()) == stats

    table = _corpus(out)
    assert table.column_names == ["id", "text", "source", "label"]
    assert table.num_rows == stats["docs"]
    ids = table["id"].to_pylist()
    assert len(set(ids)) == len(ids)
    sizes = [pq.read_metadata(out / "corpus" / f"part-{i:05d}.parquet").num_rows for i in range(demo.SHARDS)]
    assert max(sizes) - min(sizes) <= 1  # round-robin shards
    rows = table.to_pylist()
    assert all(r["text"].strip() for r in rows)
    assert {(r["source"], r["label"]) for r in rows} == {("bbc", lab) for lab in BBC} | {("code", "python")}
    assert all(r["id"].startswith(f"bbc-{r['label']}-") or r["id"].startswith("code-") for r in rows)

    # The target: held-out tech articles, none of them in the corpus.
    target = [json.loads(line) for line in (out / "target" / "tech_heldout.jsonl").read_text().splitlines()]
    assert len(target) == demo.HELDOUT_DOCS and all(set(t) == {"id", "text"} for t in target)
    assert all(t["id"].startswith("bbc-tech-") and t["text"] for t in target)
    assert not {t["id"] for t in target} & set(ids)


def test_build_is_deterministic_and_done_once(built, tmp_path):
    out, stats = built
    again = demo.build(tmp_path / "data")
    assert again == stats
    assert _corpus(tmp_path / "data").equals(_corpus(out))
    target = "target/tech_heldout.jsonl"
    assert (tmp_path / "data" / target).read_bytes() == (out / target).read_bytes()
    # A finished build is not redone: the marker's stats come back, no file is rewritten.
    stamps = {p: p.stat().st_mtime_ns for p in (tmp_path / "data").rglob("*") if p.is_file()}
    assert demo.build(tmp_path / "data") == stats
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps


def test_ensure_corpus(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(demo, "build", lambda out, held_out: calls.append(out))
    paths = RunPaths(tmp_path / "run")
    demo.ensure_corpus(SimpleNamespace(corpus=SimpleNamespace(build="demo")), paths)
    assert calls == [tmp_path / "run" / "data"]
    demo.ensure_corpus(SimpleNamespace(corpus=SimpleNamespace(build="")), paths)
    assert len(calls) == 1
    with pytest.raises(ValueError, match="corpus.build='wiki' is unknown"):
        demo.ensure_corpus(SimpleNamespace(corpus=SimpleNamespace(build="wiki")), paths)
    with pytest.raises(ValueError, match="corpus.build='demo:weather' is unknown"):
        demo.ensure_corpus(SimpleNamespace(corpus=SimpleNamespace(build="demo:weather")), paths)


def test_another_section_held_out(built, tmp_path):
    """corpus.build = "demo:sport": the same documents, with 80 sport articles held out instead."""
    out, stats = built
    paths = RunPaths(tmp_path / "run")
    demo.ensure_corpus(SimpleNamespace(corpus=SimpleNamespace(build="demo:sport")), paths)
    sport = json.loads((paths.data / "done.json").read_text())
    assert sport["held_out"] == "sport" and sport["docs"] == stats["docs"]
    assert sport["by_label"] == dict(stats["by_label"], sport=BBC["sport"] - demo.HELDOUT_DOCS, tech=BBC["tech"])
    target = [json.loads(x) for x in (paths.data / "target" / "sport_heldout.jsonl").read_text().splitlines()]
    assert len(target) == demo.HELDOUT_DOCS and all(t["id"].startswith("bbc-sport-") for t in target)
    assert not {t["id"] for t in target} & set(_corpus(paths.data)["id"].to_pylist())
    all_ids = set(_corpus(out)["id"].to_pylist()) | {json.loads(x)["id"] for x in
                                                      (out / "target" / "tech_heldout.jsonl").read_text().splitlines()}
    assert set(_corpus(paths.data)["id"].to_pylist()) | {t["id"] for t in target} == all_ids
    with pytest.raises(ValueError, match="held out"):  # one run folder, one known answer
        demo.ensure_corpus(SimpleNamespace(corpus=SimpleNamespace(build="demo")), paths)
