"""Experiment tracking ([track], off by default): a run's proxies and verdicts in MLflow, W&B or trackio.

What is logged: one parent run per run folder and config (the config as its parameters);
under it one child run per proxy: its mixture weights as parameters w_0..w_{k-1}; the
objective, every metric of its record, its tokens and model size as metrics, and its learning
curve where the record holds one (`curve/<name>` over training steps); its seed, iteration,
purpose (search, replicate, one-shot, comparison, validation), mixture id and status as tags. On the parent: the found
mixture, each baseline's comparison with it (difference, 95% interval, verdict), the noise
figures, and the validation verdicts when the validate stage ran.

Where: the pipeline holds a `session` around its stages; after each stage (and every
`track.interval_s` while a search or validation runs) the session logs what the run
folder's results hold and the tracker has not seen yet (search/results.jsonl,
replicates.json, one_shot.json, comparison.json, validate/results.jsonl, the manifests and
summaries). The files are the record, so every proxy is logged once, from the driver,
wherever it trained (in this process, in worker processes, on Dask workers, before a
resume), and the stages know nothing of tracking.

Once: `<run>/track.json` keeps, per destination (backend, uri, experiment) and config,
the parent run's id and, per proxy (purpose, mixture id, seed, weights), its child run's id
and a digest of the record logged. A resumed run continues the same parent and logs only
what is new; a record that changed (a failed proxy trained again) updates its child run.
MLflow children also carry their key as a tag, so a resumed run adopts children that were
logged but not yet written down (a process killed mid-log). A config that changed (beyond
[executor] and [track]) starts a new parent, which then holds every proxy its run uses.

Never fatal: every call into the tracker goes through one guard. The first exception (not
installed, a bad uri, a server down, an error mid-run) logs one warning line and turns the
tracker off for the rest of the process; the run goes on. track.json keeps what had been
logged, so a later run continues from there.

    with track.session(cfg, paths) as tracker:
        with tracker.during("search"):
            search.run(cfg, paths)
"""
from __future__ import annotations

import json
import logging
import math
import os
import re
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from climb.config import RunConfig, digest, to_dict
from climb.io.files import read_json, write_json
from climb.runtime.results import one_line, proxy_records
from climb.runtime.layout import RunPaths

log = logging.getLogger(__name__)
# The stages that train proxies: the ones logged while they run.
STAGES_WITH_PROXIES = ("search", "validate")
# What `pip install` brings each tracker.
INSTALL = {"mlflow": "pip install 'climb[track]'", "wandb": "pip install wandb", "trackio": "pip install trackio"}


# ------------------------------------------------------------------ what the run folder holds
def _read(path: Path) -> Any:
    try:
        return read_json(path)
    except (OSError, ValueError):
        return None


def run_summary(paths: RunPaths) -> dict:
    """The parent run's figures from finished stages: `compare/...` (the search's comparison of the
    found mixture with each baseline), `quality/...`, `mixture/w_i`, `validate/...`."""
    out: dict[str, Any] = {}
    manifest = _read(paths.manifest("search"))
    if isinstance(manifest, dict):
        stats = manifest.get("stats", {})
        out.update({f"compare/mean/{n}": v for n, v in (stats.get("comparison") or {}).items()})
        for n, c in (stats.get("verdicts") or {}).items():
            out.update(_verdict(f"compare/vs_{n}", c))
        out.update({f"quality/{k}": v for k, v in (stats.get("quality") or {}).items()})
        out.update({f"search/{k}": stats.get(k) for k in ("proxies", "failed", "comparison_proxies")})
        mixture = _read(paths.search.mixture)
        if isinstance(mixture, dict):
            out.update({f"mixture/w_{i}": w for i, w in enumerate(mixture.get("weights", []))})
            out["mixture/predicted"] = mixture.get("predicted")
    summary = _read(paths.validate.summary) if paths.manifest("validate").exists() else None
    if isinstance(summary, dict):
        target = summary.get("target", {})
        out.update({f"validate/mean/{n}": v for n, v in (target.get("means") or {}).items()})
        for n, c in (target.get("comparison") or {}).items():
            out.update(_verdict(f"validate/vs_{n}", c))
        for metric, block in (summary.get("heldout") or {}).items():
            for n, c in (block.get("comparison") or {}).items():
                out.update(_verdict(f"validate/{metric}/vs_{n}", c))
        out["validate/rank_spearman"] = (summary.get("rank") or {}).get("spearman")
    return {k: v for k, v in out.items() if v is not None}


