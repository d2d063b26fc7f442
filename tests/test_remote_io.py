"""climb.io.remote through climb.io.files: corpora at URLs read exactly as local files are.

memory:// for the unit tests (no server), http:// through a local `http.server`
with byte ranges (tests/stores.py). The S3 server tests are in test_remote_s3.py.
"""
from __future__ import annotations

import gzip
import json
import socket
import uuid

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from climb.io import remote
from climb.cli import main
from climb.config import TargetConfig
from climb.io.files import InputError, fingerprint, is_url, read_documents, resolve_corpus_files, write_parquet
from stores import http_root, upload  # noqa: F401 - a fixture
from test_files import _read_all  # every batch of a file, joined

DOCS = [{"id": f"d{i}", "text": f"document number {i} — naïve café ✓", "score": i / 10} for i in range(7)]
DOCS[3]["text"] = "   "  # skipped as empty, and counted, on both sides


def _jsonl(docs) -> bytes:
    return "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs).encode("utf-8")


def _encode(name: str, docs=DOCS) -> bytes:
    if name.endswith(".parquet"):
        sink = pa.BufferOutputStream()
        pq.write_table(pa.table({k: [d[k] for d in docs] for k in docs[0]}), sink, row_group_size=3)
        return sink.getvalue().to_pybytes()
    raw = _jsonl(docs)
    if name.endswith(".gz"):
        return gzip.compress(raw)
    if name.endswith(".zst"):
        return zstandard.ZstdCompressor().compress(raw)
    return raw


@pytest.fixture
def mem():
    """A fresh folder on the memory:// filesystem: (filesystem, its URL)."""
    fs = fsspec.filesystem("memory")
    root = f"/t-{uuid.uuid4().hex[:8]}"
    yield fs, f"memory://{root}"
    fs.rm(root, recursive=True) if fs.exists(root) else None


def test_is_url():
    assert is_url("s3://b/k") and is_url("hf://datasets/a/b") and is_url("https://x/y") and is_url("memory://x")
    assert not is_url("/data/x.parquet") and not is_url("data/*.parquet") and not is_url("file:///data/x")


@pytest.mark.parametrize("name", ["c.parquet", "c.jsonl", "c.jsonl.gz", "c.jsonl.zst"])
@pytest.mark.parametrize("id_column", ["id", ""])
def test_url_reads_like_the_local_file(tmp_path, mem, name, id_column):
    fs, root = mem
    local = tmp_path / name
    local.write_bytes(_encode(name))
    upload(fs, local, f"{root}/{name}")
    want = _read_all(local, "text", id_column, ["score"], batch_rows=2)
    got = _read_all(f"{root}/{name}", "text", id_column, ["score"], batch_rows=2)
    assert got == want
    assert len(want[0]) == 6 and want[3] == {"empty": 1}


def test_globs_folders_and_hidden_names(mem):
    fs, root = mem
    for name in ("b.parquet", "a.parquet", "notes.txt", ".a.parquet", "_SUCCESS"):
        fs.pipe(f"{root}/corpus/{name}".split("://")[1], _encode("x.parquet"))
    fs.pipe(f"{root}/corpus/.climb-tmp/x/c.parquet".split("://")[1], b"half-written")
    found = resolve_corpus_files([f"{root}/corpus/*.parquet"])
    assert [remote.basename(f) for f in found] == ["a.parquet", "b.parquet"]
    assert all(f.startswith("memory://") and isinstance(f, str) for f in found)
    # `**` does not reach into hidden staging folders either
    assert [remote.basename(f) for f in resolve_corpus_files([f"{root}/**/*.parquet"])] == ["a.parquet", "b.parquet"]
    assert resolve_corpus_files([f"{root}/corpus/b.parquet"]) == [found[1]]
    assert resolve_corpus_files([f"{root}/corpus/a.parquet"], max_shards=1) == [found[0]]
    with pytest.raises(InputError, match="no corpus files match .*nothing"):
        resolve_corpus_files([f"{root}/nothing/*.parquet"])
    # A folder means its visible files, as a local folder does.
    for name in ("b.parquet", "a.parquet", ".a.parquet", "_SUCCESS"):
        fs.pipe(f"{root}/folder/{name}".split("://")[1], _encode("x.parquet"))
    assert [remote.basename(f) for f in resolve_corpus_files([f"{root}/folder"])] == ["a.parquet", "b.parquet"]


def test_save_to_disk_folder_at_a_url(tmp_path, mem):
    datasets = pytest.importorskip("datasets")
    fs, root = mem
    folder = tmp_path / "saved"
    datasets.Dataset.from_dict({"id": [d["id"] for d in DOCS], "text": [d["text"] for d in DOCS]}).save_to_disk(folder)
    upload(fs, folder, f"{root}/saved")
    local = resolve_corpus_files([str(folder)])
    urls = resolve_corpus_files([f"{root}/saved"])
    assert [remote.basename(u) for u in urls] == [p.name for p in local] and urls[0].endswith(".arrow")
    assert _read_all(urls[0], batch_rows=4) == _read_all(local[0], batch_rows=4)


def test_fingerprint_changes_with_the_object(mem):
    fs, root = mem
    url = f"{root}/c.parquet"
    fs.pipe(url.split("://")[1], _encode("c.parquet"))
    first = fingerprint([url])[0]
    assert first[0] == url and first[1] == len(_encode("c.parquet"))
    assert fingerprint([url])[0] == first
    fs.pipe(url.split("://")[1], _encode("c.parquet", DOCS[::-1]))  # same size, other content
    assert fingerprint([url])[0] != first


