"""A small run folder whose proxies are a scripted external trainer, for the robustness tests.

`prepare()` writes a two-shard corpus, embeds it with the fake model and clusters
it in this process; the search (and what follows) then runs here or in `climb`
processes started with `cli()`. The trainer is tests/helpers/scripted_proxy.py,
steered by a control file (`script()`): per mixture id it scores, fails, hangs,
waits at a gate or reports a null / NaN metric, and logs what it did.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import FakeModel, vocab_docs, write_parquet_shards

REPO = Path(__file__).resolve().parents[1]
HELPER = Path(__file__).parent / "helpers" / "scripted_proxy.py"


def script(control: Path, mode: str = "ok", ids=None, modes: dict | None = None, **extra) -> None:
    """Set what the trainer does next: `mode` for the mixture ids in `ids` (None: all), and
    `modes` per mixture id on top."""
    old = json.loads(control.read_text()) if control.exists() else {}
    control.write_text(json.dumps({**old, "mode": mode, "ids": ids, "modes": modes or {}, **extra}))


def notes(control: Path) -> list[dict]:
    log = Path(json.loads(control.read_text())["log"])
    return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []


def prepare(tmp_path: Path, monkeypatch, *extra: str, docs: list[dict] | None = None, columns: tuple[str, ...] = ()):
    """(cfg, paths, config file, control file) of a run folder embedded and clustered; `columns`:
    the docs' fields written beside id and text."""
    import climb.stages.embed
    from climb import pipeline
    from climb.config import load_config, to_toml
    from climb.runtime.layout import RunPaths
    write_parquet_shards(tmp_path / "corpus", docs or vocab_docs(40), 2, columns)
    control = tmp_path / "control.json"
    target = tmp_path / "scripted_target.jsonl"  # the scripted trainer never reads it; preflight checks it exists
    target.write_text(json.dumps({"text": "held-out words"}) + "\n")
    script(control, log=str(tmp_path / "trainer.log"), gate=str(tmp_path / "gate"))
    cfg = load_config(None, [
        f'corpus.paths=["{tmp_path}/corpus/*.parquet"]', "cluster.k=4", "cluster.niter=10",
        "proxy.vocab_size=320", "proxy.seq_len=16", "proxy.tokenizer_docs=100",
        f'proxy.command="{sys.executable} {HELPER} {{weights}} {{out}} {control}"',
        'target.objective=["loss"]', 'target.goal="minimize"', f'target.texts=["{target}"]',
        "search.iterations=[4, 2]", "search.pool_size=2000", "search.min_weight=0.0", "search.eval_seeds=2", "search.replicates=0",
        "search.epoch_cap=100.0", "export.token_budget=3000", *extra])
    monkeypatch.setattr(climb.stages.embed, "load_model", lambda c: FakeModel())
    paths = RunPaths(tmp_path / "run")
    pipeline.run_stage("cluster", cfg, paths.root)
    config_file = tmp_path / "run.toml"
    config_file.write_text(to_toml(cfg))
    return cfg, paths, config_file, control


def env() -> dict:
    return dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")


def cli(config_file: Path, run_dir: Path, command: str = "search", *args: str) -> subprocess.Popen:
    """`climb <command>` in a process of its own (and a session, so a test can signal it alone)."""
    return subprocess.Popen([sys.executable, "-m", "climb.cli", command, "--config", str(config_file),
                             "--run", str(run_dir), *args], cwd=REPO, env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def alive(pid: int) -> bool:
    """Whether a process is running (a zombie awaiting its parent counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
