"""The `gpu` extra resolves: pip's dry run over the package index (metadata only, no multi-GB download)."""
from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _dry_run(reqs: list[str], report: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed",
                           "--disable-pip-version-check", "--report", str(report), *reqs],
                          capture_output=True, text=True, timeout=300)


def test_the_gpu_extra_resolves_to_faiss_for_cuda_12(tmp_path):
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    if _dry_run(["packaging"], tmp_path / "probe.json").returncode != 0:
        pytest.skip("no package index answers here (pip cannot resolve even `packaging`)")
    got = _dry_run(extra, tmp_path / "gpu.json")
    assert got.returncode == 0, got.stderr[-2000:]
    names = {i["metadata"]["name"].lower() for i in json.loads((tmp_path / "gpu.json").read_text())["install"]}
    assert "faiss-gpu-cu12" in names and "nvidia-cuda-runtime-cu12" in names and "faiss-cpu" not in names
