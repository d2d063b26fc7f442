"""climb.io.files: reading every supported corpus format the same way, globs, ids, atomic writes."""
from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from climb.io.files import InputError, atomic_path, read_documents, resolve_corpus_files, write_json, write_parquet

DOCS = [{"id": f"d{i}", "text": f"document number {i} — naïve café ✓", "score": i / 10} for i in range(7)]


def _jsonl_bytes(docs) -> bytes:
    return "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs).encode("utf-8")


def _write(path: Path, docs=DOCS) -> Path:
    """Write docs in the format the file name asks for."""
    name = path.name
    if name.endswith(".parquet"):
        pq.write_table(pa.table({k: [d[k] for d in docs] for k in docs[0]}), path)
    elif name.endswith(".jsonl"):
        path.write_bytes(_jsonl_bytes(docs))
    elif name.endswith(".jsonl.gz"):
        path.write_bytes(gzip.compress(_jsonl_bytes(docs)))
    elif name.endswith(".jsonl.zst"):
        path.write_bytes(zstandard.ZstdCompressor().compress(_jsonl_bytes(docs)))
    else:
        raise AssertionError(name)
    return path


def _read_all(path, *args, **kw):
    ids, texts, extra, skipped = [], [], {}, {}
    for b in read_documents(path, *args, **kw):
        ids += b.ids
        texts += b.texts
        for k, v in b.extra.items():
            extra.setdefault(k, []).extend(v)
        for k, v in b.skipped.items():
            skipped[k] = skipped.get(k, 0) + v
    return ids, texts, extra, skipped


@pytest.mark.parametrize("name", ["c.parquet", "c.jsonl", "c.jsonl.gz", "c.jsonl.zst"])
@pytest.mark.parametrize("batch_rows", [3, 2048])
def test_read_documents_formats_agree(tmp_path, name, batch_rows):
    p = _write(tmp_path / name)
    batches = list(read_documents(p, "text", "id", extra_columns=["score"], batch_rows=batch_rows))
    assert all(len(b.ids) <= batch_rows for b in batches)
    ids, texts, extra, skipped = _read_all(p, "text", "id", extra_columns=["score"], batch_rows=batch_rows)
    assert ids == [d["id"] for d in DOCS]
    assert texts == [d["text"] for d in DOCS]  # unicode survives every format
    assert extra == {"score": [d["score"] for d in DOCS]}
    assert skipped == {}


def test_read_hf_save_to_disk_folder(tmp_path):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"id": [d["id"] for d in DOCS], "text": [d["text"] for d in DOCS]})
    folder = tmp_path / "saved"
    ds.save_to_disk(str(folder), num_shards=2)
    files = resolve_corpus_files([str(folder)])
    assert len(files) == 2 and all(f.suffix == ".arrow" and f.parent == folder for f in files)
    ids, texts = [], []
    for f in files:
        i, t, _, skipped = _read_all(f, "text", "id", batch_rows=2)
        ids += i
        texts += t
        assert skipped == {}
    assert ids == [d["id"] for d in DOCS] and texts == [d["text"] for d in DOCS]
    # A missing column in an arrow file is reported like for Parquet.
    with pytest.raises(InputError, match=r"data-0000.*missing column.*'body'.*corpus\.text_column"):
        _read_all(files[0], "body", "id")


def test_resolve_globs_folders_run_placeholder_and_max_shards(tmp_path):
    run = tmp_path / "run"
    (run / "data").mkdir(parents=True)
    for i in (2, 0, 1):
        _write(run / "data" / f"part-{i}.parquet")
    _write(run / "data" / "extra.jsonl.gz")
    (run / "data" / "_SUCCESS").write_text("")  # hidden/marker files are ignored in folder mode
    (run / "data" / ".hidden.parquet").write_text("")
    want = [run / "data" / f"part-{i}.parquet" for i in range(3)]
    assert resolve_corpus_files(["{run}/data/*.parquet"], run) == want  # sorted, marker files not matched
    assert resolve_corpus_files([str(run / "data" / "*.parquet")]) == want
    assert resolve_corpus_files([str(run / "data" / "part-[01].parquet")]) == want[:2]
    assert resolve_corpus_files(["{run}/data/*.parquet"], run, max_shards=2) == want[:2]
    assert resolve_corpus_files([str(run / "**" / "*.jsonl.gz")]) == [run / "data" / "extra.jsonl.gz"]
    folder = resolve_corpus_files([str(run / "data")])
    assert folder == [run / "data" / "extra.jsonl.gz"] + want
    both = resolve_corpus_files(["{run}/data/*.parquet", "{run}/data/*.jsonl.gz"], run)
    assert both == want + [run / "data" / "extra.jsonl.gz"]


