"""Tests for proxies.tokenizer, proxies.tokens and proxies.sampler.

Run: PYTHONPATH=. python -m pytest tests/test_proxies_data.py -q
"""

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from proxies.sampler import MixtureSampler
from proxies.tokenizer import EOS_TOKEN, load_tokenizer, train_bpe
from proxies.tokens import TokenStore, merge_token_stores, write_shard_tokens

CORPUS = [
    "Hello world, this is a small corpus for byte-level BPE.",
    "Tokenizers should round-trip any text: naïve café, Straße, 東京, emoji 🙂🚀.",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "def f(x):\n    return x * 2  # code\n\ttabs and  double  spaces",
] * 5


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return train_bpe(iter(CORPUS), 300, tmp_path_factory.mktemp("tok") / "tokenizer.json")


def test_tokenizer_roundtrip_vocab_and_eos(tok, tmp_path):
    assert tok.vocab_size % 64 == 0 and tok.vocab_size >= tok.raw_vocab_size
    assert tok.encode(EOS_TOKEN) == [tok.eos_id]
    unseen = "Ünïcödé never seen: Ж ק ✓ 𝔘 \x00 \r\n end"
    for text in CORPUS[:4] + [unseen, ""]:
        assert tok.decode(tok.encode(text)) == text
    assert tok.encode_batch([CORPUS[0], unseen]) == [tok.encode(CORPUS[0]), tok.encode(unseen)]
    # Merges were learned: the repeated sentence compresses below one token per byte.
    assert len(tok.encode(CORPUS[2])) < 0.5 * len(CORPUS[2].encode())

    tok.save(tmp_path)  # a directory gets tokenizer.json inside
    again = load_tokenizer(tmp_path)
    assert again.encode(unseen) == tok.encode(unseen)
    assert (again.vocab_size, again.eos_id) == (tok.vocab_size, tok.eos_id)


def test_load_tokenizer_errors(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="train_bpe"):
        load_tokenizer(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json"):
        load_tokenizer(bad)
    # A .tiktoken file without the optional package: an ImportError saying what to install
    # (the package is hidden, so this holds whether or not it is installed here).
    tk = tmp_path / "x.tiktoken"
    tk.write_text("")
    monkeypatch.setitem(sys.modules, "tiktoken", None)
    with pytest.raises(ImportError, match=r"x\.tiktoken is a \.tiktoken file but .*pip install tiktoken"):
        load_tokenizer(tk)
    with pytest.raises(ValueError, match="vocab_size"):
        train_bpe(["abc"], 100, tmp_path / "small.json")


def _docs():
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "delta", "ünï", "東京", "fox", "dog"]
    texts = [" ".join(rng.choice(words, size=rng.integers(1, 12))) for _ in range(40)]
    clusters = rng.integers(0, 4, size=40)
    clusters[clusters == 2] = 3  # leave cluster 2 empty
    return texts, clusters


def test_token_store_write_merge_and_skip(tok, tmp_path):
    texts, clusters = _docs()
    out = tmp_path / "tokens"
    s0 = write_shard_tokens(texts[:25], clusters[:25], tok, out, "s0")
    s1 = write_shard_tokens(texts[25:], clusters[25:], tok, out, "s1")
    assert s0["docs"] == 25 and s1["docs"] == 15
    assert s0["tokens"] == sum(len(tok.encode(t)) + 1 for t in texts[:25])
    assert (out / "parts" / "s0" / "done.json").exists()

    index = merge_token_stores(out, ["s0", "s1"], n_clusters=4)
    store = TokenStore(out)
    assert store.n_clusters == 4
    for c in range(4):
        docs = [i for i in range(40) if clusters[i] == c]  # shard order == doc order here
        expected = [t for i in docs for t in tok.encode(texts[i]) + [tok.eos_id]]
        assert store.tokens[c] == len(expected) == index["tokens"][c]
        arr = store.array(c)
        assert arr.dtype == np.uint16 and arr.tolist() == expected
        assert index["bytes"][c] == sum(len(texts[i].encode()) for i in docs)
        if c != 2:
            assert isinstance(arr, np.memmap)
    assert store.tokens[2] == 0 and store.array(2).size == 0
    assert store.tokens.sum() == s0["tokens"] + s1["tokens"]
    np.testing.assert_allclose(store.token_shares().sum(), 1.0)

    # Rerun skips: a done shard is not re-tokenized even if given other inputs.
    again = write_shard_tokens(["different"], [0], tok, out, "s0")
    assert again == s0
    before = (out / "cluster_00000.bin").read_bytes()
    assert merge_token_stores(out, ["s0", "s1"], 4) == json.loads((out / "index.json").read_text())
    assert (out / "cluster_00000.bin").read_bytes() == before
    # Different shard order re-merges deterministically in that order.
    merge_token_stores(out, ["s1", "s0"], 4)
    docs = [i for i in list(range(25, 40)) + list(range(25)) if clusters[i] == 0]
    assert TokenStore(out).array(0).tolist() == [t for i in docs for t in tok.encode(texts[i]) + [tok.eos_id]]


