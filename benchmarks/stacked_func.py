"""Could `torch.func` replace the stacked swarm's own forward? Side by side on one machine.

`proxies/stacked.py` re-implements `GPT.forward` with batched matmuls over a proxy axis.
The library's own way to do the same is `torch.func`: `stack_module_state` over P GPTs
and `vmap(functional_call(GPT, ...))`, which needs no second forward. This times one
training step (forward, backward, AdamW) of P proxies both ways, plus P plain GPTs one
after another, alternating the three `--reps` times in one process, and reports each
one's median seconds a step and the ratios. One thread by default (a proxy worker's).

    python benchmarks/stacked_func.py --json benchmarks/results/stacked_func.json
    python benchmarks/stacked_func.py --device cuda --proxies 64 --width 256   # on a GPU
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time
from pathlib import Path

from common import write_result


def steppers(cfg, P: int, B: int, device: str):
    import torch
    from torch.func import functional_call, stack_module_state, vmap

    from proxies.model import GPT
    from proxies.stacked import StackedGPT
    models = [GPT(cfg, seed=i).to(device) for i in range(P)]
    x = torch.randint(0, cfg.vocab_size, (P, B, cfg.seq_len), device=device)
    y = torch.randint(0, cfg.vocab_size, (P, B, cfg.seq_len), device=device)

    stacked = StackedGPT(models).to(device)
    opt_s = torch.optim.AdamW(stacked.parameters(), lr=1e-3)

    def twin():
        stacked(x, y).sum().backward()
        opt_s.step()
        opt_s.zero_grad(set_to_none=True)

    params, buffers = stack_module_state(models)
    params = {k: v.detach().clone().requires_grad_() for k, v in params.items()}
    skeleton = copy.deepcopy(models[0]).to("meta")
    opt_f = torch.optim.AdamW(list(params.values()), lr=1e-3)

    def loss(p, b, xx, yy):
        return functional_call(skeleton, (p, b), (xx, yy))[1]

    def func():
        vmap(loss)(params, buffers, x, y).sum().backward()
        opt_f.step()
        opt_f.zero_grad(set_to_none=True)

    singles = [GPT(cfg, seed=i).to(device) for i in range(P)]
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in singles]

    def one_by_one():
        for m, o, xx, yy in zip(singles, opts, x, y):
            m(xx, yy)[1].backward()
            o.step()
            o.zero_grad(set_to_none=True)
    return {"stacked (proxies/stacked.py)": twin, "torch.func vmap": func, "one by one": one_by_one}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--proxies", type=int, default=8)
    ap.add_argument("--width", type=int, nargs="+", default=[64, 96], help="n_embd (the demo's 64, the bench's 96)")
    ap.add_argument("--vocab", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=5, help="steps per timing")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    import warnings

    import torch

    from proxies.model import GPTConfig
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", message=".*batching rule.*")  # the vmap fallback is what is measured
    out = {"device": args.device, "proxies": args.proxies, "threads": args.threads, "torch": torch.__version__,
           "shapes": []}
    for width, vocab in zip(args.width, args.vocab):
        cfg = GPTConfig(vocab_size=vocab, n_layer=2, n_head=2, n_embd=width, seq_len=128, tie_embeddings=False)
        fns = steppers(cfg, args.proxies, args.batch, args.device)
        times: dict[str, list[float]] = {k: [] for k in fns}
        for fn in fns.values():
            fn()  # warm-up
        for _ in range(args.reps):
            for name, fn in fns.items():
                if args.device.startswith("cuda"):
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(args.steps):
                    fn()
                if args.device.startswith("cuda"):
                    torch.cuda.synchronize()
                times[name].append((time.perf_counter() - t0) / args.steps)
        med = {k: statistics.median(v) for k, v in times.items()}
        twin = med["stacked (proxies/stacked.py)"]
        row = {"n_embd": width, "vocab": vocab, "seconds_per_step": med,
               "speed_vs_stacked": {k: twin / v for k, v in med.items()}}
        out["shapes"].append(row)
        print(f"{width} wide, vocabulary {vocab}, {args.proxies} proxies: "
              + "; ".join(f"{k} {v * 1000:.0f} ms/step ({twin / v:.2f}x the stacked speed)" for k, v in med.items()))
    if args.json:
        write_result(Path(args.json), out, indent=1)


if __name__ == "__main__":
    main()
