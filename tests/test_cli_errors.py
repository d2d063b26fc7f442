"""Errors a user can cause end in one line and exit code 2 (finding 7 of the robustness issue).

Bad `--set` paths and impossible values, `proxy.command` templates, unreadable
or empty corpus files, a full disk, a read-only run folder, Ctrl-C: each is one
line on stderr (no traceback unless -v) and an exit code.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from climb import pipeline
from climb.cli import main
from scripted_run import prepare

REPO = Path(__file__).resolve().parents[1]
DEMO = str(REPO / "pipelines" / "demo.toml")


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("setting, match", [
    ("name.x=1", "override 'name.x=1': name is a value, not a section"),
    ("proxy.steps=0", "proxy.steps must be at least 1, got 0"),
    ("search.eval_seeds=0", "search.eval_seeds must be at least 2"),
    ('proxy.command=echo {"a": 1} > {out}', '{"a"} is not a placeholder'),
    ('proxy.command="cat {weights}"', "has no {out}"),
    ('proxy.command="train {weights} {out"', "write a literal brace as {{ or }}"),
    ("proxy.timeout_s=-1", "proxy.timeout_s must be at least 0"),
    ('export.long_docs="drop"', "export.long_docs must be 'truncate' or 'skip'"),
])
def test_bad_settings(tmp_path, capsys, setting, match):
    assert main(["run", "--config", DEMO, "--run", str(tmp_path / "run"), "--set", setting]) == 2
    line = _one_line(capsys)
    assert line.startswith("climb: error:") and match in line
    assert not (tmp_path / "run").exists()  # refused before anything was written


def _embed(tmp_path, pattern: str) -> int:
    return main(["embed", "--config", DEMO, "--run", str(tmp_path / "run"), "--set", f'corpus.paths=["{pattern}"]',
                 "--set", 'corpus.build=""'])


def test_null_texts_and_empty_parquet(tmp_path, capsys, fake_model):
    (tmp_path / "nulls.jsonl").write_text("".join(json.dumps({"id": f"a{i}", "text": None}) + "\n"
                                                  for i in range(3)))
    assert _embed(tmp_path, str(tmp_path / "*.jsonl")) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]  # progress bars above it
    assert "nulls.jsonl" in line and "no non-empty documents in column 'text'" in line
    (tmp_path / "empty.parquet").write_bytes(b"")
    assert _embed(tmp_path, str(tmp_path / "*.parquet")) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"{tmp_path / 'empty.parquet'}: empty file (0 bytes)" in line and "Traceback" not in line


@pytest.mark.parametrize("error, code, match", [
    (OSError(errno.ENOSPC, "No space left on device", "/data/run/search/results.jsonl"), 2,
     "climb: error: no space left on the device (/data/run/search/results.jsonl); free some"),
    (PermissionError(errno.EACCES, "Permission denied", "/data/run/config.toml"), 2,
     "climb: error: cannot write (/data/run/config.toml): Permission denied"),
    (KeyboardInterrupt(), 130, "climb: stopped by SIGINT; what was done is kept in"),
])
def test_machine_errors_and_ctrl_c(tmp_path, capsys, monkeypatch, error, code, match):
    def fail(*a, **k):
        raise error
    monkeypatch.setattr(pipeline, "run_stage", fail)
    assert main(["cluster", "--config", DEMO, "--run", str(tmp_path / "run")]) == code
    line = _one_line(capsys)
    assert line.startswith(match)
    if code == 130:
        assert f"`climb cluster --config {DEMO} --run {tmp_path / 'run'}` again to resume" in line
    monkeypatch.setattr(pipeline, "run_stage", fail)
    with pytest.raises(type(error)) if code == 130 else _no_raise():
        rc = main(["cluster", "--config", DEMO, "--run", str(tmp_path / "run"), "-v"])
        assert rc == code
    if code != 130:
        assert "Traceback" in capsys.readouterr().err  # -v shows it


class _no_raise:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _read_only(folder: Path) -> None:
    if os.geteuid() != 0:
        subprocess.run(["chmod", "-R", "a-w", str(folder)], check=True)
        return
    # root writes through permission bits; the immutable attribute stops it (ext4, xfs, ...).
    if shutil.which("chattr") is None or subprocess.run(["chattr", "-R", "+i", str(folder)],
                                                        capture_output=True).returncode:
        pytest.skip("cannot make a folder read-only here")


def _writable(folder: Path) -> None:
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-R", "-i", str(folder)], capture_output=True)
    else:
        subprocess.run(["chmod", "-R", "u+w", str(folder)], check=True)


def test_read_only_finished_run(tmp_path, monkeypatch, capsys):
    cfg, paths, config_file, control = prepare(tmp_path, monkeypatch)
    pipeline.run_all(cfg, paths.root)
    args = ["run", "--config", str(config_file), "--run", str(paths.root)]
    k = json.loads((paths.root / "cluster" / "clusters.json").read_text())["n_clusters"]
    weights = json.dumps([1 / k] * k, indent=80)  # longer than a file name may be
    assert main(["export", "--config", str(config_file), "--run", str(paths.root), "--weights", weights]) == 0
    pipeline.run_all(cfg, paths.root)  # back to the search's weights
    _read_only(paths.root)
    try:
        capsys.readouterr()
        assert main(args) == 0  # everything up to date: nothing to write, nothing written
        out = capsys.readouterr().out
        assert "| climb" in out  # the report's table, from the finished report
        assert main([*args, "--set", "export.seed=1"]) == 2  # a changed config has to be written
        line = _one_line(capsys)
        assert line.startswith(f"climb: error: cannot write ({paths.root / 'config.toml'}): ")
    finally:
        _writable(paths.root)
