"""Memory: a stage's peak does not grow with a corpus four times larger (the same shards).

Two synthetic corpora of SHARD_DOCS-document Parquet shards, SMALL and LARGE shards (the small
one is the large one's first shards), go through embed (conftest.py's fake bag-of-words model),
cluster (dedup on: exact and near, dropped), tokenize (a BPE of 320) and export (Parquet: the
natural mixture at EPOCHS epochs, so that the export writes four times more for the larger
corpus, as it does at scale). The search is not run (its memory is its proxies', not the
corpus's): a stand-in writes `search/mixture.json` through the stage bookkeeping.

Each stage of each corpus runs in a fresh process of its own (the stage module's `run`, on the
local, in-process executor), twice:

1. plainly. Its peak RSS is the process's `ru_maxrss` then (the same figure `os.wait4` gives
   for a process without children, as benchmarks/scale.py measures; the parent's `os.wait4`
   figure covers pass 2 as well). Also Arrow's memory pool's peak (Parquet buffers and
   tables, which tracemalloc does not see).
2. again from scratch (its outputs removed, the modules it imports lazily already imported)
   under tracemalloc: the peak of the Python objects and numpy arrays it allocates.

At test sizes the interpreter and its libraries dominate RSS: 145-265 MB before a stage starts
(torch, which climb.runtime.device imports, among them), and most of a stage's own 70-210 MB
are the libraries it loads lazily and their allocators' pools. The RSS rule, on the stage's own
RSS (its process's peak less what it was before the stage), catches only gross growth (tens
of MB). The traced peak, 0.7-3 MiB here, is what catches an O(corpus) structure: with 9,000
documents more, the rule fails for anything holding more than about 50-130 bytes a document
of the whole corpus (a Python object per document, a row of the embeddings), not for a few
bytes a document (one int64 per document: 72 KB here). Arrow's peak catches every shard's
table held. Constants sized for production are scaled down in the stage processes, or they
would be most of a traced peak here: digests' 8 MiB read buffer (one bytes object of 8 MiB
per file hashed, however small the file), the cluster summary's top-terms sample (20,000
documents at any size above that: the whole corpus here; TOP_TERMS_DOCS instead) and the
sizes of dedup's passes (DEDUP_PASSES: a million documents and more; each pass's temporaries
would hold the whole corpus here, and the rule could not tell them from state held).

The rule, for each stage and each measure: large <= RATIO x small + the measure's slack (the
slacks are explained where they are defined). The cluster stage is measured with dedup on and,
in the same process, traced with dedup off; both must hold the rule.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

REPO = Path(__file__).resolve().parents[1]
SHARD_DOCS = 750
SMALL, LARGE = 4, 16
STAGES = ("embed", "cluster", "tokenize", "export")
EPOCHS = 1.5  # the export's budget, in epochs of every cluster (search.epoch_cap, export.token_budget = 0)
TOP_TERMS_DOCS = 500  # the cluster summary's top-terms sample (20,000 documents in climb.stages.cluster)
RATIO = 1.3
# RSS: allocator warm-up. The fake embedding's anonymous RSS rises by ~16 MB over its first
# ~10 shards and then stays flat (measured to 48 shards of 1,000 documents), so 4 and 16 shards
# differ by that much with nothing held; 32 MB is twice it (RATIO adds 22-52 MB more).
RSS_SLACK = 32 << 20
# Traced and Arrow: what a stage keeps per shard, legitimately: its name, a task, a stats dict,
# the manifest's entry for each file it wrote (size, time, SHA-256), the summary of each
# shard's clusters. Measured at 2-10 KB a shard (embed ~2, export ~5, tokenize ~10): 12
# shards more, at most ~120 KB; 256 KB is twice that, and a ninth of what holding every
# shard's embeddings would add (12 x SHARD_DOCS x 64 float32: 2.3 MB).
TRACED_SLACK = 256 << 10
ARROW_SLACK = 256 << 10
# climb.stages.cluster.dedup's passes, in documents (production: 2^20, 2^21 and 2^20 documents, blocks of
# 8,192 embeddings), here smaller than either corpus, so that what the traced peak sees of dedup
# is what it holds for the whole corpus (each document's fine cluster, each duplicate's rows: ~3
# bytes a document here) and one fine cluster's search, not a pass's temporaries. Before dedup
# worked in passes its traced peak was 0.58 MiB at 3,000 documents and 2.17 at 12,000 (~190 bytes
# a document: every id as a Python string, the whole corpus's arrays and their sort); in passes
# (the production sizes) 0.29 and 1.10 MiB, all of it the passes' temporaries (~94 bytes a document
# up to a million documents, flat above); with these, 0.21 and 0.30 MiB.
DEDUP_PASSES = {"EXACT_BUCKET": 1000, "NEAR_PASS": 1000, "MARK_BATCH": 200, "BLOCK": 128}

CHILD = r"""
import dataclasses, gc, importlib, json, resource, shutil, sys, time, tracemalloc
from pathlib import Path
t0 = time.process_time()
args = json.loads(sys.argv[1])
sys.path[:0] = [args["repo"], args["tests"]]
import pyarrow as pa
from climb.config import digest, load_config
from climb.runtime.stage import execute
from climb.runtime.layout import RunPaths
import climb.io.digests
stage = args["stage"]
module = importlib.import_module("climb.stages." + stage)
climb.io.digests.CHUNK = 64 << 10  # production's 8 MiB: one 8 MiB bytes object per file hashed
paths = RunPaths(Path(args["run"]).resolve())
if stage == "embed":
    from conftest import FakeModel
    module.load_model = lambda cfg, student="": FakeModel()