def _verdict(prefix: str, c: dict) -> dict:
    low, high = c.get("ci95") or (None, None)
    return {f"{prefix}/verdict": c.get("verdict"), f"{prefix}/diff": c.get("diff"), f"{prefix}/ci95_low": low,
            f"{prefix}/ci95_high": high, f"{prefix}/seeds": c.get("seeds")}


def proxy_key(purpose: str, rec: dict) -> str:
    """A proxy's identity across runs: its purpose, mixture id, seed and weights (a search rerun
    under new inputs reuses mixture ids for other weights)."""
    return f"{purpose}/{rec['mixture_id']}/{rec.get('seed')}/{digest(rec.get('weights'))[:8]}"


def proxy_metrics(rec: dict) -> list[tuple[str, float, int]]:
    """(name, value, step) of a record: the objective, its metrics, tokens and parameter count at
    step 0, and its learning curve where it holds one ({"step": [...], "<name>": [...]}: each
    series as `curve/<name>` at the training steps). Failed values (null) are left out."""
    out = [("objective", rec.get("objective"), 0)]
    out += [(k, v, 0) for k, v in (rec.get("metrics") or {}).items()]
    out += [("tokens", rec.get("tokens"), 0), ("num_params", rec.get("params"), 0)]
    curve = rec.get("curve")
    if isinstance(curve, dict) and isinstance(curve.get("step"), list):
        for name, values in curve.items():
            if name not in ("step", "tokens") and isinstance(values, list):
                out += [(f"curve/{name}", v, step) for step, v in zip(curve["step"], values) if _number(step)]
    return [(metric_name(k), float(v), int(s)) for k, v, s in out if _number(v)]


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def metric_name(name: str) -> str:
    """A name every tracker accepts (MLflow: letters, digits, _ - . space : /)."""
    return re.sub(r"[^\w\-. :/]", "_", str(name))


def config_digest(cfg: RunConfig) -> str:
    """What makes a run the same run for the tracker: the config, less where it runs and where it is tracked."""
    return digest({k: v for k, v in to_dict(cfg).items() if k not in ("executor", "track")})


def config_params(cfg: RunConfig) -> dict[str, str]:
    """The config as flat parameters: `section.field` -> its value (JSON for lists and tables)."""
    out = {}
    for section, values in to_dict(cfg).items():
        items = values.items() if isinstance(values, dict) else [(None, values)]
        for k, v in items:
            out[f"{section}.{k}" if k else section] = v if isinstance(v, str) else json.dumps(v)
    return out


def proxy_name(purpose: str, rec: dict) -> str:
    return f"{rec['mixture_id']}-seed{rec.get('seed')}" if purpose == "validation" else str(rec["mixture_id"])


# ------------------------------------------------------------------ the trackers
class Tracker:
    """A tracking backend. `where` is its resolved destination (kept in track.json)."""
    name = ""
    where = ""

    def start_run(self, cfg: RunConfig, resume: str | None) -> tuple[str, bool]:
        """Open the parent run: `resume` (a run id from track.json) if the backend still has it,
        else a new one. Returns (run id, whether it was resumed)."""
        raise NotImplementedError

    def children(self) -> dict[str, str]:
        """proxy key -> child run id of the children the backend holds under the parent ({}: unknown)."""
        return {}

    def log_proxy(self, rec: dict, purpose: str, key: str, run_id: str | None = None) -> str:
        """Log one proxy record as a child run (`run_id`: update that one); returns its id."""
        raise NotImplementedError

    def log_summary(self, values: dict) -> None:
        """Figures of the whole run on the parent: numbers (and lists of them, one per step) as
        metrics, strings as tags."""
        raise NotImplementedError

    def end(self, status: str) -> None:
        """Close the parent: "FINISHED", "FAILED" or "KILLED"."""
        raise NotImplementedError