def test_token_store_errors(tok, tmp_path):
    with pytest.raises(ValueError, match="cluster id"):
        write_shard_tokens(["a", "b"], [0], tok, tmp_path, "s")
    with pytest.raises(FileNotFoundError, match="write_shard_tokens"):
        merge_token_stores(tmp_path, ["nope"], 2)
    write_shard_tokens(["a b c"], [5], tok, tmp_path, "s5")
    with pytest.raises(ValueError, match="n_clusters"):
        merge_token_stores(tmp_path, ["s5"], 2)
    with pytest.raises(FileNotFoundError, match="merge_token_stores"):
        TokenStore(tmp_path / "empty")


class _IdTok:
    """Tokenizer stand-in: each text is a space-separated list of token ids."""

    vocab_size = 1024
    eos_id = 0

    def encode_batch(self, texts):
        return [[int(w) for w in t.split()] for t in texts]


@pytest.fixture
def labelled_store(tmp_path):
    # Cluster c holds only token ids in [100c + 1, 100c + 99], so every window
    # (eos=0 aside) reveals its cluster. Cluster 3 (3 tokens) is too short to sample;
    # cluster 4 has exactly 18 tokens, i.e. two windows of seq_len=16 (+1).
    rng = np.random.default_rng(1)
    texts, clusters = [], []
    for c, n_docs, size in [(0, 20, 30), (1, 20, 30), (2, 20, 30), (3, 1, 2), (4, 1, 17)]:
        for _ in range(n_docs):
            texts.append(" ".join(str(v) for v in rng.integers(100 * c + 1, 100 * c + 100, size=size)))
            clusters.append(c)
    write_shard_tokens(texts, clusters, _IdTok(), tmp_path, "s")
    merge_token_stores(tmp_path, ["s"], 5)
    return TokenStore(tmp_path)


def _row_cluster(row: torch.Tensor) -> int:
    ids = set(row[row > 0].div(100, rounding_mode="floor").tolist())
    assert len(ids) == 1, "a window must not mix clusters"
    return ids.pop()


def test_sampler_mixture_and_determinism(labelled_store):
    w = np.array([0.9, 0.1, 0.0, 0.0, 0.0])
    s = MixtureSampler(labelled_store, w, seq_len=16, batch_size=50, seed=7)
    rows = []
    for _ in range(20):
        x, y = s.next_batch()
        assert x.shape == y.shape == (50, 16) and x.dtype == y.dtype == torch.int64
        assert torch.equal(x[:, 1:], y[:, :-1])
        rows.extend(_row_cluster(torch.cat([r, yr[-1:]])) for r, yr in zip(x, y))
    counts = np.bincount(rows, minlength=5)
    assert counts[2] == counts[3] == counts[4] == 0
    assert 0.86 < counts[0] / len(rows) < 0.94

    a = MixtureSampler(labelled_store, w, 16, 8, seed=3)
    b = MixtureSampler(labelled_store, w, 16, 8, seed=3)
    c = MixtureSampler(labelled_store, w, 16, 8, seed=4)
    batches_a = [a.next_batch() for _ in range(3)]
    batches_b = [b.next_batch() for _ in range(3)]
    assert all(torch.equal(p[0], q[0]) and torch.equal(p[1], q[1]) for p, q in zip(batches_a, batches_b))
    assert not torch.equal(batches_a[0][0], c.next_batch()[0])