if stage == "cluster":
    import climb.stages.cluster.dedup
    for name, value in args["dedup_passes"].items():
        setattr(climb.stages.cluster.dedup, name, value)
    # The top terms' sample: 20,000 documents (so every document, at test sizes); here fewer.
    cap = args["top_terms_docs"] / paths.stats("embed")["docs"]
    summarise = module.finalise_shard

    def finalise_shard(task):
        return summarise(dataclasses.replace(task, sample_p=min(task.sample_p, cap)))
    module.finalise_shard = finalise_shard
if stage == "export" and not paths.manifest("search").exists():
    # The search's contract, without a search: the natural mixture (the clusters' token shares).
    from climb.io.files import write_json
    from climb.stages.tokenize import cluster_tokens
    tokens = cluster_tokens(paths)
    weights = (tokens / tokens.sum()).tolist()

    def stand_in(folder, ex):
        write_json(paths.search.mixture, {"weights": weights})
        return {"stand_in": True, "comparison": {}, "proxies": 0}  # what the export card reads
    execute(paths, "search", digest("test_stage_memory", weights), stand_in)


def kib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def traced(sets):
    shutil.rmtree(paths.root / stage)  # from scratch: the stage's own allocations, its imports done
    gc.collect()
    tracemalloc.start()
    stats = module.run(load_config(None, sets), paths)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert not stats.get("skipped_stage")
    return peak


cfg = load_config(None, args["sets"])
out = {"before_kib": kib(), "imports_cpu_s": round(time.process_time() - t0, 2)}
t = time.process_time()
stats = module.run(cfg, paths)
assert not stats.get("skipped_stage")
out.update(rss_kib=kib(), arrow=pa.default_memory_pool().max_memory(), docs=stats.get("docs"),
           rows=stats.get("rows"), plain_cpu_s=round(time.process_time() - t, 2))
t = time.process_time()
for name, sets in args["also"].items():  # other settings, traced (the outputs left are the main run's)
    out["traced_" + name] = traced(sets)
