"""The exported dataset's card: `export/README.md`, in the Hugging Face Hub's dataset-card format.

Its YAML header declares the data files (a `default` config with every row, and
one config per cluster), so `datasets.load_dataset(<export folder>)` reads it as
it is, here or once pushed to the Hub; the body says which mixture it is (the
table of clusters with their top terms, sizes, weights and epochs, and the mixture
by source), how it was found (config digest, proxies trained, the comparison's
verdicts with their intervals, the validation when it has run) and how a trainer
reads it (the blend files). With `export.destination` the card goes with the data.
"""
from __future__ import annotations

import json
import logging

import numpy as np

from climb.config import RunConfig, digest
from climb.io.files import read_json
from climb.runtime.layout import RunPaths

log = logging.getLogger(__name__)

_SIZES = [(1e3, "n<1K"), (1e4, "1K<n<10K"), (1e5, "10K<n<100K"), (1e6, "100K<n<1M"), (1e7, "1M<n<10M"),
          (1e8, "10M<n<100M"), (1e9, "100M<n<1B"), (1e10, "1B<n<10B"), (1e11, "10B<n<100B"),
          (1e12, "100B<n<1T")]


def size_category(rows: int) -> str:
    """The Hub's size category for a number of rows."""
    return next((name for top, name in _SIZES if rows < top), "n>1T")


def _yaml(name: str, rows: int, clusters: list[int]) -> str:
    configs = [("default", "data/*/*.parquet")] + [(f"cluster_{c:05d}", f"data/cluster_{c:05d}/*.parquet")
                                                    for c in clusters] if clusters else []  # none: Megatron only
    lines = ["---", f"pretty_name: {json.dumps(f'climb mixture: {name}')}", "tags:", "- climb", "- data-mixture",
             "- pretraining", "task_categories:", "- text-generation", "size_categories:",
             f"- {size_category(rows)}"] + ["configs:"] * bool(configs)
    for cname, path in configs:
        lines += [f"- config_name: {cname}", "  data_files:", "  - split: train", f"    path: {path}"]
    return "\n".join(lines + ["---"])


def _cell(text: str) -> str:
    """Corpus words in a Markdown table cell: no pipes, no HTML."""
    return text.replace("|", "/").replace("<", "&lt;").replace(">", "&gt;")


def _target(cfg: RunConfig) -> str:
    parts = [f"`{t}`" for t in cfg.target.texts] + [f"`{k}`" for k in cfg.target.tasks]
    return ", ".join(parts) or "(no target data)"


def _sources_section(by: dict | None, unit: str) -> str:
    """The mixture by source: each source's share of the weights asked for and of the rows written."""
    if not by:
        return ""
    asked = by.get("weights")
    rows = "\n".join(f"| {_cell(name)} | {f'{asked[j]:.4f}' if asked else 'n/a'} | {by['realised_weights'][j]:.4f} | "
                     f"{by['tokens'][j]:,} |" for j, name in enumerate(by["names"]))
    return f"""
### By source

| source | weight | realised weight | {unit} |
| --- | --- | --- | --- |
{rows}
"""