def mlflow_uri(uri: str, run_dir: Path) -> str:
    """[track] uri -> an MLflow tracking URI: "" = sqlite:///<run>/mlflow.db; a path ending in .db
    (or .sqlite) = that SQLite file; another path = mlflow.db in that folder; a URI as it is."""
    uri = uri.replace("{run}", str(run_dir))
    if not uri:
        return f"sqlite:///{run_dir / 'mlflow.db'}"
    if re.match(r"^[a-zA-Z][\w+.-]*:", uri) and not re.match(r"^[a-zA-Z]:[\\/]", uri) or uri == "databricks":
        return uri
    p = Path(uri).expanduser().resolve()
    return f"sqlite:///{p if p.suffix in ('.db', '.sqlite', '.sqlite3') else p / 'mlflow.db'}"


class MlflowTracker(Tracker):
    """MLflow through its client API (no global active run): nested child runs under a parent."""
    name = "mlflow"
    MAX_PARAMS, MAX_TAGS, MAX_ENTRIES = 100, 100, 1000  # per log_batch call
    MAX_PARAM_LEN, MAX_TAG_LEN = 6000, 8000

    def __init__(self, uri: str, experiment: str, run_dir: Path):
        self.where, self.run_dir, self.parent = uri, run_dir, None
        if uri.startswith(("http://", "https://")):
            # A server that is down fails the tracker in seconds, not after minutes of retries.
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
        import mlflow  # noqa: F401  (the optional dependency: climb[track])
        from mlflow.entities import Metric, Param, RunTag
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient
        artifacts = None  # a server's or another store's own default
        if uri.startswith("sqlite:///") and ":memory:" not in uri:
            db = Path(uri[len("sqlite:///"):]).resolve()
            db.parent.mkdir(parents=True, exist_ok=True)
            artifacts = (db.parent / "mlartifacts").as_uri()  # not MLflow's default, ./mlruns of the cwd
        for noisy in ("mlflow.store.db.utils", "alembic"):  # schema set-up chatter on a new store
            logging.getLogger(noisy).setLevel(logging.WARNING)
        self._metric, self._param, self._tag, self._error = Metric, Param, RunTag, MlflowException
        self.client = MlflowClient(tracking_uri=uri)
        exp = self.client.get_experiment_by_name(experiment)
        if exp is None:
            try:
                self.experiment_id = self.client.create_experiment(experiment, artifact_location=artifacts)
            except MlflowException:  # created meanwhile by another run
                exp = self.client.get_experiment_by_name(experiment)
                if exp is None:
                    raise
        if exp is not None:
            if exp.lifecycle_stage != "active":
                raise RuntimeError(f"MLflow experiment {experiment!r} is deleted; restore it (mlflow experiments "
                                   "restore) or set track.experiment")
            self.experiment_id = exp.experiment_id

    def start_run(self, cfg: RunConfig, resume: str | None) -> tuple[str, bool]:
        if resume:
            try:
                run = self.client.get_run(resume)
            except self._error:
                run = None
            if run is not None and run.info.lifecycle_stage == "active" and \
                    run.info.experiment_id == self.experiment_id:
                self.client.update_run(resume, status="RUNNING")
                self.parent = resume
                return resume, True
        run = self.client.create_run(self.experiment_id, run_name=cfg.name,
                                     tags={"climb.run_dir": str(self.run_dir), "climb.config": config_digest(cfg)})
        self.parent = run.info.run_id
        self._batch(self.parent, params=config_params(cfg))
        return self.parent, False

    def children(self) -> dict[str, str]:
        out, token = {}, None
        while True:
            page = self.client.search_runs([self.experiment_id], f"tags.`mlflow.parentRunId` = '{self.parent}'",
                                           max_results=1000, page_token=token)
            out.update({r.data.tags["climb.key"]: r.info.run_id for r in page if "climb.key" in r.data.tags})
            token = page.token
            if not token:
                return out

    def log_proxy(self, rec: dict, purpose: str, key: str, run_id: str | None = None) -> str:
        if run_id is None:
            run_id = self.client.create_run(self.experiment_id, run_name=proxy_name(purpose, rec),
                                            tags={"mlflow.parentRunId": self.parent, "climb.key": key}).info.run_id
        tags = {"purpose": purpose, "mixture_id": rec["mixture_id"], "seed": rec.get("seed"),
                "iteration": rec.get("iteration"), "status": rec.get("status"), "error": rec.get("error")}
        # The same weights again on an update: MLflow accepts a parameter logged twice with one value.
        params = {f"w_{i}": repr(float(w)) for i, w in enumerate(rec.get("weights") or [])}
        self._batch(run_id, params=params, metrics=proxy_metrics(rec), tags=tags)
        self.client.set_terminated(run_id, "FINISHED" if rec.get("status") == "ok" else "FAILED")
        return run_id

    def log_summary(self, values: dict) -> None:
        metrics, tags = [], {}
        for k, v in values.items():
            if isinstance(v, (str, bool)):
                tags[k] = v
            elif _number(v):
                metrics.append((metric_name(k), float(v), 0))
            elif isinstance(v, list):
                metrics += [(metric_name(k), float(x), i) for i, x in enumerate(v) if _number(x)]
        self._batch(self.parent, metrics=metrics, tags=tags)

    def end(self, status: str) -> None:
        self.client.set_terminated(self.parent, status)

    def _batch(self, run_id: str, params: dict | None = None, metrics=(), tags: dict | None = None) -> None:
        """log_batch within MLflow's limits per call (100 parameters, 100 tags, 1000 entries)."""
        now = int(time.time() * 1000)
        ps = [self._param(k, str(v)[: self.MAX_PARAM_LEN]) for k, v in (params or {}).items()]
        ts = [self._tag(metric_name(k), str(v)[: self.MAX_TAG_LEN]) for k, v in (tags or {}).items() if v is not None]
        ms = [self._metric(k, v, now, step) for k, v, step in metrics]
        while ps or ts or ms:
            p, ps = ps[: self.MAX_PARAMS], ps[self.MAX_PARAMS:]
            t, ts = ts[: self.MAX_TAGS], ts[self.MAX_TAGS:]
            room = self.MAX_ENTRIES - len(p) - len(t)
            m, ms = ms[:room], ms[room:]
            self.client.log_batch(run_id, metrics=m, params=p, tags=t)


