"""An external trainer as a proxy (`proxy.command`): the command, its process group, its record.

climb writes the mixture to `{weights}`, a JSON file:

    {"weights": [...], "clusters": [0, 1, ...], "seed": n, "mixture_id": "it0-003",
     "pause": {"after_steps": F, "of_steps": S, "checkpoint": "/run/search/base/base.pt"},  # the shared base only
     "base": {"checkpoint": "/run/search/base/base.pt", "steps": F, "of_steps": S}}        # its continuations only

and reads the metrics record the command writes to `{out}`: `{"metrics": {...}}`, and
optionally `"tokens"` (those it trained itself), `"params"` and a learning curve `"curve":
{"step": [...], "<metric>": [...]}`. With `search.base`, the first command of a search
trains the shared base: `pause` asks it to train the first F of its S steps on the weights
(the natural mixture), save whatever it needs to continue to `checkpoint`, and score the
target there; every search proxy's command then gets `base`: load that checkpoint and
train steps F to S on its own weights (the learning-rate schedule is the one of S steps).

The command runs in a process group of its own, killed when it passes `proxy.timeout_s`
and when climb itself is interrupted (Ctrl-C, SIGTERM).
"""
from __future__ import annotations

import json
import logging
import os
import shlex
import signal
import subprocess
import tempfile
import time
from pathlib import Path

log = logging.getLogger(__name__)


def request(task) -> dict:
    """What the command's `{weights}` file holds for a ProxyTask (see the module docstring)."""
    out = {"weights": list(task.weights), "seed": task.seed, "mixture_id": task.mixture_id,
           "clusters": list(range(len(task.weights)))}
    steps = task.proxy.steps
    if task.stop_at:
        out["pause"] = {"after_steps": task.stop_at, "of_steps": steps, "checkpoint": task.checkpoint}
    if task.base:
        out["base"] = {"checkpoint": task.base, "steps": task.base_steps, "of_steps": steps}
    return out


class ProxyTimeout(RuntimeError):
    """An external proxy ran past proxy.timeout_s."""


def _kill_group(proc: subprocess.Popen, grace: float = 3.0) -> None:
    """SIGTERM the command's process group, then SIGKILL whatever is left after `grace` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            continue
        try:  # the leader is gone; are any of its children left in the group?
            os.killpg(proc.pid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.1 if sig == signal.SIGTERM else 0)


def run_command(cmd: str, timeout_s: float) -> subprocess.CompletedProcess:
    """Run a shell command in a process group of its own; the group is killed on timeout or
    when this process is interrupted, so no trainer outlives the proxy it was started for."""
    proc = subprocess.Popen(cmd, shell=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s if timeout_s > 0 else None)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        try:
            proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:  # a child that left the group still holds the pipes
            pass
        raise ProxyTimeout(f"proxy.command timed out after {timeout_s:g}s (proxy.timeout_s); "
                           "its process group was killed") from None
    except BaseException:  # Ctrl-C, SIGTERM (raised by the CLI's handler), anything else
        _kill_group(proc, grace=1.0)
        raise
    _kill_group(proc, grace=1.0)  # anything it left running in the background
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _metric(v):
    """A metric value as a float; null and non-numbers as NaN (the record then fails)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return float("nan")
    return float(v)


def run_external(task) -> tuple[dict, int, dict]:
    """Run one proxy with `proxy.command`: (metrics, tokens, {"params", "curve"} where given)."""
    proxy_cfg = task.proxy
    with tempfile.TemporaryDirectory(prefix="climb-proxy-") as tmp:
        wfile, out = Path(tmp) / "weights.json", Path(tmp) / "metrics.json"
        wfile.write_text(json.dumps(request(task)))
        cmd = proxy_cfg.command.format(weights=shlex.quote(str(wfile)), out=shlex.quote(str(out)))
        proc = run_command(cmd, proxy_cfg.timeout_s)
        if proc.returncode != 0:
            raise RuntimeError(f"proxy.command exited {proc.returncode}: {proc.stderr[-2000:]}")
        if not out.exists():
            raise RuntimeError(f"proxy.command wrote no metrics file to {{out}}; stdout: {proc.stdout[-500:]}")
        try:
            rec = json.loads(out.read_text())
        except ValueError as e:
            raise RuntimeError(f"proxy.command wrote a metrics file that is not JSON ({e})") from None
    if task.stop_at and task.checkpoint and not Path(task.checkpoint).exists():
        raise RuntimeError(f"proxy.command was asked to pause after {task.stop_at} steps and save its state to "
                           f"{task.checkpoint} (the \"pause\" of its weights file), but wrote nothing there")
    metrics = rec.get("metrics", rec) if isinstance(rec, dict) else {}
    if not isinstance(metrics, dict):
        raise RuntimeError(f"proxy.command wrote {type(metrics).__name__} metrics; expected an object")
    # Numbers are metrics; null (a failed evaluation) is kept so that the record fails.
    metrics = {k: _metric(v) for k, v in metrics.items()
               if v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))}
    return metrics, int(rec.get("tokens", 0) or 0), external_extra(rec)


def external_extra(rec: dict) -> dict:
    """An external trainer's parameter count and curve, where its metrics file gives them
    (`"params": int`, `"curve": {"step": [...], "<metric>": [...], ...}`, lists of one length)."""
    out: dict = {}
    if isinstance(rec.get("params"), int) and not isinstance(rec["params"], bool):
        out["params"] = rec["params"]
    curve = rec.get("curve")
    if isinstance(curve, dict) and isinstance(curve.get("step"), list) and all(
            isinstance(v, list) and len(v) == len(curve["step"]) for v in curve.values()):
        out["curve"] = {k: [_metric(x) if x is not None else None for x in v] if k != "step" else v
                        for k, v in curve.items()}
    else:
        if curve is not None:
            log.warning("proxy.command's curve is not {\"step\": [...], \"<metric>\": [...]} with lists of one "
                        "length; it is left out of the record")
    return out
