"""The exported dataset's card (export/README.md): the Hub's format, read by `datasets.load_dataset`."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from huggingface_hub import DatasetCard

from climb import pipeline
from climb.stages import export
from climb.stages.export.card import size_category
from proxies.tokenizer import load_tokenizer
from scripted_run import prepare


@pytest.fixture
def exported(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))
    cfg, paths, _, _ = prepare(tmp_path, monkeypatch, "export.token_budget=6000")
    stats = pipeline.run_stage("export", cfg, paths.root)
    return cfg, paths, stats


def test_the_card_loads_with_datasets_and_matches_the_mixture(exported):
    from datasets import load_dataset
    cfg, paths, stats = exported
    edir = paths.root / "export"
    mix = json.loads((edir / "mixture.json").read_text())
    card = DatasetCard.load(edir / "README.md")
    configs = {c["config_name"]: c for c in card.data.configs}
    used = sorted(int(c) for c in mix["files"])
    assert sorted(configs) == sorted(["default"] + [f"cluster_{c:05d}" for c in used])
    assert card.data.size_categories == [size_category(stats["rows"])]
    ds = load_dataset(str(edir), split="train")
    assert ds.num_rows == stats["rows"] and set(ds.column_names) == {"id", "text", "cluster", "epoch"}
    # The rows' own token counts (the proxies' tokenizer, EOS included) give the realised weights.
    tok = load_tokenizer(paths.tokenize.tokenizer)
    per = np.zeros(len(mix["weights"]))
    for r in ds:
        per[r["cluster"]] += len(tok.encode(r["text"])) + 1
    assert abs(per.sum() - stats["tokens"]) <= 2 * max(1, stats["truncated_docs"])
    assert np.allclose(per / per.sum(), mix["realised_weights"], atol=2e-3)
    assert np.abs(np.array(mix["realised_weights"]) - mix["weights"]).max() < 0.02
    one = load_dataset(str(edir), f"cluster_{used[0]:05d}", split="train")
    assert one.num_rows == sum(1 for r in ds if r["cluster"] == used[0]) and set(one["cluster"]) == {used[0]}
    # The body: every cluster's row with its weight, how it was found, the blend files.
    text = card.text
    for c, w in enumerate(mix["weights"]):
        assert f"| {c} |" in text and f"{w:.4f}" in text
    assert f"{stats['rows']:,} rows" in text and "proxy models trained" in text
    assert "interleave.json" in text and "not validated" in text


def test_the_card_goes_with_the_data_to_a_destination(exported, tmp_path):
    from datasets import load_dataset
    cfg, paths, stats = exported
    dest = tmp_path / "published"
    moved = dataclasses.replace(cfg, export=dataclasses.replace(cfg.export, destination=str(dest)))
    export.run(moved, paths)
    assert (dest / "README.md").read_text() == (paths.root / "export" / "README.md").read_text()
    assert load_dataset(str(dest), split="train").num_rows == stats["rows"]


def test_size_categories():
    assert [size_category(n) for n in (0, 999, 1000, 54_321, 2_000_000, 10**13)] == [
        "n<1K", "n<1K", "1K<n<10K", "10K<n<100K", "1M<n<10M", "n>1T"]
