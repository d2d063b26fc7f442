"""Shared fixtures: an offline, single-threaded environment and a fake embedding model.

Nothing here downloads or loads a real model. `fake_model` replaces
`climb.stages.embed.load_model` with `FakeModel`, a deterministic hashed bag of words
(documents drawn from one vocabulary land close together, different vocabularies
are nearly orthogonal), so embed/cluster stage tests run in a second.
"""
from __future__ import annotations

import atexit
import os
import re
import shutil
import sys
import tempfile
import zlib

# Before anything imports huggingface_hub / torch / faiss.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
_HF_HOME = tempfile.mkdtemp(prefix="climb-test-hf-")
os.environ["HF_HOME"] = _HF_HOME
atexit.register(shutil.rmtree, _HF_HOME, ignore_errors=True)
# 2 shared cores: torch (when it initialises) and faiss' OpenMP use one thread.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import pytest  # noqa: E402


def _limit_torch_threads() -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() != 1:
        torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` need CUDA: skipped where there is none (torch is imported only if one is collected)."""
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu:
        return
    import torch
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs CUDA (marked gpu)")
        for item in gpu:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _single_thread_torch():
    _limit_torch_threads()
    yield
    _limit_torch_threads()


# --------------------------------------------------------------------------- fake model

WORD = re.compile(r"[a-z]+")


class FakeModel:
    """Stands in for a SentenceTransformer: hashed bag-of-words, L2-normalised."""

    dim = 64

    def __init__(self):
        self.calls = 0
        self.texts_seen = 0

    def get_sentence_embedding_dimension(self) -> int:
        return self.dim

    def encode(self, texts, batch_size=32, normalize_embeddings=False, convert_to_numpy=True,
               show_progress_bar=False):
        self.calls += 1
        self.texts_seen += len(texts)
        out = np.zeros((len(texts), self.dim), np.float32)
        for i, t in enumerate(texts):
            for w in WORD.findall(t.lower()):
                out[i, zlib.crc32(w.encode()) % self.dim] += 1.0
            if not out[i].any():
                out[i, 0] = 1.0
        if normalize_embeddings:
            out /= np.linalg.norm(out, axis=1, keepdims=True)
        return out


@pytest.fixture
def fake_model(monkeypatch):
    """Patch climb.stages.embed.load_model; returns the FakeModel instance used."""
    import climb.stages.embed

    model = FakeModel()
    monkeypatch.setattr(climb.stages.embed, "load_model", lambda cfg: model)
    return model


# --------------------------------------------------------------------------- corpora

# Three vocabularies with no English stop words and no shared words (top TF-IDF
# terms of a cluster must come from exactly one of them).
VOCABS = {
    "sea": ["ocean", "whale", "coral", "tide", "reef", "salt", "wave", "harbor", "dolphin", "seaweed"],
    "code": ["python", "compiler", "function", "variable", "integer", "pointer", "thread", "kernel",
             "bytecode", "debugger"],
    "food": ["bread", "cheese", "butter", "tomato", "garlic", "pepper", "onion", "basil", "noodle",
             "pastry"],
}


def vocab_docs(n_per_vocab: int, seed: int = 0, vocabs: dict | None = None) -> list[dict]:
    """Documents of 12-24 words, each from one vocabulary; dicts with id, text, label."""
    vocabs = vocabs or VOCABS
    rng = np.random.default_rng(seed)
    docs = []
    for label, words in vocabs.items():
        for j in range(n_per_vocab):
            n = int(rng.integers(12, 25))
            docs.append({"id": f"{label}-{j:04d}", "text": " ".join(rng.choice(words, n)), "label": label})
    order = rng.permutation(len(docs))
    return [docs[i] for i in order]


def lookup_search_sets(root, corpus_paths: list, iterations, *extra: str) -> list[str]:
    """Config overrides for a toy run whose proxies are a stand-in for `proxy.lookup` (the test
    replaces the look-up): four clusters, tiny proxies, a one-line target, a search with two
    replicates and three comparison seeds. Writes the target and the look-up table preflight wants."""
    import json
    (root / "target.jsonl").write_text(json.dumps({"text": "held-out words"}) + "\n")
    (root / "table.csv").write_text("index,loss\n0,1.0\n")  # the stand-in never reads it; preflight does
    paths = ", ".join(f'"{p}"' for p in corpus_paths)
    return [f"corpus.paths=[{paths}]", "cluster.k=4", "cluster.niter=10",
            "proxy.vocab_size=320", "proxy.seq_len=16", "proxy.tokenizer_docs=100",
            f'proxy.lookup="{root}/table.csv"', f'proxy.lookup_weights="{root}/table.csv"',
            'target.objective=["loss"]', f'target.texts=["{root}/target.jsonl"]', "target.contamination=0",
            f"search.iterations={list(iterations)}", "search.pool_size=2000", "search.min_weight=0.0",
            "search.epoch_cap=100.0", "search.steadiness_boot=0", "search.replicates=2",
            "search.replicate_seeds=2", "search.eval_seeds=3", "export.token_budget=3000", *extra]


def write_parquet_shards(folder, docs: list[dict], shards: int, extra: tuple[str, ...] = ()) -> list:
    """Write docs round-robin into `part-XXXXX.parquet` files; returns the paths."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for s in range(shards):
        part = docs[s::shards]
        cols = {"id": [d["id"] for d in part], "text": [d["text"] for d in part]}
        for c in extra:
            cols[c] = [d[c] for d in part]
        p = folder / f"part-{s:05d}.parquet"
        pq.write_table(pa.table(cols), p)
        paths.append(p)
    return paths


@pytest.fixture
def vocabs():
    return VOCABS


@pytest.fixture
def make_docs():
    return vocab_docs


@pytest.fixture
def write_shards():
    return write_parquet_shards


class IdTokenizer:
    """A tokenizer of space-separated integers (each its own id), EOS 0, 256 ids."""
    vocab_size, eos_id = 256, 0

    def encode_batch(self, texts):
        return [[int(w) for w in t.split()] for t in texts]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A token store of three clusters over different token ranges (ids 1-99, 61-159, 121-219),
    so different mixtures learn different things."""
    from proxies.tokens import TokenStore, merge_token_stores, write_shard_tokens
    d = tmp_path_factory.mktemp("toy_store")
    rng = np.random.default_rng(0)
    texts, ids = [], []
    for c in range(3):
        for _ in range(20):
            texts.append(" ".join(map(str, rng.integers(1 + 60 * c, 100 + 60 * c, 80))))
            ids.append(c)
    write_shard_tokens(texts, np.array(ids), IdTokenizer(), d, "s")
    merge_token_stores(d, ["s"], 3)
    return TokenStore(d)
