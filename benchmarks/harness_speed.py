"""What scoring a proxy through the LM Evaluation Harness costs, against climb's own evaluator.

One proxy of the bench preset's shape (2 x 96, vocabulary 4096, trained briefly on PIQA-like
text so its scores are not a uniform guess) is scored on the first `--items` items of the
shared data's PIQA, ARC-Easy and HellaSwag files, alternately through climb's evaluator
(`proxies.evaluate.evaluate_task`) and through the harness (`target.lm_eval` with the task
YAMLs of pipelines/tasks/, `climb.runtime.harness.ProxyLM`), `--reps` times each in one
process; it reports the median seconds of each and their ratio, and checks that both give
the same acc, acc_norm and gold loss per byte. Needs ../shared/data and lm-eval.

    python benchmarks/harness_speed.py --json benchmarks/results/harness_speed.json
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from common import SHARED, go_offline, write_result

TASKS = ("piqa", "arc_easy", "hellaswag")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=500, help="items per task (the bench preset's task_limit)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (a proxy worker's: 1)")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    tasks_dir = SHARED / "tasks"
    if not tasks_dir.exists():
        raise SystemExit(f"{tasks_dir} not found: this benchmark needs ../shared/data")
    go_offline()
    import torch

    from climb.config import TargetConfig
    from climb.runtime import harness
    from proxies.evaluate import evaluate_task, load_tasks
    from proxies.model import GPT, GPTConfig
    from proxies.tokenizer import train_bpe
    torch.set_num_threads(args.threads)
    items = {t: load_tasks(tasks_dir / f"{t}.jsonl")[: args.items] for t in TASKS}
    texts = [it["query"] + " " + it["choices"][it["gold"]] for t in TASKS for it in items[t]]
    tok = train_bpe(iter(texts), 4096, Path("/tmp/climb_harness_speed_tok.json"))
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, n_layer=2, n_head=2, n_embd=96, seq_len=128))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    ids = [i for t in texts for i in tok.encode(t) + [tok.eos_id]]
    data = torch.tensor(ids[: (len(ids) // 129) * 129]).view(-1, 129)
    for _ in range(100):
        batch = data[torch.randint(0, len(data), (16,))]
        model(batch[:, :-1], batch[:, 1:])[1].backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    root = Path(__file__).resolve().parents[1]
    target = TargetConfig(lm_eval=tuple(str(root / "pipelines" / "tasks" / f"{t}_local.yaml") for t in TASKS),
                          task_limit=args.items)
    harness.load_tasks(target)  # the tasks are loaded once per process, as a search's workers do

    def ours():
        return {t: evaluate_task(model, tok, items[t]) for t in TASKS}

    def theirs():
        return harness.score_proxy(model, tok, target, "cpu")
    times = {"climb": [], "harness": []}
    for _ in range(args.reps):
        for name, fn in (("climb", ours), ("harness", theirs)):
            t0 = time.perf_counter()
            got = fn()
            times[name].append(time.perf_counter() - t0)
            if name == "climb":
                a = got
            else:
                b = got
    agree = {f"{t}/{m}": [a[t][m], b[f"{t}_local/{m}"]] for t in TASKS
             for m in ("acc", "acc_norm", "gold_loss_per_byte")}
    gap = max(abs(x - y) for x, y in agree.values())
    med = {k: statistics.median(v) for k, v in times.items()}
    out = {"items_per_task": args.items, "tasks": list(TASKS), "reps": args.reps, "threads": args.threads,
           "seconds": med, "harness_over_climb": med["harness"] / med["climb"], "metrics": agree,
           "max_abs_difference": gap}
    print(f"{args.items} items x {len(TASKS)} tasks: climb's evaluator {med['climb']:.2f}s, the harness "
          f"{med['harness']:.2f}s ({med['harness'] / med['climb']:.2f}x); largest metric difference {gap:.2e}")
    if args.json:
        write_result(Path(args.json), out, indent=1)


if __name__ == "__main__":
    main()