def test_sampler_windows_cover_whole_cluster(labelled_store):
    # Cluster 4 has 18 tokens: exactly two windows, and both (incl. the one ending at
    # the final token) must be drawn; no window may run past the end.
    s = MixtureSampler(labelled_store, np.array([0, 0, 0, 0, 1.0]), seq_len=16, batch_size=64, seed=0)
    arr = torch.from_numpy(labelled_store.array(4).astype(np.int64))
    assert arr.numel() == 18
    x, y = s.next_batch()
    starts = {next(i for i in range(2) if torch.equal(row, arr[i : i + 16])) for row in x}
    assert starts == {0, 1}
    assert any(torch.equal(row, arr[2:]) for row in y)


@pytest.mark.parametrize(
    "weights, match",
    [
        ([0.5, 0.5, 0.0], "5 clusters"),
        ([0.5, 0.6, 0.0, 0.0, 0.0], "sum to"),
        ([1.2, -0.2, 0.0, 0.0, 0.0], "negative"),
        ([np.nan, 1.0, 0.0, 0.0, 0.0], "NaN"),
        ([0.5, 0.0, 0.0, 0.5, 0.0], "cluster 3"),
    ],
)
def test_sampler_rejects_bad_weights(labelled_store, weights, match):
    with pytest.raises(ValueError, match=match):
        MixtureSampler(labelled_store, np.array(weights), seq_len=16, batch_size=4, seed=0)


def test_sampler_accepts_tiny_rounding(labelled_store):
    w = np.array([0.7, 0.3 + 5e-7, 0, 0, 0])
    s = MixtureSampler(labelled_store, w, seq_len=16, batch_size=4, seed=0)
    assert s.weights.sum() == pytest.approx(1.0, abs=1e-12)
    np.testing.assert_allclose(s.weights, w / w.sum(), rtol=0, atol=1e-15)
    x, y = s.next_batch()
    assert x.shape == y.shape == (4, 16) and torch.equal(x[:, 1:], y[:, :-1])
    assert set(_clusters_of(x, y)) <= {0, 1}  # only the clusters with weight


def _clusters_of(x: torch.Tensor, y: torch.Tensor) -> list[int]:
    return [_row_cluster(torch.cat([r, yr[-1:]])) for r, yr in zip(x, y)]


def test_exact_batches_follow_the_weights_at_every_row(labelled_store):
    w = np.array([0.55, 0.3, 0.15, 0.0, 0.0])
    s = MixtureSampler(labelled_store, w, seq_len=16, batch_size=7, seed=0, exact=True)
    rows = []
    for _ in range(30):
        rows += _clusters_of(*s.next_batch())
        counts = np.bincount(rows, minlength=5)
        # every prefix of the stream is within one row of its share, cluster by cluster
        assert np.all(np.abs(counts - w * len(rows)) <= 1.0 + 1e-9), (counts, w * len(rows))
    # i.i.d. draws wander much further than one row from their shares
    iid = MixtureSampler(labelled_store, w, seq_len=16, batch_size=7, seed=0)
    rows = sum((_clusters_of(*iid.next_batch()) for _ in range(30)), [])
    assert np.abs(np.bincount(rows, minlength=5) - w * len(rows)).max() > 1.0


def test_common_streams_give_each_cluster_the_same_windows_whatever_the_mixture(labelled_store):
    def per_cluster(weights, seed, batches=12):
        s = MixtureSampler(labelled_store, np.array(weights), seq_len=16, batch_size=6, seed=seed,
                           exact=True, common=True)
        got: dict[int, list] = {}
        for _ in range(batches):
            x, y = s.next_batch()
            for r, yr, c in zip(x, y, _clusters_of(x, y)):
                got.setdefault(c, []).append(torch.cat([r, yr[-1:]]).tolist())
        return got
    a = per_cluster([0.5, 0.5, 0, 0, 0], seed=1)
    b = per_cluster([0.2, 0.3, 0.5, 0, 0], seed=1)
    for c in (0, 1):
        n = min(len(a[c]), len(b[c]))
        assert n >= 10 and a[c][:n] == b[c][:n]  # the n-th window of a cluster is the same in both
    other_seed = per_cluster([0.5, 0.5, 0, 0, 0], seed=2)
    assert other_seed[0][:5] != a[0][:5]