out["traced"] = traced(args["sets"])
out["traced_cpu_s"] = round(time.process_time() - t, 2)
print("MEASURED " + json.dumps(out))
"""


# --------------------------------------------------------------------------- the corpora

def _vocabulary(n: int, rng) -> np.ndarray:
    """n distinct lower-case pseudo-words of 2-4 syllables, sorted."""
    onsets = list("bcdfghjklmnprstvwz") + ["ch", "sh", "th", "tr", "br", "st", "pl", "gr"]
    vowels = ["a", "e", "i", "o", "u", "ai", "ea", "ou"]
    words: set[str] = set()
    while len(words) < n:
        k = int(rng.integers(2, 5))
        words.add("".join(onsets[rng.integers(len(onsets))] + vowels[rng.integers(len(vowels))] for _ in range(k)))
    return np.array(sorted(words))


VOCAB = _vocabulary(1640, np.random.default_rng(1))
COMMON, TOPICS = VOCAB[:200], VOCAB[200:].reshape(12, 120)
ZIPF = 1.0 / np.arange(1, 121) ** 1.1
ZIPF /= ZIPF.sum()


def shard_texts(shard: int, prev: list[str]) -> list[str]:
    """One shard's documents: each of 8-40 words from one of 12 topics (a Zipf draw from the
    topic's 120 words, a quarter replaced by 200 common words); about 2% exact duplicates
    (recased or repunctuated) and 2% near ones (the same words reordered: the same fake
    embedding) of documents of this shard or `prev`, the shard before. The same for the same
    shard in either corpus."""
    rng = np.random.default_rng([7, shard])
    docs: list[str] = []
    for _ in range(SHARD_DOCS):
        r = rng.random()
        if r < 0.04 and (prev or docs):
            j = int(rng.integers(len(prev) + len(docs)))
            src = prev[j] if j < len(prev) else docs[j - len(prev)]
            if r < 0.02:
                docs.append(src.upper() if r < 0.01 else src.replace(".", " !"))
            else:
                words = src.split()
                docs.append(" ".join(words[j] for j in rng.permutation(len(words))))
            continue
        n = int(rng.integers(8, 41))
        words = TOPICS[int(rng.integers(12))][rng.choice(120, size=n, p=ZIPF)]
        common = rng.random(n) < 0.25
        words[common] = COMMON[rng.integers(200, size=int(common.sum()))]
        docs.append(" ".join(words).capitalize() + ".")
    return docs


def write_corpus(folder: Path, shards: int) -> None:
    folder.mkdir(parents=True)
    prev: list[str] = []
    for s in range(shards):
        texts = shard_texts(s, prev)
        ids = [f"s{s:03d}-{i:05d}" for i in range(len(texts))]
        pq.write_table(pa.table({"id": ids, "text": texts}), folder / f"part-{s:05d}.parquet")
        prev = texts


# --------------------------------------------------------------------------- measuring

def settings(corpus: Path, dedup: bool = True) -> list[str]:
    return [f'corpus.paths=["{corpus}/*.parquet"]', "cluster.k=16", "cluster.niter=10", "cluster.sample_size=2000",
            f"dedup.exact={str(dedup).lower()}", f"dedup.threshold={0.95 if dedup else 0.0}", "dedup.drop=true",
            "proxy.vocab_size=320", "proxy.tokenizer_docs=200", f"search.epoch_cap={EPOCHS}",
            "export.token_budget=0", 'export.format="parquet"']


def measure(run: Path, corpus: Path, stage: str) -> dict:
    also = {"no_dedup": settings(corpus, dedup=False)} if stage == "cluster" else {}
    arg = json.dumps({"repo": str(REPO), "tests": str(REPO / "tests"), "run": str(run), "stage": stage,
                      "sets": settings(corpus), "also": also, "top_terms_docs": TOP_TERMS_DOCS,
                      "dedup_passes": DEDUP_PASSES})
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               TOKENIZERS_PARALLELISM="false")
    with open(run.parent / f"{run.name}-{stage}.log", "w+") as log:
        proc = subprocess.Popen([sys.executable, "-c", CHILD, arg], cwd=REPO, env=env, stdout=log,
                                stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        log.seek(0)
        text = log.read()
    assert proc.returncode == 0, f"{stage} on {corpus.name}:\n{text[-3000:]}"
    got = json.loads(next(x for x in text.splitlines() if x.startswith("MEASURED "))[len("MEASURED "):])
    got["wait4_kib"] = usage.ru_maxrss  # the process's whole life: the traced passes too
    return got


@pytest.fixture(scope="module")
def peaks(tmp_path_factory):
    """{shards: {stage: measurements}}, every stage of the small corpus, then of the large."""
    root = tmp_path_factory.mktemp("stage_memory")
    out = {}
    for shards in (SMALL, LARGE):
        corpus = root / f"corpus{shards}"
        write_corpus(corpus, shards)
        out[shards] = {s: measure(root / f"run{shards}", corpus, s) for s in STAGES}
    (root / "peaks.json").write_text(json.dumps(out, indent=1))
    return out


def _check(stage: str, small: dict, large: dict, key: str, slack: int) -> None:
    a, b = small[key], large[key]
    assert b <= RATIO * a + slack, (f"{stage}: {key} {b / 2**20:.2f} MiB for {LARGE} shards against "
                                    f"{a / 2**20:.2f} MiB for {SMALL} (allowed {(RATIO * a + slack) / 2**20:.2f})")


def test_the_corpora_are_four_times_apart_and_the_stages_did_their_work(peaks):
    small, large = peaks[SMALL], peaks[LARGE]
    assert small["embed"]["docs"] == SMALL * SHARD_DOCS and large["embed"]["docs"] == LARGE * SHARD_DOCS
    assert small["cluster"]["docs"] == SMALL * SHARD_DOCS and large["cluster"]["docs"] == LARGE * SHARD_DOCS
    for shards in (SMALL, LARGE):  # every document but the duplicates dropped, EPOCHS times over
        got = peaks[shards]["export"]
        assert 0.9 * shards * SHARD_DOCS < got["docs"] < shards * SHARD_DOCS
        assert abs(got["rows"] / got["docs"] - EPOCHS) < 0.02
    assert 3.5 < large["export"]["rows"] / small["export"]["rows"] < 4.5
    for got in (m for p in peaks.values() for m in p.values()):  # os.wait4 saw at least the stage's own peak
        assert got["before_kib"] <= got["rss_kib"] <= got["wait4_kib"]


@pytest.mark.parametrize("stage", STAGES)
def test_peak_rss_does_not_grow_with_the_corpus(peaks, stage):
    """The stage's own RSS: its process's peak less what it was before the stage (the imports,
    the same for both corpora, 145-265 MB: on the whole figure RATIO would allow 45-80 MB more)."""
    own = [{"rss": (p[stage]["rss_kib"] - p[stage]["before_kib"]) * 1024} for p in (peaks[SMALL], peaks[LARGE])]
    _check(stage, *own, "rss", RSS_SLACK)


@pytest.mark.parametrize("stage", STAGES)
def test_arrow_peak_does_not_grow_with_the_corpus(peaks, stage):
    _check(stage, peaks[SMALL][stage], peaks[LARGE][stage], "arrow", ARROW_SLACK)


@pytest.mark.parametrize("stage", [
    "embed", "tokenize", "export", "cluster_no_dedup", "cluster"])
def test_traced_peak_does_not_grow_with_the_corpus(peaks, stage):
    name, key = ("cluster", "traced_no_dedup") if stage == "cluster_no_dedup" else (stage, "traced")
    _check(stage, peaks[SMALL][name], peaks[LARGE][name], key, TRACED_SLACK)
