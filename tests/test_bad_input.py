"""Bad input a user can fix: each case fails with an InputError naming the file and
the fix, or is skipped and counted, never dropped silently."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from climb.config import ClusterConfig, CorpusConfig, RunConfig
from climb.io.files import InputError, read_documents, resolve_corpus_files
from climb.io.mixture import check_weights
from climb.runtime.layout import RunPaths


def _cfg(pattern, k: int = 3, **corpus) -> RunConfig:
    return RunConfig(corpus=CorpusConfig(paths=(str(pattern),), **corpus), cluster=ClusterConfig(k=k))


def _parquet(path: Path, **cols) -> Path:
    pq.write_table(pa.table(cols), path)
    return path


def _drain(path, *a, **kw):
    return [b for b in read_documents(path, *a, **kw)]


def test_missing_text_column_parquet(tmp_path):
    p = _parquet(tmp_path / "shard.parquet", id=["a", "b"], content=["x", "y"])
    with pytest.raises(InputError) as ei:
        _drain(p, "text", "id")
    msg = str(ei.value)
    assert str(p) in msg and "'text'" in msg and "corpus.text_column" in msg
    assert "content" in msg  # lists the columns it does have


def test_missing_text_column_jsonl(tmp_path):
    p = tmp_path / "shard.jsonl"
    p.write_text("".join(json.dumps({"id": i, "body": "hello"}) + "\n" for i in range(3)))
    with pytest.raises(InputError, match=r"shard\.jsonl: no record has a 'text' field; set corpus\.text_column"):
        _drain(p, "text", "id")


def test_missing_text_column_through_embed_stage(tmp_path, fake_model):
    import climb.stages.embed
    _parquet(tmp_path / "shard.parquet", id=["a", "b"], content=["x", "y"])
    with pytest.raises(InputError, match=r"shard\.parquet: missing column.*corpus\.text_column"):
        climb.stages.embed.run(_cfg(tmp_path / "*.parquet"), RunPaths(tmp_path / "run"))


def test_empty_corpus_embed_stage_raises(tmp_path, fake_model):
    import climb.stages.embed
    _parquet(tmp_path / "a.parquet", id=["a", "b", "c"], text=["", "   ", "\n\t"])
    _parquet(tmp_path / "b.parquet", id=["d"], text=[None], )
    with pytest.raises(InputError) as ei:
        climb.stages.embed.run(_cfg(tmp_path / "*.parquet"), RunPaths(tmp_path / "run"))
    msg = str(ei.value)
    assert "no non-empty documents" in msg and "'text'" in msg and "corpus.paths" in msg
    assert str(tmp_path / "a.parquet") in msg and str(tmp_path / "b.parquet") in msg
    assert fake_model.texts_seen == 0
    assert not (tmp_path / "run" / "embed" / "manifest.json").exists()


def test_fewer_documents_than_clusters(tmp_path, fake_model):
    import climb.stages.cluster
    import climb.stages.embed
    _parquet(tmp_path / "a.parquet", id=[f"d{i}" for i in range(5)], text=[f"word{i} thing" for i in range(5)])
    cfg, paths = _cfg(tmp_path / "*.parquet", k=8), RunPaths(tmp_path / "run")
    assert climb.stages.embed.run(cfg, paths)["docs"] == 5
    with pytest.raises(InputError, match=r"5 documents but cluster\.k=8.*--set cluster\.k="):
        climb.stages.cluster.run(cfg, paths)
    assert not paths.manifest("cluster").exists()


def test_corrupted_parquet(tmp_path):
    good = _parquet(tmp_path / "good.parquet", id=[f"d{i}" for i in range(50)], text=["some text"] * 50)
    bad = tmp_path / "bad.parquet"
    raw = good.read_bytes()
    bad.write_bytes(raw[: len(raw) // 2])  # truncated: no footer
    with pytest.raises(InputError) as ei:
        _drain(bad)
    msg = str(ei.value)
    assert str(bad) in msg and "cannot read" in msg and "re-create" in msg
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"PAR1" + b"\x00garbage" * 20 + b"PAR1")
    with pytest.raises(InputError, match=r"junk\.parquet: cannot read"):
        _drain(junk)


def test_truncated_gzip_jsonl(tmp_path):
    data = gzip.compress("".join(json.dumps({"id": i, "text": f"text {i} " * 40}) + "\n"
                                 for i in range(300)).encode())
    p = tmp_path / "cut.jsonl.gz"
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match=r"cut\.jsonl\.gz: cannot read.*re-create"):
        _drain(p)
    q = tmp_path / "notgz.jsonl.gz"
    q.write_bytes(b"this is not gzip at all\n")
    with pytest.raises(InputError, match=r"notgz\.jsonl\.gz: cannot read"):
        _drain(q)


def test_corrupted_zstd_jsonl(tmp_path):
    p = tmp_path / "bad.jsonl.zst"
    p.write_bytes(b"definitely not a zstd frame\n" * 4)
    with pytest.raises(InputError, match=r"bad\.jsonl\.zst"):
        _drain(p)


def test_weights_must_sum_to_one():
    with pytest.raises(InputError) as ei:
        check_weights([0.5, 0.3, 0.1], 3, "runs/x/search/mixture.json")
    msg = str(ei.value)
    assert "runs/x/search/mixture.json" in msg and "0.900000" in msg and "normalise" in msg
    w = check_weights([0.5, 0.3, 0.2], 3, "w")
    assert w.dtype == np.float64 and np.allclose(w, [0.5, 0.3, 0.2])
    check_weights([1 / 3] * 3, 3, "w")  # rounding within tolerance is fine


@pytest.mark.parametrize("w, n, match", [
    ([0.5, 0.5], 3, r"w: 2 weights for 3 clusters"),
    ([1.2, -0.2], 2, r"w: weights must be finite and non-negative"),
    ([float("nan"), 1.0], 2, r"finite"),
    ([float("inf"), 0.0], 2, r"finite"),
])
def test_weights_shape_and_values(w, n, match):
    with pytest.raises(InputError, match=match):
        check_weights(w, n, "w")


def test_weights_as_shares_are_rescaled_and_bad_rows_named():
    assert check_weights([2.0, 6.0, 2.0], where="prior", tol=None).tolist() == [0.2, 0.6, 0.2]
    W = check_weights([[1.0, 3.0], [2.0, 2.0]], 2, "w.csv", tol=None, rows=True)
    assert W.tolist() == [[0.25, 0.75], [0.5, 0.5]]
    with pytest.raises(InputError, match=r"prior: all-zero weights"):
        check_weights([0.0, 0.0], where="prior", tol=None)
    with pytest.raises(InputError, match=r"w\.csv: weights must be finite and non-negative "
                                         r"\(negative in 1 row: keys b\)"):
        check_weights([[1.0, 0.0], [1.0, -1.0]], where="w.csv", tol=None, rows=True, labels=["a", "b"])
    with pytest.raises(InputError, match=r"w\.csv: all-zero weights \(in 1 row: keys a\)"):
        check_weights([[0.0, 0.0], [1.0, 1.0]], where="w.csv", tol=None, rows=True, labels=["a", "b"])
    with pytest.raises(InputError, match=r"w: weights of shape \(1, 2\)"):
        check_weights([[0.5, 0.5]], 2, "w")


def test_empty_documents_skipped_and_counted(tmp_path, fake_model):
    import climb.stages.embed
    texts = ["alpha beta", "", "   ", "gamma", None, "\n\t ", "delta"]
    p = _parquet(tmp_path / "a.parquet", id=[f"d{i}" for i in range(len(texts))], text=texts)
    batches = _drain(p, "text", "id", batch_rows=3)
    assert [b.skipped.get("empty", 0) for b in batches] == [2, 2, 0]
    assert [i for b in batches for i in b.ids] == ["d0", "d3", "d6"]
    # The embed stage embeds only the 3 real documents and reports the 4 skipped.
    q = tmp_path / "b.jsonl"
    q.write_text("".join(json.dumps({"id": f"j{i}", "text": t}) + "\n" for i, t in enumerate(["x y", " ", "z"])))
    cfg = RunConfig(corpus=CorpusConfig(paths=(str(p), str(q)), batch_rows=3))
    stats = climb.stages.embed.run(cfg, RunPaths(tmp_path / "run"))
    assert stats["docs"] == 5 and stats["skipped"] == {"empty": 5}
    assert fake_model.texts_seen == 5
    ids = pq.read_table(tmp_path / "run" / "embed" / "a.ids.parquet")["id"].to_pylist()
    assert ids == ["d0", "d3", "d6"]
    assert np.load(tmp_path / "run" / "embed" / "a.npy").shape == (3, fake_model.dim)


def test_invalid_utf8_line_skipped_and_counted(tmp_path, fake_model):
    import climb.stages.embed
    lines = [json.dumps({"id": "a", "text": "fine"}).encode(),
             b'{"id": "b", "text": "bad \xff\xfe bytes"}',
             json.dumps({"id": "c", "text": "caf\u00e9"}, ensure_ascii=False).encode(),
             b'{"id": "d", "text": "\xc3"}']
    p = tmp_path / "u.jsonl"
    p.write_bytes(b"\n".join(lines) + b"\n")
    ids, skipped = [], {}
    for b in read_documents(p, batch_rows=1):
        ids += b.ids
        for k, v in b.skipped.items():
            skipped[k] = skipped.get(k, 0) + v
    assert ids == ["a", "c"] and skipped == {"invalid_utf8": 2}
    stats = climb.stages.embed.run(_cfg(p), RunPaths(tmp_path / "run"))
    assert stats["docs"] == 2 and stats["skipped"] == {"invalid_utf8": 2}


def test_non_json_line_names_file_and_line(tmp_path):
    p = tmp_path / "broken.jsonl"
    p.write_text(json.dumps({"id": "a", "text": "x"}) + "\n\n" + "{'id': 'b', 'text': 'single quotes'}\n")
    with pytest.raises(InputError, match=rf"{p}:3: not valid JSON.*one JSON object"):
        _drain(p)


def test_json_line_that_is_not_an_object(tmp_path):
    p = tmp_path / "list.jsonl"
    p.write_text(json.dumps({"id": "a", "text": "x"}) + "\n[1, 2]\n")
    with pytest.raises(InputError, match=rf"{p}:2"):
        _drain(p)


def test_no_files_match_glob(tmp_path):
    with pytest.raises(InputError) as ei:
        resolve_corpus_files([str(tmp_path / "nothing" / "*.parquet")])
    msg = str(ei.value)
    assert str(tmp_path / "nothing" / "*.parquet") in msg and "corpus.paths" in msg
    # Also through the stage, with the {run} placeholder expanded in the message.
    import climb.stages.embed
    with pytest.raises(InputError, match=rf"{tmp_path / 'run'}/data/corpus/\*\.parquet"):
        climb.stages.embed.run(RunConfig(), RunPaths(tmp_path / "run"))


def test_missing_file_named(tmp_path):
    with pytest.raises(InputError, match=r"gone\.parquet: file not found; check corpus\.paths"):
        _drain(tmp_path / "gone.parquet")


def test_duplicate_ids_rejected(tmp_path, fake_model):
    import climb.stages.embed
    _parquet(tmp_path / "a.parquet", id=["x", "y", "x"], text=["one", "two", "three"])
    with pytest.raises(InputError, match=r"a\.parquet: document ids in column 'id' are not unique.*id_column"):
        climb.stages.embed.run(_cfg(tmp_path / "*.parquet"), RunPaths(tmp_path / "run"))


def test_same_file_name_in_two_folders(tmp_path, fake_model):
    """Two corpus files with one shard name would write the same embedding files: refused
    before anything is embedded, naming the clash and the fix."""
    import climb.stages.embed
    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
        _parquet(tmp_path / sub / "part.parquet", id=[f"{sub}{i}" for i in range(4)], text=[f"{sub} text"] * 4)
    cfg = RunConfig(corpus=CorpusConfig(paths=(str(tmp_path / "a" / "*.parquet"), str(tmp_path / "b" / "*.parquet"))))
    with pytest.raises(InputError, match=r"corpus files share the shard name\(s\) \['part'\].*rename them"):
        climb.stages.embed.run(cfg, RunPaths(tmp_path / "run"))
    assert fake_model.texts_seen == 0
    assert not (tmp_path / "run" / "embed" / "manifest.json").exists()