def test_resolve_rejects_unsupported_files(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(InputError, match=r"notes\.txt: unsupported file type.*Parquet.*JSON Lines"):
        resolve_corpus_files([str(tmp_path / "*.txt")])


@pytest.mark.parametrize("name", ["a.parquet", "a.jsonl.gz"])
def test_empty_id_column_makes_stable_row_ids(tmp_path, name):
    docs = [dict(d) for d in DOCS]
    docs[2]["text"] = "   "  # a skipped row still takes its row number
    p = _write(tmp_path / name, docs)
    stem = p.stem  # "a" for a.parquet, "a.jsonl" for a.jsonl.gz
    first, texts, _, skipped = _read_all(p, "text", "", batch_rows=2)
    second, _, _, _ = _read_all(p, "text", "", batch_rows=5)
    assert first == second == [f"{stem}:{r}" for r in range(len(docs)) if r != 2]
    assert texts == [d["text"] for i, d in enumerate(docs) if i != 2]
    assert skipped == {"empty": 1}


def test_jsonl_record_without_id_gets_row_id(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text(json.dumps({"id": 7, "text": "a"}) + "\n" + json.dumps({"text": "b"}) + "\n")
    ids, texts, _, _ = _read_all(p)
    assert ids == ["7", "m:1"] and texts == ["a", "b"]


def test_max_shards_through_config(tmp_path):
    from climb.config import CorpusConfig, RunConfig
    from climb.runtime.layout import RunPaths
    for i in range(4):
        _write(tmp_path / f"s{i}.jsonl")
    cfg = RunConfig(corpus=CorpusConfig(paths=(str(tmp_path / "*.jsonl"),), max_shards=3))
    assert RunPaths(tmp_path / "run").corpus_files(cfg) == [tmp_path / f"s{i}.jsonl" for i in range(3)]


def test_atomic_path_success_replaces_and_is_shared(tmp_path):
    target = tmp_path / "sub" / "out.json"
    with atomic_path(target) as tmp:
        assert tmp.parent == target.parent and tmp != target
        tmp.write_text("new")
        assert not target.exists()  # nothing visible until the block succeeds
    assert target.read_text() == "new"
    assert (target.stat().st_mode & 0o777) == 0o644
    assert sorted(os.listdir(target.parent)) == ["out.json"]


def test_atomic_path_exception_keeps_old_file_and_no_temp(tmp_path):
    target = tmp_path / "out.json"
    target.write_text("old")
    with pytest.raises(RuntimeError, match="boom"):
        with atomic_path(target) as tmp:
            tmp.write_text("half written")
            raise RuntimeError("boom")
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["out.json"]
    # Same through the helpers built on it.
    with pytest.raises(TypeError):
        write_json(target, {"x": object()})
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["out.json"]


def test_write_json_and_parquet_roundtrip(tmp_path):
    import numpy as np
    write_json(tmp_path / "a.json", {"n": np.int64(3), "x": np.float32(0.5), "v": np.arange(3), "p": Path("q")})
    assert json.loads((tmp_path / "a.json").read_text()) == {"n": 3, "x": 0.5, "v": [0, 1, 2], "p": "q"}
    t = pa.table({"id": ["a", "b"], "v": [1, 2]})
    write_parquet(tmp_path / "t.parquet", t, row_group_size=1)
    back = pq.read_table(tmp_path / "t.parquet")
    assert back.equals(t) and pq.ParquetFile(tmp_path / "t.parquet").num_row_groups == 2
    assert sorted(os.listdir(tmp_path)) == ["a.json", "t.parquet"]


def test_one_atomic_writer_shared_by_climb_and_proxies(tmp_path, monkeypatch):
    import subprocess
    import sys

    import numpy as np
    import pandas as pd

    import proxies.atomic
    import proxies.tokenizer
    import proxies.tokens
    from climb.io.swarm_csv import write_swarm
    assert atomic_path is proxies.atomic.atomic_path
    # Every writer goes through it: a failed write leaves the old file and no temporary one.
    calls = []
    real = proxies.atomic.atomic_path

    def counting(path):
        calls.append(Path(path).name)
        return real(path)

    for module in (proxies.tokens, proxies.tokenizer):
        monkeypatch.setattr(module, "atomic_path", counting)
    monkeypatch.setattr("climb.io.swarm_csv.atomic_path", counting)
    write_swarm(tmp_path / "w.csv", tmp_path / "m.csv", ["a", "b"], ["x", "y"], np.eye(2), {"loss": [1.0, 2.0]})
    assert pd.read_csv(tmp_path / "w.csv").columns.tolist() == ["index", "x", "y"]
    tok = proxies.tokenizer.train_bpe(["some text to learn from"] * 4, 300, tmp_path / "tok" / "tokenizer.json")
    proxies.tokens.write_shard_tokens(["some text"], [0], tok, tmp_path / "tokens", "s0")
    proxies.tokens.merge_token_stores(tmp_path / "tokens", ["s0"], 1)
    assert calls == ["w.csv", "m.csv", "tokenizer.json", "done.json", "cluster_00000.bin", "index.json"]
    leftovers = [p.name for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]
    assert leftovers == []
    # Importing the writer loads neither torch nor climb (the proxies package never imports climb).
    code = ("import sys, proxies.atomic; assert 'torch' not in sys.modules; "
            "import proxies.evaluate, proxies.model, proxies.sampler, proxies.stacked, proxies.tokenizer, "
            "proxies.tokens, proxies.train; assert not [m for m in sys.modules if m.split('.')[0] == 'climb']")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[1],
                   env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1])))


def test_fingerprint_sees_a_sub_second_change_of_a_same_size_file(tmp_path):
    from climb.io.files import file_stamp, fingerprint
    p = tmp_path / "a.jsonl"
    p.write_text("x" * 10)
    first = fingerprint([p])[0]
    st = p.stat()
    assert first == [str(p), 10, st.st_mtime_ns] and file_stamp(p) == [10, st.st_mtime_ns]
    p.write_text("y" * 10)  # same size
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 1000))  # one microsecond later
    assert fingerprint([p])[0] == [str(p), 10, st.st_mtime_ns + 1000] != first
