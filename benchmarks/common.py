"""What the benchmark scripts share, so that each keeps only its own measurement.

A script runs as `python benchmarks/NAME.py` from the repository root and imports

    from common import RESULTS, load_avg, timer, write_result    # this file

`common` is found beside the script (Python puts the script's folder first on sys.path),
and importing it puts the repository root on sys.path, so `climb`, `proxies` and
`benchmarks.*` import after it. A script imported as `benchmarks.NAME` (the tests do) gets
the same module: benchmarks/__init__.py imports it, and it is in sys.modules under both names.

- places: ROOT (the repository), SHARED (../shared/data beside the checkout: corpus/, tasks/,
  swarms/regmix/), CORPUS, REGMIX, RESULTS (benchmarks/results); `shared_or_skip` says on
  stderr when shared data is absent (the script then measures nothing and exits 0);
  `run_paths(run)`: climb's RunPaths of a run folder;
- offline: `offline_env(**extra)` (os.environ + HF_HUB_OFFLINE=1, TRANSFORMERS_OFFLINE=1) for
  child processes, `go_offline(**extra)` for this one; `run_climb(args, sets)` runs
  `python -m climb.cli ...` at ROOT with that environment;
- the machine: `machine(*keys)` (python, torch, cpus, load_avg, date), `load_avg()`, `today()`, `now()`;
- measuring: `timer()` (`with timer() as t: ...`, then `t.seconds`), `timed(fn, ...)`, `peak_rss_mb()`;
- results: `write_result(path, obj, indent=2)`, `show(obj, *keys)` (a summary on stdout).
The fields each script writes stay its own.
"""
from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.modules.setdefault("common", sys.modules[__name__])  # one module under both names (see above)
sys.modules.setdefault("benchmarks.common", sys.modules[__name__])

SHARED = ROOT.parent / "shared" / "data"
CORPUS = SHARED / "corpus"
REGMIX = SHARED / "swarms" / "regmix"
RESULTS = ROOT / "benchmarks" / "results"
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}  # models from the local cache only


def shared_or_skip(path: str | Path, who: str, pattern: str | None = None) -> Path | None:
    """The shared data at `path` (a str: relative to SHARED; a Path: as given) when it is there and,
    given `pattern`, holds a match; else None, after saying on stderr that `who` is skipped."""
    p = SHARED / path if isinstance(path, str) else Path(path)
    if p.exists() and (pattern is None or any(p.glob(pattern))):
        return p
    print(f"{who}: skipped: {p} is absent{f' or holds no {pattern}' if pattern else ''} (the shared data "
          f"lives in ../shared/data beside the checkout)", file=sys.stderr, flush=True)
    return None


def run_paths(run: str | Path):
    """climb's RunPaths of a run folder (e.g. runs/demo): where each stage's files are."""
    from climb.runtime.layout import RunPaths
    return RunPaths(Path(run))


def offline_env(**extra: str) -> dict:
    """os.environ with the offline settings and `extra` set: the environment of a child process."""
    return {**os.environ, **OFFLINE, **extra}


def go_offline(**extra: str) -> None:
    """The offline settings and `extra` (e.g. OMP_NUM_THREADS="1") in this process's environment, where
    not already set; call it before importing numpy or torch."""
    for k, v in {**OFFLINE, **extra}.items():
        os.environ.setdefault(k, v)


def run_climb(args: list, sets: list[str] = (), *, check: bool = True, capture: bool = False,
              env: dict | None = None) -> subprocess.CompletedProcess:
    """`python -m climb.cli ARGS --set S ...` in a child process at ROOT (env: offline_env()).
    `capture`: stdout and stderr as text on the result; its `.args` is the command."""
    cmd = [sys.executable, "-m", "climb.cli", *map(str, args)]
    for s in sets:
        cmd += ["--set", s]
    return subprocess.run(cmd, cwd=ROOT, env=offline_env() if env is None else env, check=check,
                          capture_output=capture, text=capture)


def load_avg(ndigits: int | None = 2) -> list[float]:
    """The 1, 5 and 15 minute load averages, rounded (ndigits=None: as the OS reports them). On a
    shared machine they count other users' jobs too."""
    return [x if ndigits is None else round(x, ndigits) for x in os.getloadavg()]


def today() -> str:
    return time.strftime("%Y-%m-%d")


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S")


def _torch_version() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    return torch.__version__


_FACTS = {"python": platform.python_version, "torch": _torch_version, "cpus": os.cpu_count,
          "load_avg": load_avg, "date": today}


def machine(*keys: str) -> dict:
    """This machine: python, torch (None when not importable), cpus, load_avg, date; or only `keys`, in order."""
    return {k: _FACTS[k]() for k in keys or _FACTS}


class timer:
    """`with timer() as t: ...`, then `t.seconds` is how long the block took (time.perf_counter)."""

    def __enter__(self) -> timer:
        self.seconds, self._t0 = None, time.perf_counter()
        return self

    def __exit__(self, *exc) -> bool:
        self.seconds = time.perf_counter() - self._t0
        return False


def timed(fn, *args, **kwargs) -> tuple:
    """(fn(*args, **kwargs), the seconds it took)."""
    with timer() as t:
        out = fn(*args, **kwargs)
    return out, t.seconds


def peak_rss_mb(children: bool = False) -> float:
    """Peak resident memory in MiB of this process, or (children=True) of its largest finished child."""
    return resource.getrusage(resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF).ru_maxrss / 1024


def write_result(path: str | Path, obj, indent: int | None = 2) -> Path:
    """Write `obj` as JSON (`indent`, a final newline), or a str as it is, to `path`, making its folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj, indent=indent) + "\n")
    return path


def show(obj, *keys: str, indent: int | None = None) -> None:
    """Print `obj` (only `keys` of it, when given) as JSON: a script's summary on stdout."""
    print(json.dumps({k: obj[k] for k in keys} if keys else obj, indent=indent), flush=True)
