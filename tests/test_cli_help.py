"""`climb <stage> --help` says what the stage reads and writes and what --config defaults to;
without --config, outside the repository, the error says the default is missing from the
current folder and how to pass a config, instead of suggesting the missing file."""
from __future__ import annotations

import pytest

from climb.cli import DEFAULT_CONFIG, main
from climb.config import STAGES

WRITES = {"embed": "<run>/embed/", "cluster": "<run>/cluster/", "tokenize": "<run>/tokenize/",
          "search": "<run>/search/", "validate": "<run>/validate/", "export": "<run>/export/",
          "report": "<run>/report/", "run": "<run>"}


@pytest.mark.parametrize("stage", ["run", *STAGES])
def test_stage_help_says_what_it_reads_and_writes(stage, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    assert main([stage, "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "Reads " in out and "Writes " in out and WRITES[stage] in out
    assert f"default: {DEFAULT_CONFIG}" in out and "relative to the current folder" in out
    assert "default: runs/<config name>" in out


def _error(capsys) -> str:
    lines = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(lines) == 1, lines
    return lines[0]


def test_the_missing_default_config_does_not_suggest_itself(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["run"]) == 2
    line = _error(capsys)
    assert line.startswith(f"climb: error: no --config given, and the default, {DEFAULT_CONFIG}, is not in the "
                           f"current folder ({tmp_path})")
    assert "--config path/to/run.toml" in line
    assert f"e.g. {DEFAULT_CONFIG}" not in line and line.count(DEFAULT_CONFIG) == 1
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_a_missing_config_given_is_named(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["embed", "--config", "mine.toml"]) == 2
    line = _error(capsys)
    assert line.startswith("climb: error: --config mine.toml: no such file") and str(tmp_path) in line
    assert DEFAULT_CONFIG not in line
    assert list(tmp_path.iterdir()) == []
