"""Is bf16 faster than fp32 on this CPU? The embedding and a proxy step, side by side.

`embed.dtype = "auto"` and `proxy.precision = "auto"` choose bf16 on a CPU only where it
is faster: where the CPU has AMX (its `amx_bf16` flag), whose tile units run bf16
matrix products; with AVX512-BF16 alone oneDNN has bf16 kernels too, but a plain
`SentenceTransformer.encode` ran at 0.61x fp32 on such a CPU (18.9 against 30.7
documents/s, 2 threads). This measures both ways on the machine at hand, alternating
`--reps` times in one process: the default embedding model encoding `--docs` documents
of the demo corpus, and one training step of a 2-layer proxy at widths 64 and 96, under
bf16 autocast and in fp32; it reports the medians, the ratios and the CPU's flags.

    python benchmarks/cpu_precision.py --json benchmarks/results/cpu_precision.json
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from common import go_offline, write_result


def flags() -> dict:
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    line = next((x for x in text.splitlines() if x.startswith("flags")), "")
    have = set(line.split(":", 1)[-1].split())
    return {f: f in have for f in ("avx512f", "avx512_bf16", "amx_bf16", "amx_tile")}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=400)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    go_offline()
    import torch

    from climb.config import EmbedConfig
    from climb.stages.embed.demo import bbc_articles
    from climb.stages.embed import load_model
    from proxies.model import GPT, GPTConfig
    torch.set_num_threads(args.threads)
    texts = [d["text"] for d in bbc_articles()[: args.docs]]
    def encode(dtype):  # as the embed stage loads it: the weights in that dtype
        model = load_model(EmbedConfig(dtype=dtype, max_seq_length=128, device="cpu"))

        def run():
            model.encode(texts, batch_size=64, convert_to_numpy=True, show_progress_bar=False)
        return run

    def step(width, dtype):
        cfg = GPTConfig(vocab_size=4096, n_layer=2, n_head=2, n_embd=width, seq_len=128, tie_embeddings=False)
        torch.manual_seed(0)
        m = GPT(cfg)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        x = torch.randint(0, 4096, (16, 129))

        def run():
            for _ in range(5):
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
                    _, loss = m(x[:, :-1], x[:, 1:])
                loss.backward()
                opt.step()
                opt.zero_grad()
        return run
    cases = {f"encode {args.docs} docs": {d: encode(d) for d in ("fp32", "bf16")}}
    for w in (64, 96):
        cases[f"5 proxy steps, width {w}"] = {d: step(w, d) for d in ("fp32", "bf16")}
    out = {"flags": flags(), "threads": args.threads, "torch": torch.__version__,
           "mkldnn_bf16": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()), "cases": {}}
    for name, fns in cases.items():
        for fn in fns.values():
            fn()  # warm-up
        times = {d: [] for d in fns}
        for _ in range(args.reps):
            for d, fn in fns.items():
                t0 = time.perf_counter()
                fn()
                times[d].append(time.perf_counter() - t0)
        med = {d: statistics.median(v) for d, v in times.items()}
        out["cases"][name] = {"seconds": med, "bf16_speed_vs_fp32": med["fp32"] / med["bf16"]}
        print(f"{name}: fp32 {med['fp32']:.2f}s, bf16 {med['bf16']:.2f}s: bf16 at {med['fp32'] / med['bf16']:.2f}x")
    print("flags:", out["flags"])
    if args.json:
        write_result(Path(args.json), out, indent=1)


if __name__ == "__main__":
    main()