def _row(rec: dict, purpose: str) -> dict:
    """One proxy as a flat row of numbers, for trackers without nested runs (W&B, trackio)."""
    row = {f"{purpose}/{k}": v for k, v, step in proxy_metrics(rec) if not k.startswith("curve/")}
    row.update({f"{purpose}/w_{i}": float(w) for i, w in enumerate(rec.get("weights") or [])})
    row.update({f"{purpose}/{k}": rec[k] for k in ("seed", "iteration") if _number(rec.get(k))})
    return row


class WandbTracker(Tracker):
    """Weights & Biases, thinly: one W&B run for the climb run, one logged row per proxy
    (`<purpose>/objective`, `<purpose>/w_i`, ...), the verdicts in its summary."""
    name = "wandb"

    def __init__(self, uri: str, experiment: str, run_dir: Path):
        import wandb
        self.wandb, self.where, self.project, self.dir = wandb, uri, experiment, run_dir
        self.run = None

    def start_run(self, cfg: RunConfig, resume: str | None) -> tuple[str, bool]:
        settings = self.wandb.Settings(base_url=self.where) if self.where else None
        self.run = self.wandb.init(project=self.project, name=cfg.name, id=resume, resume="allow" if resume else None,
                                   config=to_dict(cfg), dir=str(self.dir), settings=settings)
        return self.run.id, bool(resume) and bool(getattr(self.run, "resumed", False))

    def log_proxy(self, rec: dict, purpose: str, key: str, run_id: str | None = None) -> str:
        self.run.log(_row(rec, purpose))
        return key

    def log_summary(self, values: dict) -> None:
        self.run.summary.update({metric_name(k): v for k, v in values.items() if not isinstance(v, list)})

    def end(self, status: str) -> None:
        self.run.finish(exit_code=0 if status == "FINISHED" else 1)