def test_common_streams_walk_a_cluster_without_repeats_within_a_pass(labelled_store):
    n = int(labelled_store.tokens[0])
    s = MixtureSampler(labelled_store, np.array([1.0, 0, 0, 0, 0]), seq_len=16, batch_size=1, seed=3, common=True)
    arr = labelled_store.array(0).astype(np.int64)
    starts = []
    for _ in range((n - 17) // 16):
        x, _ = s.next_batch()
        row = x[0].numpy()
        hits = [i for i in range(n - 16) if np.array_equal(arr[i:i + 16], row)]
        assert hits
        starts.append(hits[0])
    assert len(set(starts)) == len(starts)  # no window twice in one pass
    assert len({st % 16 for st in starts}) == 1  # one offset per pass: non-overlapping windows


class _LongCluster:
    """A cluster of ``n`` tokens without the tokens: a window is filled with its start (as int64)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, key: slice) -> np.ndarray:
        return np.full(key.stop - key.start, key.start, dtype=np.int64)


def _pass_starts(stream, windows: int) -> list[int]:
    return [int(stream.next()[0]) for _ in range(windows)]


@pytest.mark.parametrize("count", [1, 2, 7, 64, 1000, 4097])
def test_a_pass_visits_every_window_once(count):
    from proxies.sampler import CHUNK, FeistelPermutation, _WindowStream
    # seq_len 1 leaves no room for an offset: the windows start at 0 .. count-1
    stream = _WindowStream(np.arange(count + 1), 1, (5, 2))
    first, second = _pass_starts(stream, count), _pass_starts(stream, count)
    assert sorted(first) == sorted(second) == list(range(count))  # two passes, each a permutation
    if count >= 64:
        assert first != second  # a fresh order each pass
    # the network is a bijection of its power-of-two domain, and its blocks (4097: several) one of range(count)
    perm = FeistelPermutation(count, np.random.default_rng(count).integers(0, 2**64, size=4, dtype=np.uint64))
    assert perm.domain // 2 < count <= perm.domain
    assert np.array_equal(np.sort(perm.network(np.arange(perm.domain, dtype=np.uint64))),
                          np.arange(perm.domain, dtype=np.uint64))
    values = np.concatenate([perm.block(j, j + CHUNK) for j in range(0, perm.domain, CHUNK)])
    assert np.array_equal(np.sort(values), np.arange(count))


def test_window_streams_are_seeded_by_seed_and_cluster():
    import pickle

    from proxies.sampler import _WindowStream
    arr = np.arange(100_000)
    draws = {key: _pass_starts(_WindowStream(arr, 16, key), 50) for key in [(1, 0), (1, 0), (2, 0), (1, 1)]}
    np.random.seed(123)  # global state plays no part
    assert _pass_starts(_WindowStream(arr, 16, (1, 0)), 50) == draws[(1, 0)]
    assert len({tuple(v) for v in draws.values()}) == 3  # (1, 0) twice alike; another seed or cluster differs
    assert sorted(draws[(2, 0)]) != sorted(draws[(1, 0)])
    # a stream (mid-chunk) carries on alike after a pickle round trip
    s = _WindowStream(arr, 16, (1, 0))
    _pass_starts(s, 7)
    again = pickle.loads(pickle.dumps(s))
    assert _pass_starts(again, 3000) == _pass_starts(s, 3000)


def test_a_window_stream_holds_o1_memory_whatever_the_cluster_size():
    """10**13 tokens (6e11 windows): a materialised order would take 5 TB; the stream takes
    its first windows at once, holding at most CHUNK starts."""
    import time
    import tracemalloc

    from proxies.sampler import CHUNK, _WindowStream
    tracemalloc.start()
    try:
        t = time.perf_counter()
        stream = _WindowStream(_LongCluster(10**13), 16, (0, 0))
        starts = _pass_starts(stream, 3 * CHUNK)
        took, peak = time.perf_counter() - t, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert stream.perm.count > 6 * 10**11 and took < 5 and peak < 2**20
    assert len(set(starts)) == len(starts) and len({s % 16 for s in starts}) == 1
    assert all(0 <= s <= 10**13 - 17 for s in starts)
    # no attribute of the stream or of its order grows with count
    held = [v for obj in (stream, stream.perm) for v in vars(obj).values() if hasattr(v, "__len__")]
    assert max(len(v) for v in held if v is not stream.array) <= CHUNK


def test_a_window_streams_order_is_not_sequential():
    from proxies.sampler import _WindowStream
    count = 10**6
    pos = np.array(_pass_starts(_WindowStream(np.arange(count + 1), 1, (0, 7)), 1000))
    rank = np.argsort(np.argsort(pos))
    spearman = np.corrcoef(np.arange(1000), rank)[0, 1]
    assert abs(spearman) < 0.15, spearman  # a random order: sd 1/sqrt(999) ~ 0.03
    # the first 1000 windows spread over the whole cluster: ~100 in each tenth
    assert np.bincount(pos * 10 // count, minlength=10).min() > 50
    assert np.median(np.abs(np.diff(pos))) > count / 10  # consecutive draws are far apart


def test_long_texts_encode_in_pieces_to_the_same_ids(tok):
    """Pieces cut before a single space give the whole text's ids, whatever the whitespace."""
    from proxies.tokenizer import encode_arrays, split_long
    rnd = np.random.default_rng(0)
    seps = [" ", "  ", "\n", " \n ", "\t", ", ", ". "]
    words = " ".join(CORPUS).split()
    text = "".join(words[i] + seps[j] for i, j in zip(rnd.integers(0, len(words), 40_000),
                                                       rnd.integers(0, len(seps), 40_000)))
    pieces = split_long(text, 5_000)
    assert len(pieces) > 20 and "".join(pieces) == text and max(map(len, pieces)) <= 5_000
    import proxies.tokenizer as T
    old = T.PIECE_CHARS
    T.PIECE_CHARS = 5_000
    try:
        got = encode_arrays(tok, [text, "short", ""], np.uint32)
    finally:
        T.PIECE_CHARS = old
    assert got[0].tolist() == tok.encode(text)
    assert got[1].tolist() == tok.encode("short") and got[2].size == 0


def test_a_20_mb_document_is_tokenized_in_bounded_memory(tmp_path):
    """One 20 MB document in the token store: under 600 MB more than before it (it took 2.2 GB
    when the whole document went to the tokenizer in one call)."""
    import subprocess
    import sys
    script = tmp_path / "long.py"
    script.write_text(f"""
import random, resource, sys
sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
from proxies.tokenizer import train_bpe
from proxies.tokens import TokenStore, merge_token_stores, write_shard_tokens
rnd = random.Random(0)
words = ["alpha", "beta", "gamma", "the", "of", "results", "1999", "x.y", "--", "(a)"]
tok = train_bpe([" ".join(rnd.choice(words) for _ in range(200)) for _ in range(100)], 512,
                {str(tmp_path / "tok.json")!r})
text = " ".join(rnd.choice(words) for _ in range(4_300_000))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
st = write_shard_tokens([text, "short"], [0, 1], tok, {str(tmp_path / "store")!r}, "s0")
grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
merge_token_stores({str(tmp_path / "store")!r}, ["s0"], 2)
whole = len(tok.encode(text)) + 1
print(len(text), st["tokens_per_cluster"][0], whole, round(grew))
""")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True).stdout.split()
    chars, stored, whole, grew = map(int, out)
    assert chars > 20_000_000 and stored == whole
    assert grew < 600, f"tokenizing one 20 MB document took {grew} MB more"
