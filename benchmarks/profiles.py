"""Where the time goes in the stages whose speed targets are missed on this CPU.

    HF_HUB_OFFLINE=1 python benchmarks/profiles.py [embed train swarm cluster]

Writes benchmarks/results/profile_<name>.txt: the torch profiler's top operators
by self time (embed, train, swarm), or the k-means time split (cluster), plus
the matmul rate those shapes reach here, which says how close to the machine's
limit the stage already is.
"""
from __future__ import annotations

import os
import sys

import numpy as np
import torch

from common import CORPUS, RESULTS, timer, write_result


def _table(fn, steps: int, rows: int = 12) -> str:
    from torch.profiler import profile
    fn()  # warm-up
    with profile() as prof:
        for _ in range(steps):
            fn()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)


def _gemm_rate(m: int, k: int, n: int, dtype=torch.float32, reps: int = 10) -> float:
    a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
    a @ b
    with timer() as t:
        for _ in range(reps):
            a @ b
    return 2 * m * k * n * reps / t.seconds / 1e9


def embed() -> str:
    import pyarrow.parquet as pq

    from climb.config import EmbedConfig
    from climb.stages.embed import encode, load_model
    texts = pq.read_table(CORPUS / "part-00000.parquet", columns=["text"])["text"].to_pylist()[:256]
    # The torch backend: the profiler sees inside torch ops, while an OpenVINO call is one opaque op.
    cfg = EmbedConfig(max_seq_length=256, backend="torch")
    model = load_model(cfg)
    lines = [f"climb encode of 256 documents (window 256, {model.climb_backend}), 2 repetitions",
             _table(lambda: encode(model, texts, cfg), 2)]
    return "\n".join(lines)


