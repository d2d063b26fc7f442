"""Streaming: the cluster stage's sample of the embeddings costs no more memory for a corpus
four times larger (the embeddings are read one shard at a time, never all mapped at once).

Each size runs in its own process, whose peak RSS is compared: 4 shards of 50,000 rows
against 16, 64 dimensions (16 rows a page, so a 50,000-row sample touches most pages
of every shard). Mapping all shards at once, as the stage once did, kept every
touched page resident: 146 MB more at the larger size.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = """
import resource, sys
import numpy as np
sys.path.insert(0, {repo!r})
from climb.runtime.layout import RunPaths
from climb.stages.cluster import _sample
from pathlib import Path
paths = RunPaths(Path({run!r}))
names = [f"part-{{i:05d}}" for i in range({shards})]
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
sample = _sample(paths, names, [50_000] * {shards}, 50_000, 0)
grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
print(sample.shape[0], round(grew, 1))
"""


def _peak_growth(tmp_path: Path, shards: int) -> float:
    from climb.runtime.layout import RunPaths
    import numpy as np
    run = tmp_path / f"run{shards}"
    paths = RunPaths(run)
    paths.embed.dir.mkdir(parents=True)
    rng = np.random.default_rng(shards)
    for i in range(shards):
        np.save(paths.embed.vectors(f"part-{i:05d}"), rng.standard_normal((50_000, 64), dtype=np.float32))
    proc = subprocess.run([sys.executable, "-c", SCRIPT.format(repo=str(REPO), run=str(run), shards=shards)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout.split()
    assert int(out[0]) == 50_000
    return float(out[1])


def test_the_cluster_sample_does_not_grow_with_the_corpus(tmp_path):
    small, large = _peak_growth(tmp_path, 4), _peak_growth(tmp_path, 16)
    assert large - small < 30, f"sampling 4x the shards took {large - small:.0f} MB more ({small} -> {large})"