class TrackioTracker(Tracker):
    """trackio (W&B-like: its local store, a trackio server or a Space), thinly: as WandbTracker, numbers only."""
    name = "trackio"

    def __init__(self, uri: str, experiment: str, run_dir: Path):
        import trackio
        self.trackio, self.where, self.project = trackio, uri, experiment
        self.run = None

    def start_run(self, cfg: RunConfig, resume: str | None) -> tuple[str, bool]:
        name = resume or f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"
        server = self.where.startswith(("http://", "https://"))
        self.run = self.trackio.init(project=self.project, name=name, config=to_dict(cfg),
                                     resume="allow" if resume else "never",
                                     server_url=self.where if server else None,
                                     space_id=self.where if self.where and not server else None)
        return name, bool(resume)

    def log_proxy(self, rec: dict, purpose: str, key: str, run_id: str | None = None) -> str:
        self.run.log(_row(rec, purpose))
        return key

    def log_summary(self, values: dict) -> None:
        self.run.log({metric_name(k): float(v) for k, v in values.items() if _number(v)})

    def end(self, status: str) -> None:
        # trackio.finish() also forgets its current run, so its exit hook does not finish it a second
        # time (which printed "Uploading logs" after everything else a command said)
        if self.trackio.context_vars.current_run.get() is self.run:
            self.trackio.finish()
        else:
            self.run.finish()


def destination(cfg: RunConfig, paths: RunPaths) -> str:
    """Where [track] sends runs, as the tracker is given it ("" for a tracker's own default)."""
    return mlflow_uri(cfg.track.uri, paths.root) if cfg.track.backend == "mlflow" else cfg.track.uri


def make_tracker(cfg: RunConfig, paths: RunPaths) -> Tracker:
    """The backend [track] names, at its resolved destination (imports the tracker's package)."""
    t = cfg.track
    experiment = t.experiment or cfg.name
    if t.backend == "mlflow":
        return MlflowTracker(destination(cfg, paths), experiment, paths.root)
    if t.backend == "wandb":
        return WandbTracker(t.uri, experiment, paths.root)
    if t.backend == "trackio":
        return TrackioTracker(t.uri, experiment, paths.root)
    raise ValueError(f"unknown track.backend {t.backend!r}")


# ------------------------------------------------------------------ the session the pipeline holds
class _Quiet(logging.Filter):
    """Drops the HTTP client's retry warnings while a tracker call runs in the thread that logs them:
    a tracking server that is down is reported once, by the guard."""

    def __init__(self):
        super().__init__()
        self.threads: set[int] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        return record.thread not in self.threads


_QUIET = _Quiet()
logging.getLogger("urllib3.connectionpool").addFilter(_QUIET)


class _Guard:
    """Every call into a tracker: the first exception warns once and turns the tracker off."""

    def __init__(self, backend: str, where: str):
        self.backend, self.where, self.off, self.lock = backend, where, False, threading.RLock()

    def call(self, fn, *args):
        with self.lock:
            if self.off:
                return None
            me = threading.get_ident()
            _QUIET.threads.add(me)
            try:
                return fn(*args)
            except Exception as e:  # noqa: BLE001 - a tracker never fails the run
                self.off = True
                hint = f" ({INSTALL[self.backend]})" if isinstance(e, ImportError) and self.backend in INSTALL else ""
                log.warning("experiment tracking (%s%s) failed and is off for the rest of this run, which goes on: "
                            "%s: %s%s", self.backend, f" at {self.where}" if self.where else "", type(e).__name__,
                            one_line(e, 800), hint)
                log.debug("tracking failed", exc_info=True)
                return None
            finally:
                _QUIET.threads.discard(me)


class Off:
    """Tracking off: nothing happens, nothing is imported or written."""

    @contextmanager
    def during(self, stage: str):
        yield

    def sync(self) -> None:
        pass

    def close(self, status: str) -> None:
        pass


