"""A refused command changes nothing: on a finished run, a command climb refuses (bad
`--weights`, a bad `--set`, an unknown option) exits 2 with one line naming the problem,
and every file under the run folder, config.toml included, is byte for byte as it was.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from climb.cli import main
from climb.config import STAGES
from scripted_run import prepare


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """(config file, run folder, clusters) of a run exported once, its proxies a scripted trainer."""
    from climb import pipeline
    tmp = tmp_path_factory.mktemp("refusals")
    with pytest.MonkeyPatch.context() as mp:
        cfg, paths, config_file, _ = prepare(tmp, mp)
        pipeline.run_stage("export", cfg, paths.root)
    k = json.loads(paths.cluster.summary.read_text())["n_clusters"]
    return config_file, paths.root, k


def _snapshot(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _refused(capsys, argv: list[str], root: Path, match: str) -> str:
    before = _snapshot(root)
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err and match in lines[0], lines[0]
    after = _snapshot(root)
    assert sorted(after) == sorted(before), set(after) ^ set(before)
    assert [f for f in before if before[f] != after[f]] == []
    return lines[0]


def _weights(k: int, *values) -> str:
    return json.dumps(list(values) + [0.0] * (k - len(values)))


@pytest.mark.parametrize("case", ["count", "negative", "json", "zero", "nan", "sum", "text", "nested", "null",
                                  "bool", "object",
                                  "empty", "file"])
def test_bad_export_weights(finished, capsys, tmp_path, case):
    config_file, root, k = finished
    weights, match = {
        "count": ("[0.5, 0.5]" if k != 2 else "[0.3, 0.3, 0.4]", f"weights for {k} clusters"),
        "negative": (_weights(k, -0.5, 1.5), "negative"),
        "json": ("[0.5, 0.5", "neither a JSON list nor a file holding one"),
        "zero": (_weights(k), "all-zero"),
        "nan": (_weights(k, 1.0).replace("0.0", "NaN", 1), "NaN or infinite"),
        "sum": (_weights(k, 0.5), "sum to 0.500000, not 1"),
        "text": (json.dumps(["a"] + [0.5] * (k - 1)), "numbers"),
        "nested": (json.dumps([[1.0] * k]), "numbers"),
        "null": (json.dumps([None] + [1 / (k - 1)] * (k - 1)), "numbers"),
        "bool": (json.dumps([True] + [0.0] * (k - 1)), "numbers"),
        "object": (json.dumps({"w": [1 / k] * k}), '"weights"'),
        "empty": ("", "--weights"),
        "file": ("", f"weights for {k} clusters"),
    }[case]
    if case == "file":  # a file holding weights is checked as they are
        weights = str(tmp_path / "w.json")
        Path(weights).write_text(json.dumps({"weights": [0.5, 0.5] if k != 2 else [0.2, 0.3, 0.5]}))
    line = _refused(capsys, ["export", "--config", str(config_file), "--run", str(root), "--weights", weights],
                    root, match)
    assert line.startswith("climb: error: --weights")


def test_a_changed_config_with_bad_weights_is_refused_before_it_is_saved(finished, capsys):
    config_file, root, k = finished
    _refused(capsys, ["export", "--config", str(config_file), "--run", str(root), "--set", "export.seed=7",
                      "--weights", "[0.5, 0.5]" if k != 2 else "[1.0]"], root, f"weights for {k} clusters")


@pytest.mark.parametrize("stage", ["run", "export"])
def test_a_refusal_before_the_first_stage_leaves_config_toml(finished, capsys, tmp_path, stage):
    """A setting refused once the stages are about to run (a trainer's tokenizer that is not there)
    is refused before the run's config.toml is written."""
    config_file, root, _ = finished
    _refused(capsys, [stage, "--config", str(config_file), "--run", str(root), "--set",
                      f'export.tokenizer="{tmp_path / "no_tokenizer.json"}"'], root, "no_tokenizer.json")


@pytest.mark.parametrize("stage", ["run", *STAGES])
@pytest.mark.parametrize("setting, match", [
    ("nosuch.field=1", "nosuch"),
    ("cluster.nosuch=1", "nosuch"),
    ("proxy.steps=0", "proxy.steps must be at least 1, got 0"),
    ('export.long_docs="drop"', "export.long_docs must be 'truncate' or 'skip'"),
    ("search.iterations=[8", "search.iterations"),
])
def test_bad_settings_on_every_stage(finished, capsys, stage, setting, match):
    config_file, root, _ = finished
    _refused(capsys, [stage, "--config", str(config_file), "--run", str(root), "--set", setting], root, match)


@pytest.mark.parametrize("argv, match", [
    (["search", "--weights", "[1]"], "unrecognized arguments: --weights"),
    (["export", "--executor", "slurm"], "invalid choice: 'slurm'"),
    (["export", "--dask-workers", "0"], "executor.dask_workers must be at least 1, got 0"),
    (["export", "--dask-workers", "two"], "invalid int value: 'two'"),
    (["export", "--bogus"], "unrecognized arguments: --bogus"),
])
def test_bad_options(finished, capsys, argv, match):
    config_file, root, _ = finished
    _refused(capsys, [*argv, "--config", str(config_file), "--run", str(root)], root, match)


def test_good_weights_still_export(finished, capsys):
    """The checks refuse only what is wrong: weights of the right shape export (and leave the
    folder changed), and the search's mixture is exported again afterwards."""
    config_file, root, k = finished
    args = ["export", "--config", str(config_file), "--run", str(root)]
    w = [1.0 / k] * k
    w[-1] = 1.0 - sum(w[:-1])
    assert main([*args, "--weights", json.dumps({"weights": w})]) == 0
    got = json.loads((root / "export" / "mixture.json").read_text())["weights"]
    assert got == pytest.approx(w)
    assert main(args) == 0


@pytest.mark.parametrize("stage", ["run", "search"])
@pytest.mark.parametrize("setting, match", [
    ("search.min_weight=2", "search.min_weight is the least weight a cluster may get, in [0, 1)"),
    ("search.min_weight=-0.1", "search.min_weight is the least weight"),
    ("search.concentrations=[]", "search.concentrations must be a non-empty list"),
    ("search.concentrations=[0.3, 0]", "search.concentrations must be a non-empty list"),
    ("proxy.vocab_size=10", "proxy.vocab_size = 10 is too small"),
    # Known only once the clusters exist: checked before the search touches its earlier outputs.
    ("search.min_weight=0.3", "no mixture fits; set search.min_weight to at most 0.25"),
])
def test_a_setting_the_search_cannot_use_is_refused_before_it_starts(finished, capsys, stage, setting, match):
    config_file, root, k = finished
    assert k == 4  # the last case's message names 1 / 4
    _refused(capsys, [stage, "--config", str(config_file), "--run", str(root), "--set", setting], root, match)


@pytest.mark.parametrize("stage", ["run", "cluster"])
def test_more_clusters_than_documents_is_refused_before_the_cluster_stage_clears_its_outputs(finished, capsys, stage):
    config_file, root, _ = finished
    _refused(capsys, [stage, "--config", str(config_file), "--run", str(root), "--set", "cluster.k=1000"], root,
             "120 documents but cluster.k=1000: need at least as many documents as clusters")


def test_a_cuda_device_without_one_is_refused_before_any_stage(finished, capsys):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    config_file, root, _ = finished
    for setting, name in [('embed.device="cuda"', "embed.device"), ('proxy.device="cuda:0"', "proxy.device")]:
        _refused(capsys, ["run", "--config", str(config_file), "--run", str(root), "--set", setting], root,
                 f"{name} = {setting.split('=')[1].strip(chr(34))!r}, but this machine has no CUDA device")


def test_a_missing_tokenizer_file_and_an_empty_corpus_are_refused(finished, capsys, tmp_path):
    config_file, root, _ = finished
    _refused(capsys, ["run", "--config", str(config_file), "--run", str(root), "--set",
                      f'proxy.tokenizer="{tmp_path / "nosuch.json"}"'], root, "proxy.tokenizer: ")
    (tmp_path / "empty.jsonl").write_text("")
    _refused(capsys, ["run", "--config", str(config_file), "--run", str(root), "--set",
                      f'corpus.paths=["{tmp_path / "empty.jsonl"}"]'], root, "the corpus has no records")
