"""What knowing inputs by their content costs, against the stage it saves.

A stage key takes each corpus file's SHA-256 (climb.io.digests), cached by path, size, time
and inode. This times, on a corpus (default the scale preset's million documents,
runs/scale-corpus): the first digest of every file (nothing cached: the whole corpus read
once), a second with the cache (a stat per file), and one after every file's time changed
(a copy without its times: read again), and sets them beside the embed stage they let a
copied or re-downloaded corpus skip (its seconds from a finished run's manifest, or
`--embed-seconds`).

    python benchmarks/digest_cost.py --corpus runs/scale-corpus --run runs/scale-1m \\
        --json benchmarks/results/digest_cost.json
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from common import write_result


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default="runs/scale-corpus")
    ap.add_argument("--glob", default="part-*.parquet")
    ap.add_argument("--run", default="", help="a finished run on this corpus, for its embed stage's seconds")
    ap.add_argument("--embed-seconds", type=float, default=0.0)
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    from climb.io.digests import DigestCache, content_fingerprint
    files = sorted(Path(args.corpus).glob(args.glob))
    if not files:
        raise SystemExit(f"no {args.glob} in {args.corpus}")
    size = sum(f.stat().st_size for f in files)
    with tempfile.TemporaryDirectory() as tmp:
        cache = DigestCache(Path(tmp) / "digests.json")
        t0 = time.perf_counter()
        first = content_fingerprint(files, cache)
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        again = content_fingerprint(files, DigestCache(Path(tmp) / "digests.json"))
        warm = time.perf_counter() - t0
        for f in files:  # as after a copy that did not keep the times
            os.utime(f)
        t0 = time.perf_counter()
        touched = content_fingerprint(files, DigestCache(Path(tmp) / "digests.json"))
        retouched = time.perf_counter() - t0
    assert first == again == touched
    embed = args.embed_seconds
    docs = None
    if args.run and (Path(args.run) / "embed" / "manifest.json").exists():
        st = json.loads((Path(args.run) / "embed" / "manifest.json").read_text())["stats"]
        embed, docs = st["seconds"], st.get("docs")
    out = {"files": len(files), "bytes": size, "docs": docs, "cold_seconds": round(cold, 3),
           "cold_GB_per_s": round(size / cold / 1e9, 3), "cached_seconds": round(warm, 4),
           "times_changed_seconds": round(retouched, 3), "embed_seconds": embed,
           "cold_over_embed": round(cold / embed, 5) if embed else None}
    print(json.dumps(out, indent=1))
    if args.json:
        write_result(Path(args.json), out, indent=1)


if __name__ == "__main__":
    main()