class Session(Off):
    """The tracking of one pipeline invocation: the backend behind its guard, and `<run>/track.json`."""

    def __init__(self, cfg: RunConfig, paths: RunPaths):
        self.cfg, self.paths, self.interval = cfg, paths, cfg.track.interval_s
        self.guard = _Guard(cfg.track.backend, destination(cfg, paths))
        self.entry: dict = {}
        self.book: dict = {"runs": []}
        self.backend: Tracker | None = self.guard.call(self._open)

    def _open(self) -> Tracker:
        backend = make_tracker(self.cfg, self.paths)
        book = _read(self.paths.track)
        self.book = book if isinstance(book, dict) and isinstance(book.get("runs"), list) else {"runs": []}
        ident = {"backend": backend.name, "uri": backend.where,
                 "experiment": self.cfg.track.experiment or self.cfg.name, "config": config_digest(self.cfg)}
        old = next((e for e in self.book["runs"] if all(e.get(k) == v for k, v in ident.items())), None)
        parent, resumed = backend.start_run(self.cfg, old["parent"] if old else None)
        entry = old if old is not None and resumed else {**ident, "parent": parent, "summary": None, "proxies": {}}
        if resumed:  # children logged but not written down (a killed process) are adopted, not doubled
            for key, child in backend.children().items():
                entry["proxies"].setdefault(key, [child, None])
        self.book["runs"] = [e for e in self.book["runs"] if e is not old] + [entry]
        self.entry = entry
        self._save()
        view = f" (to view: mlflow ui --backend-store-uri {backend.where})" if backend.name == "mlflow" else ""
        log.info("tracking to %s %s, experiment %r: %s run %s%s", backend.name, backend.where or "(its default)",
                 ident["experiment"], "continuing" if resumed else "new", parent, view)
        return backend

    def _save(self) -> None:
        write_json(self.paths.track, self.book)

    @contextmanager
    def during(self, stage: str):
        """Around one stage: log what it finished at its end (also when it fails), and every
        interval_s while it runs if it trains proxies."""
        stop, thread = threading.Event(), None
        if self.backend is not None and not self.guard.off and self.interval > 0 and stage in STAGES_WITH_PROXIES:
            thread = threading.Thread(target=self._every, args=(stop,), name="climb-track", daemon=True)
            thread.start()
        try:
            yield
        except Exception:
            self._stop(stop, thread)
            self.sync()
            raise
        except BaseException:  # interrupted: stop without logging more; a resumed run logs it
            self._stop(stop, thread, wait=5.0)
            raise
        self._stop(stop, thread)
        self.sync()

    def _every(self, stop: threading.Event) -> None:
        while not stop.wait(self.interval):
            self.sync()

    @staticmethod
    def _stop(stop: threading.Event, thread: threading.Thread | None, wait: float | None = None) -> None:
        stop.set()
        if thread is not None:
            thread.join(wait)

    def sync(self) -> None:
        """Log every proxy record not logged yet (or changed since), then the run's figures if they changed."""
        if self.backend is not None:
            self.guard.call(self._sync)

    def _sync(self) -> None:
        logged, dirty = self.entry["proxies"], False
        try:
            for purpose, rec in proxy_records(self.paths):
                key, seen = proxy_key(purpose, rec), digest(rec)
                have = logged.get(key)
                if have is not None and have[1] == seen:
                    continue
                logged[key] = [self.backend.log_proxy(rec, purpose, key, have[0] if have else None), seen]
                dirty = True
            summary = run_summary(self.paths)
            if summary and digest(summary) != self.entry.get("summary"):
                self.backend.log_summary(summary)
                self.entry["summary"] = digest(summary)
                dirty = True
        finally:
            if dirty:
                self._save()

    def close(self, status: str) -> None:
        if self.backend is not None:
            self.guard.call(self.backend.end, status)


OFF = Off()


@contextmanager
def session(cfg: RunConfig, paths: RunPaths):
    """The tracking of one pipeline invocation ([track]; `Off` when no backend is set). The parent
    run ends FINISHED, FAILED (an exception) or KILLED (Ctrl-C, SIGTERM)."""
    if not cfg.track.backend:
        yield OFF
        return
    s = Session(cfg, paths)
    try:
        yield s
    except KeyboardInterrupt:
        s.close("KILLED")
        raise
    except BaseException:
        s.close("FAILED")
        raise
    s.close("FINISHED")
