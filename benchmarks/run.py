"""Speed benchmarks: each stage against the obvious baseline, side by side in one run.

    python benchmarks/run.py                 # all; or: --only embed cluster
    make bench

Each benchmark first checks that ours computes the same thing as the baseline,
then reports `{"name", "ours", "baseline", "unit", "ratio", "details"}`
(ratio > 1: ours is better) to `benchmarks/results/<name>.json`, and the table
in BENCHMARKS.md between the `bench:begin` / `bench:end` markers is rebuilt
from every results file. Data: ../shared/data/corpus (skipped with a message
when absent).
"""
from __future__ import annotations

import argparse
import json

from common import RESULTS, ROOT, machine, shared_or_skip, write_result


def environment() -> dict:
    import torch
    return {**machine("python", "torch", "cpus"), "threads": torch.get_num_threads(),
            "cuda": torch.cuda.is_available(), **machine("load_avg", "date")}


def save(result: dict) -> None:
    result = dict(result, environment=environment())
    write_result(RESULTS / f"{result['name']}.json", result)
    print(f"{result['name']}: ours {result['ours']:.4g} vs baseline {result['baseline']:.4g} {result['unit']} "
          f"-> ratio {result['ratio']:.2f}", flush=True)


def refresh_markdown() -> None:
    md = ROOT / "BENCHMARKS.md"
    rows = ["| benchmark | ours | baseline | unit | ratio (>1 = ours better) | target | date |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for f in sorted(RESULTS.glob("*.json")):
        data = json.loads(f.read_text())
        for r in data if isinstance(data, list) else [data]:
            if not isinstance(r, dict) or not {"name", "ours", "baseline", "ratio"} <= set(r):
                continue
            rows.append(f"| {r['name']} | {r['ours']:.4g} | {r['baseline']:.4g} | {r.get('unit', '')} | "
                        f"{r['ratio']:.2f} | {r.get('details', {}).get('target', '')} | "
                        f"{r.get('environment', {}).get('date', r.get('details', {}).get('date', ''))} |")
    table = "\n".join(rows)
    text = md.read_text() if md.exists() else "# Benchmarks\n"
    begin, end = "<!-- bench:begin -->", "<!-- bench:end -->"
    if begin in text and end in text:
        text = text[: text.index(begin) + len(begin)] + "\n" + table + "\n" + text[text.index(end):]
    else:
        text += f"\n## Stage speed (`make bench`)\n\n{begin}\n{table}\n{end}\n"
    md.write_text(text)


def main() -> None:
    from benchmarks import stages
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--only", nargs="*", default=None, help=f"subset of {list(stages.BENCHMARKS)}")
    args = ap.parse_args()
    for name, fn in stages.BENCHMARKS.items():
        if args.only and name not in args.only:
            continue
        if fn.needs_corpus and shared_or_skip("corpus", name) is None:
            continue
        got = fn()
        for result in got if isinstance(got, list) else [got]:
            save(result)
    refresh_markdown()


if __name__ == "__main__":
    main()