def test_write_to_a_url_is_atomic(mem):
    fs, root = mem
    url = f"{root}/out/data/part.parquet"
    table = pa.table({"id": ["a", "b"], "n": [1, 2]})
    write_parquet(url, table, staging=f"{root}/out")
    assert fs.find(root.split("://")[1]) == [url.split("://")[1]]  # nothing left in .climb-tmp
    assert pq.read_table(fs.open(url.split("://")[1])).equals(table)

    def broken(fh):
        fh.write(b"PAR1 half a file")
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="on fire"):
        remote.write_atomic(url, broken, staging=f"{root}/out")
    # The old object is whole under its name; the half-written one is gone.
    assert fs.find(root.split("://")[1]) == [url.split("://")[1]]
    assert pq.read_table(fs.open(url.split("://")[1])).equals(table)


def test_missing_object_and_unknown_protocol_name_the_url(mem):
    fs, root = mem
    with pytest.raises(InputError, match=r"memory://.*/gone\.parquet: not found"):
        list(read_documents(f"{root}/gone.parquet"))
    with pytest.raises(InputError, match=r"nosuch://b/x\.parquet: .*Protocol not known"):
        resolve_corpus_files(["nosuch://b/x.parquet"])


def test_missing_package_names_the_extra():
    try:
        import gcsfs  # noqa: F401
        pytest.skip("gcsfs is installed")
    except ImportError:
        pass
    with pytest.raises(InputError, match=r"gs://b/\*\.parquet: gs:// URLs need gcsfs .*pip install 'climb\[gcs\]'"):
        resolve_corpus_files(["gs://b/*.parquet"])


def test_target_texts_and_tasks_at_urls(tmp_path, mem):
    from climb.runtime.proxy_runs import load_target
    fs, root = mem
    (tmp_path / "held.jsonl").write_bytes(_encode("held.jsonl"))
    task = [{"query": "Question: 2+2?", "choices": ["4", "5"], "gold": 0}, {"context": "a b", "continuation": " c"}]
    (tmp_path / "qa.jsonl").write_text("".join(json.dumps(t) + "\n" for t in task))
    upload(fs, tmp_path / "held.jsonl", f"{root}/held/part-0.jsonl")
    upload(fs, tmp_path / "qa.jsonl", f"{root}/tasks/qa.jsonl")
    local = load_target(TargetConfig(texts=(str(tmp_path / "held.jsonl"),), tasks={"qa": str(tmp_path / "qa.jsonl")}),
                        tmp_path)
    at_url = load_target(TargetConfig(texts=(f"{root}/held/*.jsonl",), tasks={"qa": f"{root}/tasks/qa.jsonl"}),
                         tmp_path)
    assert local["tasks"] == at_url["tasks"] and len(at_url["tasks"]["qa"]) == 2
    assert at_url["texts"] == local["texts"] and len(local["texts"]) == 6
    with pytest.raises(InputError, match=r"memory://.*/nope\.jsonl: not found.*target\.tasks\.qa"):
        load_target(TargetConfig(tasks={"qa": f"{root}/nope.jsonl"}), tmp_path)


def test_http_glob_and_streaming_read(tmp_path, http_root, monkeypatch):
    # Three 2,000-row Parquet shards of ~400 kB, read in 16 kB blocks: no response may be a whole file.
    monkeypatch.setattr(remote, "BLOCK_SIZE", 16 * 1024)
    rng = np.random.default_rng(0)
    docs = [{"id": f"h{i}", "text": f"{i} " + rng.bytes(150).hex()} for i in range(6000)]
    (http_root.root / "corpus").mkdir()
    for s in range(3):
        pq.write_table(pa.table({k: [d[k] for d in docs[s::3]] for k in ("id", "text")}),
                       http_root.root / "corpus" / f"part-{s}.parquet", row_group_size=100)
    (http_root.root / "corpus" / "held.jsonl.gz").write_bytes(_encode("x.jsonl.gz"))
    urls = resolve_corpus_files([f"{http_root.url}/corpus/*.parquet"])
    assert urls == [f"{http_root.url}/corpus/part-{s}.parquet" for s in range(3)]
    for s, url in enumerate(urls):
        want = _read_all(http_root.root / "corpus" / f"part-{s}.parquet")
        assert _read_all(url) == want and len(want[0]) == 2000
    sizes = {f"/corpus/part-{s}.parquet": (http_root.root / "corpus" / f"part-{s}.parquet").stat().st_size
             for s in range(3)}
    parquet = [(p, n) for p, n in http_root.sent if p in sizes]
    assert len(parquet) > 3 * 10 and all(n < sizes[p] / 5 for p, n in parquet), parquet
    # a compressed JSON Lines file streams too; fingerprints carry size and Last-Modified
    gz = f"{http_root.url}/corpus/held.jsonl.gz"
    assert _read_all(gz) == _read_all(http_root.root / "corpus" / "held.jsonl.gz")
    fp = fingerprint([urls[0]])[0]
    assert fp[0] == urls[0] and fp[1] == sizes["/corpus/part-0.parquet"] and fp[2]
    missing = f"{http_root.url}/corpus/missing.parquet"
    with pytest.raises(InputError, match=f"no corpus files match '{missing}'"):
        resolve_corpus_files([missing])
    with pytest.raises(InputError, match=f"{missing}: not found"):
        list(read_documents(missing))


def test_unreachable_server_names_the_url():
    pytest.importorskip("aiohttp")
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/corpus/a.parquet"
    with pytest.raises(InputError, match=f"{url}: cannot reach it .*check the address"):
        resolve_corpus_files([url])


def test_run_folder_must_be_local(capsys):
    assert main(["cluster", "--config", "pipelines/demo.toml", "--run", "s3://bucket/runs/demo"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "s3://bucket/runs/demo is a URL" in err and "export.destination" in err