def card(cfg: RunConfig, paths: RunPaths, w: np.ndarray, real_w: np.ndarray, plan: dict,
         by_cluster: dict[int, list[str]], stats: dict, given_weights: bool) -> str:
    """The card's Markdown, YAML header included."""
    from climb.stages.report import summary_table, transfer_section, validation_summary
    from climb.stages.search import read_results
    from climb.stages.search.summary import search_summary
    clusters = read_json(paths.cluster.summary)["clusters"]
    per = {c["cluster"]: c for c in plan["selection"]["clusters"]}
    unit = {"": "tokens (proxy tokenizer)", "bytes": "bytes"}.get(cfg.export.tokenizer,
                                                                 f"tokens ({cfg.export.tokenizer})")
    rows = "\n".join(
        f"| {c['cluster']} | {_cell(', '.join(c['top_terms'][:6]))} | {c['docs']:,} | {w[i]:.4f} | {real_w[i]:.4f} | "
        f"{per[i]['tokens']:,} | {per[i]['epochs']:.2f} |" for i, c in enumerate(clusters))
    summary = search_summary(cfg, paths, len(read_results(paths)), len(clusters))
    validation, _ = validation_summary(cfg, paths)
    how = [f"- config `{cfg.name}`, digest `{digest(cfg)}`; target **{summary['target']['name']}** "
           f"({summary['target']['goal']}) on {_target(cfg)}",
           f"- {summary['proxies_trained']} proxy models trained (search iterations "
           f"{' -> '.join(map(str, cfg.search.iterations))}, then the comparison)"]
    if given_weights:
        how.append("- **the weights were given to the export, not taken from the search**: the comparison "
                   "below is the search's, not this mixture's")
    found = ("\n\nThe search's found mixture against the baselines, each the mean of "
             f"{cfg.search.eval_seeds} fresh proxies on seeds the search never used, paired by seed with a "
             "95% interval (a difference whose interval spans zero is not resolved):\n\n" + summary_table(summary))
    said = summary.get("verdict") or {}
    if not given_weights and said.get("kind") in ("not shown better", "worse"):
        # The export keeps the found mixture (what the search chose, and the config asked for);
        # the card, and the log, say how weak it is and how to export the best measured one.
        best = said["best_measured"]
        advice = (f" To export the {best} mixture instead, pass its weights (`search/mixture.json` holds them "
                  f"under `\"{best}\"`) to `climb export --weights`." if best in ("uniform", "natural") else "")
        found += f"\n\n**Warning: {said['sentence']}** This dataset is the found mixture all the same.{advice}"
        log.warning("export: %s The export writes the found mixture all the same.%s", said["sentence"], advice)
    transfer = ("\n\n### Does it transfer to a larger model?\n\n" + transfer_section(validation)) if validation else \
        "\n\nThe mixture was not validated on a larger model (`validate.enabled = false`)."
    from climb.stages.search.summary import duplicates
    dups = duplicates(paths)
    if dups:
        t = dups["total"]
        how.append(f"- duplicates in the corpus: {t['exact']:,} exact and {t['near']:,} near of {t['docs']:,} "
                   "documents " + ("(dropped: every row here is distinct text)" if dups["dropped"]
                      else "(kept: rows may repeat a text; `dedup.drop = true` drops them)"))
    megatron = stats.get("megatron")
    names = ["mixture.json"] + ["interleave.json"] * bool(by_cluster) + ["megatron_blend.txt"] * bool(megatron)
    blends = ", ".join(f"`{n}`" for n in names)
    readers = []
    if by_cluster:
        readers.append("`interleave.json` for `datasets.interleave_datasets` (row probabilities that realise the "
                       "token weights, and the stopping strategy that reads every row once)")
    if megatron:
        readers.append(f"`megatron_blend.txt` for Megatron-LM's `--data-path`: one indexed dataset per cluster "
                       f"(`megatron/cluster_XXXXX.bin` / `.idx`, {megatron['dtype']} token ids of "
                       f"`{cfg.export.tokenizer}`, every document ending in token {megatron['eod']})")
    use = "; ".join(readers + ["`mixture.json` for everything the export did"])
    sources = _sources_section(stats.get("by_source"), unit)
    return f"""{_yaml(cfg.name, stats['rows'], sorted(by_cluster))}

# climb mixture: {cfg.name}

{stats['rows']:,} rows ({stats['docs']:,} distinct documents; {stats['tokens']:,} {unit}, budget
{plan['budget']:,}) drawn from {len(clusters)} clusters of the corpus in the proportions below. Each row has
`id` (the corpus's document id), `text`, `cluster` and `epoch` (0 for a document's first copy; a cluster
repeated beyond its size has 1, 2, ...). Rows are grouped by cluster: shuffle, or interleave by weight, before
training.

## Mixture

| cluster | top terms | documents in the corpus | weight | realised weight | {unit} | epochs |
| --- | --- | --- | --- | --- | --- | --- |
{rows}
{sources}
## How it was found

{chr(10).join(how)}{found}{transfer}

## Use it

```python
from datasets import load_dataset
ds = load_dataset("path/or/hub-id", split="train")            # every row (config "default")
one = load_dataset("path/or/hub-id", "cluster_00000", split="train")  # one cluster
```

{blends} give the weights and files for a trainer: {use}.
"""