def _train_fn(n_layer: int, n_embd: int, vocab: int, stacked: int = 0):
    from proxies.model import GPT, GPTConfig
    from proxies.stacked import StackedGPT
    from proxies.train import TrainConfig, autocast
    cfg = GPTConfig(vocab_size=vocab, n_layer=n_layer, n_head=max(2, n_embd // 64), n_embd=n_embd, seq_len=128)
    amp = autocast(torch.device("cpu"), TrainConfig().precision, n_embd)
    if stacked:
        model = StackedGPT([GPT(cfg, seed=i) for i in range(stacked)])
        x = torch.randint(0, vocab, (stacked, 16, 129))
    else:
        model = GPT(cfg, seed=0)
        x = torch.randint(0, vocab, (16, 129))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step():
        with amp:
            out = model(x[..., :-1], x[..., 1:])
        loss = out.sum() if stacked else out[1]
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def train() -> str:
    out = []
    for layers, width, vocab in ((2, 64, 1024), (4, 256, 4096)):
        out.append(f"one training step of the {layers} x {width} proxy (vocab {vocab}, batch 16 x 128), 5 steps")
        out.append(_table(_train_fn(layers, width, vocab), 5))
    out.append("single-thread fp32 / bf16 matmul rate of the step's shapes (GFLOP/s):")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    for m, k, n in ((2048, 64, 1024), (2048, 256, 1024), (2048, 256, 4096), (2048, 1024, 256)):
        out.append(f"  [{m} x {k}] @ [{k} x {n}]: fp32 {_gemm_rate(m, k, n):.0f}, "
                   f"bf16 {_gemm_rate(m, k, n, torch.bfloat16):.0f}")
    torch.set_num_threads(threads)
    return "\n".join(out)


def swarm() -> str:
    out = []
    for layers, width, vocab in ((2, 64, 1024), (4, 256, 4096)):
        out.append(f"one step of 8 stacked {layers} x {width} proxies (vocab {vocab}), 3 steps")
        out.append(_table(_train_fn(layers, width, vocab, stacked=8), 3))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    a, b = torch.randn(8, 2048, 64), torch.randn(8, 64, 1024)
    for name, fn in (("bmm 8 x [2048 x 64] @ [64 x 1024]", lambda: torch.bmm(a, b)),
                     ("8 x mm, same shapes", lambda: [a[i] @ b[i] for i in range(8)])):
        fn()
        with timer() as t:
            for _ in range(10):
                fn()
        out.append(f"  {name}: {t.seconds * 100:.1f} ms (1 thread)")
    torch.set_num_threads(threads)
    return "\n".join(out)


def cluster() -> str:
    import faiss
    from sklearn.cluster import KMeans

    from benchmarks.stages import _blobs
    torch.set_num_threads(os.cpu_count() or 1)
    x = _blobs(100_000, 384, 2000, 0)
    k, iters = 1000, 20
    flops = 2 * len(x) * k * x.shape[1]  # the distance matmul of one Lloyd iteration
    # Both stop early once converged (FAISS: objective unchanged; scikit-learn: labels unchanged),
    # so time is divided by the iterations each actually ran.
    km = faiss.Kmeans(x.shape[1], k, niter=iters, seed=0, max_points_per_centroid=256, verbose=False)
    with timer() as t:
        km.train(x)
    n_faiss = len(km.obj)
    t_faiss = t.seconds / n_faiss
    with timer() as t:
        sk = KMeans(n_clusters=k, algorithm="lloyd", n_init=1, max_iter=iters, init="random", tol=0.0,
                    random_state=0).fit(x)
    t_sk = t.seconds / sk.n_iter_
    peak = _sgemm_peak()
    return "\n".join([
        f"k-means, 100k x 384, k = {k}, up to {iters} iterations: each Lloyd iteration is one "
        "[100k x 384] @ [384 x 1000] distance matmul (BLAS sgemm) plus a centroid update",
        f"  FAISS: {t_faiss * 1e3:.0f} ms per iteration ({n_faiss} iterations before it converged)",
        f"  scikit-learn: {t_sk * 1e3:.0f} ms per iteration ({sk.n_iter_} iterations; {t_sk / t_faiss:.2f}x FAISS's "
        "time per iteration)",
        f"  one iteration is {flops / 1e9:.1f} GFLOP of matmul: {flops / t_faiss / 1e9:.0f} GFLOP/s (FAISS), "
        f"{flops / t_sk / 1e9:.0f} GFLOP/s (scikit-learn)",
        f"  this machine's measured sgemm peak (best of 5, numpy's BLAS on {os.cpu_count()} cores): "
        f"{peak['square']:.0f} GFLOP/s on 4096 x 4096, {peak['kmeans_shape']:.0f} GFLOP/s on the iteration's "
        f"[100k x 384] @ [384 x 1000]",
        f"  a k-means iteration runs at {flops / t_faiss / 1e9 / peak['square']:.0%} (FAISS) and "
        f"{flops / t_sk / 1e9 / peak['square']:.0%} (scikit-learn) of the square sgemm peak",
        "  both run the same BLAS-bound loop near this machine's sgemm rate: there is no 10x to take on 2 cores"])


def _sgemm_peak() -> dict:
    """GFLOP/s of a float32 matmul through numpy's BLAS, best of 5: a square one and the k-means shape."""
    rng = np.random.default_rng(0)
    out = {}
    for name, (m, k, n) in (("square", (4096, 4096, 4096)), ("kmeans_shape", (100_000, 384, 1000))):
        a = rng.standard_normal((m, k), dtype=np.float32)
        b = rng.standard_normal((k, n), dtype=np.float32)
        a @ b
        best = float("inf")
        for _ in range(5):
            with timer() as t:
                a @ b
            best = min(best, t.seconds)
        out[name] = 2 * m * k * n / best / 1e9
    return out


PROFILES = {"embed": embed, "train": train, "swarm": swarm, "cluster": cluster}


def main() -> None:
    names = sys.argv[1:] or list(PROFILES)
    for name in names:
        text = PROFILES[name]()
        write_result(RESULTS / f"profile_{name}.txt", text + "\n")
        print(f"== {name}\n{text}", flush=True)


if __name__ == "__main__":
    main()
