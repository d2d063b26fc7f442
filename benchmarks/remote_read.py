"""Reading the corpus from S3 against reading it from local disk, with embed's own reader.

    python benchmarks/remote_read.py [--corpus ../shared/data/corpus] [--repeats 3]
        [--out benchmarks/results/remote_read.json]
    python benchmarks/remote_read.py --shards 1 --repeats 1 --out /tmp/x.json   # a quick look

The shards are read where they are on disk and put into a bucket of moto's S3
server, started here in a process of its own on 127.0.0.1 (so it does not share
this process's interpreter lock), reached through s3fs with credentials and
endpoint from the environment as a user sets them. Each pass reads every shard
with `climb.io.files.read_documents` (what `climb embed` iterates, batch_rows 2048),
resolving the files with the same glob a config would hold; local and S3 passes
alternate after one warm-up pass each (the page cache and the server's memory
both hot), and the median pass is reported. The figure is the reader's cost:
the network here is loopback, so a real store adds its latency and bandwidth.

The output is a JSON list of {"name", "ours", "baseline", "unit", "ratio", "details"}:
ours = from S3, baseline = from local disk. Needs ../shared/data/corpus and the
test extra (moto[server], s3fs); without them the script says so and exits 0.
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import CORPUS, RESULTS, load_avg, shared_or_skip, show, timer, today, write_result


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server() -> tuple[subprocess.Popen, str]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("moto's S3 server did not start within 60 s")


def read_pass(pattern: str, shards: int, batch_rows: int) -> dict:
    from climb.io.files import read_documents, resolve_corpus_files
    docs = chars = 0
    with timer() as t:
        for f in resolve_corpus_files([pattern], max_shards=shards):
            for b in read_documents(f, "text", "id", batch_rows=batch_rows):
                docs += len(b.ids)
                chars += sum(len(text) for text in b.texts)
    return {"seconds": t.seconds, "docs": docs, "chars": chars}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    ap.add_argument("--shards", type=int, default=0, help="read only the first N shards (0: all)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch-rows", type=int, default=2048)
    ap.add_argument("--out", type=Path, default=RESULTS / "remote_read.json")
    args = ap.parse_args(argv)
    if shared_or_skip(args.corpus, "remote_read", "*.parquet") is None:
        return 0
    shards = sorted(args.corpus.glob("*.parquet"))[: args.shards or None]
    try:
        import moto.server  # noqa: F401
        import s3fs
    except ImportError as e:
        print(f"needs the test extra (moto[server], s3fs): {e}; nothing measured")
        return 0
    proc, endpoint = start_server()
    try:
        os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1",
                          AWS_ENDPOINT_URL=endpoint, AWS_EC2_METADATA_DISABLED="true")
        fs = s3fs.S3FileSystem()
        fs.mkdir("bench")
        with timer() as t:
            for p in shards:
                fs.put_file(str(p), f"bench/corpus/{p.name}")
        upload_s = t.seconds
        nbytes = sum(p.stat().st_size for p in shards)
        # One glob per source, as a config's corpus.paths would hold it.
        sources = {"local": str(args.corpus.resolve() / "*.parquet"), "s3": "s3://bench/corpus/*.parquet"}
        passes: dict[str, list[dict]] = {"local": [], "s3": []}
        for rep in range(args.repeats + 1):
            order = ("local", "s3") if rep % 2 == 0 else ("s3", "local")
            for name in order:
                res = read_pass(sources[name], args.shards, args.batch_rows)
                if rep:  # the first pass of each warms the caches
                    passes[name].append(res)
                print(f"{name} pass {rep}: {res['docs']} docs in {res['seconds']:.2f} s", flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    med = {k: statistics.median(p["seconds"] for p in v) for k, v in passes.items()}
    docs = passes["local"][0]["docs"]
    assert all(p["docs"] == docs for v in passes.values() for p in v), "S3 and local read different documents"
    rate = {k: docs / s for k, s in med.items()}
    load = load_avg()
    result = [{
        "name": "remote_read", "ours": round(rate["s3"], 1), "baseline": round(rate["local"], 1),
        "unit": "docs/s", "ratio": round(rate["s3"] / rate["local"], 3),
        "details": {
            "what": "climb.io.files.read_documents over every shard (embed's reader): ours = s3:// from moto's S3 "
                    "server on 127.0.0.1 through s3fs, baseline = local disk",
            "shards": len(shards), "docs": docs, "chars": passes["local"][0]["chars"], "file_bytes": nbytes,
            "mb_per_s_s3": round(nbytes / med["s3"] / 1e6, 1), "mb_per_s_local": round(nbytes / med["local"] / 1e6, 1),
            "seconds_s3": [round(p["seconds"], 3) for p in passes["s3"]],
            "seconds_local": [round(p["seconds"], 3) for p in passes["local"]],
            "upload_seconds": round(upload_s, 2), "batch_rows": args.batch_rows, "repeats": args.repeats,
            "cpus": os.cpu_count(), "loadavg_after": load, "date": today(),
            "command": "python benchmarks/remote_read.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        }}]
    write_result(args.out, result)
    show(result, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
