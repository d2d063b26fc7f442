"""Kill -9 during each stage of a scale run: the rerun redoes at most the shard or proxy in
flight, and every output is byte-identical to an undisturbed run's.

    python benchmarks/scale_kill.py --docs 100000                      # every stage, killed half-way
    python benchmarks/scale_kill.py --docs 100000 --stages export --at 0.3 0.9 1.4
    python benchmarks/scale_kill.py --docs 100000 --corpus /tmp/sc100k --reference /tmp/ref \\
        --run /tmp/kill --set 'search.iterations=[4,2]' --set search.replicates=1 \\
        --set search.eval_seeds=2 --set proxy.steps=40        # a cheap search, a reference of its own

The reference is an undisturbed run folder of the same size and settings, as
benchmarks/scale.py leaves it (runs/scale-<N>); a stage it lacks is run there first,
undisturbed, with the overrides scale.py uses (the corpus's first N/50,000 shards) plus
--set. A reference made with other settings shows as a different manifest key. The killed
run (runs/scale-<N>-kill, fresh unless --keep) takes the stages in order; one not under
test (--stages) is copied from the reference (content keys: the copy is as good as a run).
Each stage under test, once per --at:

1. `climb <stage>` starts in a session of its own; once the stage has begun (its
   `stage_state.json` appears: the corpus digests and upstream checks before it are not
   the stage's work) the harness waits `at` x the reference stage's own seconds (its
   manifest's `stats.seconds`, which count from the same point), then SIGKILLs the whole
   process group, proxy workers included. A time, not a file event, picks the moment:
   it lands anywhere in a task (a shard half-embedded, a proxy mid-step, a file
   half-written), where a file event would always land just after a task finished.
   A stage done before the kill (the reference's seconds held a one-time cost, such as
   the static embedding's distillation, or a busier machine) is started again and killed
   at `at` x the seconds it just took (`first_kill_missed`); one done before that kill
   too says so (`finished_before_kill`).
2. The stage folder is listed right after the kill (path, inode, mtime_ns, size; the
   proxies' record files with their contents), and the stage is run again to the end.
3. Redone: a file finished at the kill whose inode or mtime the rerun changed. Not
   finished: hidden temporary files, and the files of a task whose last file, which
   marks it complete, is not there yet (IN_FLIGHT_UNTIL: an embedding shard's .npy before
   its ids, a token-store part before its done.json, an export shard's files before its
   plan/<shard>.done.json): those are the task in flight (`in_flight`). The rest are told
   apart by what a redo of them means: bookkeeping (manifest, stage state); the search's
   append-only log and the proxies' record files, rewritten whole as each record
   arrives, compared record by record (`proxies_redone`: a record there at the kill that
   the rerun changed, a proxy trained twice; `proxies_rerun`: those it added); files a
   stage writes in one step of its own around its tasks (WHOLE_STEP: the cluster summary
   and the dedup step's marks, the merged token store, the swarm CSVs, the export plan
   and blend files, the whole report), which any run reaching that step writes again;
   and the tasks' data files (embeddings, fine assignments, the centroids, the tokenizer,
   token-store parts, the search's plans, export shards), which must not be redone.
4. Identical: every file of the reference's stage folder against the killed run's, byte
   for byte; the names must match (hidden files aside; a results log's cut line set aside
   by the rerun is `set_aside`). A file that differs is compared again without what
   times a run, and is `timing_only` if equal then: JSON without the fields in VOLATILE
   (`seconds`, `finished`, throughputs, which shards a resumed run redid), JSON Lines also
   without the order of its lines (parallel proxies finish in any order), the report's
   page (report.md, index.html) without a table column headed "seconds" (the proxy
   compute table sums the proxies' own seconds). The manifest is compared without its
   `stats` (a record of this execution), its outputs' mtimes, and the size and digest of
   a timing_only output; stats that differ beyond VOLATILE are listed as `stats_differ`,
   not counted as a difference.

Results: benchmarks/results/scale_kill.json (per stage and kill fraction: `killed_at_s`,
`reference_seconds`, `rerun_seconds` (None: the rerun found the stage done and skipped
it), `finished_before_kill`, `in_flight`, `files_kept`, `data_files_redone`,
`whole_step_redone`, `bookkeeping_redone`, `proxies_redone`, `proxies_rerun`, `identical`,
`differing`, `timing_only`, `stats_differ`, `ok`) and a table on stdout.
Exits 1 when a stage is not identical or a finished data file or proxy was redone.
The pure parts are tested by tests/test_scale_kill.py.
"""
from __future__ import annotations

import argparse
import fnmatch
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from common import RESULTS, ROOT, machine, offline_env, run_paths, write_result
from benchmarks.scale import ROWS_PER_SHARD, STAGES, corpus_sets, run_stage, stage_command

STATE = "stage_state.json"  # climb.runtime.stage.STATE: begin() writes it as the stage's work starts
BOOKKEEPING = ("manifest.json", STATE, "tokens/index.previous.json")
APPEND_ONLY = ("results.jsonl",)  # climb.runtime.results: records appended, never rewritten
# JSON objects {id: record} rewritten whole each time a proxy's record arrives (search_compare,
# search_cheap): a rewrite is expected, a changed record is a proxy trained twice.
RECORD_FILES = ("replicates.json", "comparison.json", "one_shot.json", "experts.json", "merge.json",
                "base.json", "rungs_*.json")
# Per stage, files written by one step of the stage's own, before or after its tasks, not by a task
# that resumes: a rerun that reaches the step writes them again (climb.runtime.stage: "tasks that
# cost little to redo run again whole").
WHOLE_STEP = {
    # assign/: each written by its shard's task, then given the duplicate columns by the dedup
    # step (climb.stages.cluster.dedup.mark), which rewrites a file it has not marked yet
    "cluster": ("clusters.json", "cluster_centroids.npy", "assign/*.parquet"),
    "tokenize": ("tokens/cluster_*.bin", "tokens/index.json", "target_ngrams.npy"),
    "search": ("swarm_weights.csv", "swarm_metrics.csv", "mixture.json", "quality.json", "one_shot_mixture.json",
               "contamination.json"),
    "export": ("plan/*.npy", "mixture.json", "megatron_blend.txt", "interleave.json", "README.md",
               "destination.json", "megatron/*"),
    "report": ("*",),
}
# Files of a task that marks itself complete with a file written last: until that file exists
# they are the task in flight, whatever their names (a token-store part's token files are appended
# to in place; an embedding shard's .npy precedes its ids). Per stage, (pattern, marker): the
# pattern's groups name the task. The k-means centroids have none on purpose: a fit redone is found.
IN_FLIGHT_UNTIL = {
    "embed": ((r"(.+)\.npy", "{0}.ids.parquet"),),
    "cluster": ((r"summary_parts/(.+)\.hashes\.npy", "summary_parts/{0}.json"),
                (r"assign/(.+)\.parquet", "summary_parts/{0}.json")),
    "tokenize": ((r"tokens/parts/([^/]+)/.+", "tokens/parts/{0}/done.json"),),
    "export": ((r"data/cluster_\d+/(.+)-\d+\.parquet", "plan/{0}.done.json"),
               (r"megatron-parts/cluster_\d+/(.+)\.(?:bin|idx)", "plan/{0}.done.json"),
               (r"counts/([^/]+)/(.+)\.ids\.npy", "counts/{0}/{1}.npy")),
}
# Fields that time or describe one execution rather than what it produced.
VOLATILE = frozenset({"seconds", "finished", "docs_per_s", "tokens_per_s", "resumed_shards", "assigned_now",
                      "tokenized_now", "skipped_stage", "read_seconds", "fit_seconds", "teacher_seconds",
                      "teacher_docs_per_s"})
# Left by a kill and set aside by the rerun's repair (climb.runtime.results), not an output.
SET_ASIDE = ("results.rejected.jsonl",)


# ------------------------------------------------------------------ listing a stage folder
def hidden(rel: str) -> bool:
    """A temporary (`.NAME.XXXX.tmp`, `.student.tmp-PID`) or lock file: any part of its path hidden."""
    return any(part.startswith(".") for part in rel.split("/"))


def matches(rel: str, patterns) -> bool:
    return any(fnmatch.fnmatchcase(rel, p) for p in patterns)


def is_record_file(rel: str) -> bool:
    return matches(rel, APPEND_ONLY + RECORD_FILES)


def snapshot(folder: Path) -> dict:
    """{relative path: {"inode", "mtime_ns", "size"}} of every file under `folder` that is not
    hidden, with "text" (its bytes, decoded) for the proxies' record files: what the kill left."""
    out = {}
    if not folder.exists():
        return out
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder).as_posix()
        if hidden(rel) or not p.is_file():
            continue
        st = p.stat()
        entry = {"inode": st.st_ino, "mtime_ns": st.st_mtime_ns, "size": st.st_size}
        if is_record_file(rel):
            entry["text"] = p.read_bytes().decode("utf-8", "replace")
        out[rel] = entry
    return out


def kind(stage: str, rel: str) -> str:
    """bookkeeping, log (append-only), records, whole (a step of the stage's own) or data."""
    if rel in BOOKKEEPING:
        return "bookkeeping"
    if rel in APPEND_ONLY:
        return "log"
    if matches(rel, RECORD_FILES):
        return "records"
    if matches(rel, WHOLE_STEP.get(stage, ())):
        return "whole"
    return "data"


def in_flight(stage: str, rel: str, names) -> bool:
    """Whether `rel` belongs to a task whose completing file is not among `names`."""
    for pattern, marker in IN_FLIGHT_UNTIL.get(stage, ()):
        m = re.fullmatch(pattern, rel)
        if m:
            return marker.format(*m.groups()) not in names
    return False


# ------------------------------------------------------------------ what the rerun redid
def records(rel: str, text: str) -> dict[str, str]:
    """A record file's records, {id: canonical JSON}: a results log's last record per (mixture
    id, seed), as climb.runtime.results reads it (a line cut by the kill is no record); a JSON
    object's entries."""
    out = {}
    if rel.endswith(".jsonl"):
        for line in text.split("\n"):
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and "mixture_id" in rec:
                out[f"{rec['mixture_id']}/{rec.get('seed')}"] = json.dumps(rec, sort_keys=True)
        return out
    try:
        obj = json.loads(text)
    except ValueError:
        return out
    return {str(k): json.dumps(v, sort_keys=True) for k, v in obj.items()} if isinstance(obj, dict) else out


def redone(stage: str, before: dict, after: dict) -> dict:
    """What the rerun did to the files the kill left: those of tasks in flight, those kept, those
    redone by kind (and removed); for record files, the records there at the kill that the rerun
    changed (a proxy trained again) and how many it added."""
    out = {"in_flight": [], "files_kept": 0, "data_files_redone": [], "whole_step_redone": [],
           "bookkeeping_redone": [], "logs_appended": [], "logs_repaired": [], "records_rewritten": [],
           "removed": [], "proxies_redone": [], "proxies_rerun": 0}
    for rel, b in sorted(before.items()):
        if in_flight(stage, rel, before):
            out["in_flight"].append(rel)
            continue
        a = after.get(rel)
        if a is None:
            out["removed"].append(rel)
            continue
        k = kind(stage, rel)
        if k in ("log", "records"):
            old, new = records(rel, b.get("text", "")), records(rel, a.get("text", ""))
            # a failed proxy is trained again by design (search.retry_failed): not a redo
            out["proxies_redone"] += [f"{rel}:{i}" for i in old if i in new and new[i] != old[i]
                                      and json.loads(old[i]).get("status", "ok") == "ok"]
            out["proxies_rerun"] += sum(i not in old for i in new)
        if (a["inode"], a["mtime_ns"], a["size"]) == (b["inode"], b["mtime_ns"], b["size"]):
            out["files_kept"] += 1
        elif k == "log":  # its records are checked above; a new inode is a repair of a cut line
            out["logs_appended" if a["inode"] == b["inode"] else "logs_repaired"].append(rel)
        else:
            key = {"data": "data_files_redone", "whole": "whole_step_redone", "bookkeeping": "bookkeeping_redone",
                   "records": "records_rewritten"}[k]
            out[key].append(rel)
    for rel, a in after.items():  # record files the kill came before: every record in them is new
        if rel not in before and is_record_file(rel):
            out["proxies_rerun"] += len(records(rel, a.get("text", "")))
    return out


# ------------------------------------------------------------------ the comparison with the reference
def strip(obj, drop=VOLATILE):
    """`obj` without the keys in `drop`, at every depth."""
    if isinstance(obj, dict):
        return {k: strip(v, drop) for k, v in obj.items() if k not in drop}
    if isinstance(obj, list):
        return [strip(v, drop) for v in obj]
    return obj


def differences(a, b, where: str = "") -> list[str]:
    """The paths (a.b[2].c) at which two parsed JSON values differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b), key=str):
            out += differences(a.get(k), b.get(k), f"{where}.{k}" if where else str(k))
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{where}[{i}]")]
    return [] if a == b else [where or "(value)"]


def manifest_core(m: dict, timed: frozenset = frozenset()) -> dict:
    """A manifest without its execution record: no stats, no `finished`, its outputs' mtimes dropped
    (an output is its size and SHA-256), and only the names of the `timed` outputs, which hold
    timings (compared without them on their own)."""
    core = {k: v for k, v in m.items() if k not in ("stats", "finished")}
    core["outputs"] = {rel: "timed" if rel in timed else [e[0], *e[2:]] for rel, e in (m.get("outputs") or {}).items()}
    return core


def _blank_columns(cells: list[str], cols: set[int]) -> list[str]:
    return ["" if i in cols else c for i, c in enumerate(cells)]


def untimed_markdown(text: str) -> str:
    """A Markdown page with the cells of every table column headed "... seconds" blanked (the
    report's proxy compute table: the proxies' own seconds, summed)."""
    out, cols = [], set()
    for line in text.split("\n"):
        if not line.startswith("|"):
            cols = set()
        else:
            cells = line.split("|")
            if not cols:
                cols = {i for i, c in enumerate(cells) if "seconds" in c}
            line = "|".join(_blank_columns(cells, cols))
        out.append(line)
    return "\n".join(out)


def untimed_html(text: str) -> str:
    """An HTML page with the cells of every table column headed "... seconds" blanked."""
    def table(m: re.Match) -> str:
        heads = re.findall(r"<th[^>]*>(.*?)</th>", m.group(0), re.S)
        cols = {i for i, h in enumerate(heads) if "seconds" in h}

        def row(r: re.Match) -> str:
            col = itertools.count()
            return re.sub(r"<td[^>]*>.*?</td>", lambda c: "<td></td>" if next(col) in cols else c.group(0),
                          r.group(0), flags=re.S)
        return re.sub(r"<tr>.*?</tr>", row, m.group(0), flags=re.S) if cols else m.group(0)
    return re.sub(r"<table.*?</table>", table, text, flags=re.S)


def same_without_timings(rel: str, a: bytes, b: bytes) -> str | None:
    """Why two unequal JSON / JSON Lines files are the same output (the fields VOLATILE drops, the
    order of lines), or None where they differ in what they hold."""
    try:
        if rel.endswith(".jsonl"):
            la = [json.dumps(strip(json.loads(x)), sort_keys=True) for x in a.decode().splitlines() if x.strip()]
            lb = [json.dumps(strip(json.loads(x)), sort_keys=True) for x in b.decode().splitlines() if x.strip()]
            if la == lb:
                return "timings"
            return "timings, line order" if sorted(la) == sorted(lb) else None
        if rel.endswith(".json"):
            return "timings" if strip(json.loads(a)) == strip(json.loads(b)) else None
        for suffix, untimed in ((".md", untimed_markdown), (".html", untimed_html)):
            if rel.endswith(suffix) and untimed(a.decode()) == untimed(b.decode()):
                return "a seconds column"
    except (ValueError, UnicodeDecodeError):
        return None
    return None


def compare_folders(ref: Path, run: Path) -> dict:
    """Every file of the two stage folders (hidden files aside): `identical` when the names match
    and each pair is equal byte for byte, or without timings (`timing_only`, with why); the
    manifests by manifest_core, their stats beyond VOLATILE listed in `stats_differ`."""
    names = {rel for rel in snapshot(ref)} - {"manifest.json", STATE}
    other = {rel for rel in snapshot(run)} - {"manifest.json", STATE}
    differing = [f"{rel} (only in the reference)" for rel in sorted(names - other)]
    differing += [f"{rel} (only in the killed run)" for rel in sorted(other - names) if rel not in SET_ASIDE]
    timing_only = {}
    for rel in sorted(names & other):
        a, b = (ref / rel).read_bytes(), (run / rel).read_bytes()
        if a == b:
            continue
        why = same_without_timings(rel, a, b)
        if why:
            timing_only[rel] = why
        else:
            differing.append(rel)
    stats_differ = []
    ma, mb = ref / "manifest.json", run / "manifest.json"
    if ma.exists() != mb.exists():
        differing.append("manifest.json (only in one)")
    elif ma.exists():
        a, b = json.loads(ma.read_text()), json.loads(mb.read_text())
        timed = frozenset(timing_only)
        differing += [f"manifest.json: {d}" for d in differences(manifest_core(a, timed), manifest_core(b, timed))]
        stats_differ = differences(strip(a.get("stats", {})), strip(b.get("stats", {})))
    return {"identical": not differing, "differing": differing,
            "timing_only": [f"{rel} ({why})" for rel, why in timing_only.items()],
            "stats_differ": stats_differ, "set_aside": sorted(other & set(SET_ASIDE))}


# ------------------------------------------------------------------ running and killing a stage
def wait_for(path: Path, proc: subprocess.Popen, poll: float = 0.01) -> float | None:
    """perf_counter when `path` appeared; None if the process exited first."""
    while not path.exists():
        if proc.poll() is not None:
            return None
        time.sleep(poll)
    return time.perf_counter()


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the stage's process group (its worker processes with it) and wait until none is left."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)


def start_and_kill(stage: str, config: str, run: Path, sets: list[str], delay: float, log) -> dict:
    """Start `climb <stage>` in a session of its own, SIGKILL it `delay` seconds after the stage
    began; when (seconds since it began) and whether it had finished by then."""
    folder = run / stage
    proc = subprocess.Popen(stage_command(stage, config, run, sets), cwd=ROOT, env=offline_env(), stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    began = wait_for(folder / STATE, proc)
    if began is None:  # it never began: skipped (a manifest matched) or failed before its work
        proc.wait()
        return {"killed_at_s": None, "finished_before_kill": run_paths(run).manifest(stage).exists(),
                "exit_code": proc.returncode}
    try:
        proc.wait(timeout=delay)
    except subprocess.TimeoutExpired:
        pass
    killed_at = time.perf_counter() - began
    exited = proc.poll()
    kill_group(proc)
    return {"killed_at_s": round(killed_at, 2), "exit_code": exited,
            "finished_before_kill": run_paths(run).manifest(stage).exists()}


def reference_seconds(ref: Path, stage: str) -> float:
    return float(json.loads(run_paths(ref).manifest(stage).read_text())["stats"]["seconds"])


def ensure_reference(ref: Path, stages, config: str, sets: list[str], log) -> None:
    """Run, undisturbed, each stage the reference lacks (its manifest)."""
    for stage in stages:
        if not run_paths(ref).manifest(stage).exists():
            print(f"scale_kill: reference {ref}: running {stage} undisturbed", flush=True)
            run_stage(stage, config, ref, sets, log)


def copy_stage(ref: Path, run: Path, stage: str) -> None:
    """A stage not under test, taken from the reference: its key is a content key and copytree
    keeps the mtimes, so the copy is as good as running it here."""
    shutil.rmtree(run / stage, ignore_errors=True)
    shutil.copytree(ref / stage, run / stage, ignore=shutil.ignore_patterns(".*"))


def trial(stage: str, at: float, a, sets: list[str], log) -> dict:
    """One kill of `stage` at fraction `at` of the reference's seconds, the rerun, and the checks.
    A stage that finished before the kill (the reference's seconds held a one-time cost, such as
    the static embedding's distillation, or a busier machine) is killed once more at `at` of
    the seconds it just took."""
    ref_s = reference_seconds(a.reference, stage)
    delay, missed = at * ref_s, None
    while True:
        shutil.rmtree(a.run / stage, ignore_errors=True)  # the stage starts from nothing
        killed = start_and_kill(stage, a.config, a.run, sets, delay, log)
        if not killed["finished_before_kill"] or killed["killed_at_s"] is None or missed:
            break
        took = reference_seconds(a.run, stage)  # the undisturbed run just done, here
        missed = {"delay_s": round(delay, 2), "stage_seconds": round(took, 2)}
        delay = at * took
    before = snapshot(a.run / stage)
    rerun = run_stage(stage, a.config, a.run, sets, log)
    after = snapshot(a.run / stage)
    row = {"stage": stage, "at": at, "reference_seconds": round(ref_s, 2), **killed,
           **({"first_kill_missed": missed} if missed else {}),
           "files_at_kill": len(before), "rerun_wall_seconds": rerun["wall_seconds"],
           # a stage done before the kill is skipped: its manifest's seconds are the killed run's
           "rerun_seconds": None if before.get("manifest.json") == after.get("manifest.json") else rerun["seconds"],
           **redone(stage, before, after), **compare_folders(a.reference / stage, a.run / stage)}
    row["ok"] = row["identical"] and not row["data_files_redone"] and not row["proxies_redone"]
    return row


def table(rows: list[dict]) -> str:
    """One line per trial: seconds (the reference's, at the kill, the rerun's), files kept and
    data files redone, proxies rerun / trained twice, identical."""
    head = (f"{'stage':9} {'at':>4} {'ref s':>6} {'kill s':>6} {'rerun s':>7} {'kept':>4} {'redone':>6} "
            f"{'proxies':>7} {'identical':>9}  note")
    lines = [head, "-" * len(head)]
    for r in rows:
        notes = ["finished before the kill"] if r["finished_before_kill"] else []
        if r.get("first_kill_missed"):
            notes.append(f"killed again at {r['at']} x {r['first_kill_missed']['stage_seconds']} s")
        if r["data_files_redone"]:
            notes.append(f"redid {', '.join(r['data_files_redone'][:3])}")
        if r["differing"]:
            notes.append(f"differs: {', '.join(r['differing'][:3])}")
        cell = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
        proxies = f"{r['proxies_rerun']}/{len(r['proxies_redone'])}" if r["stage"] == "search" else "-"
        lines.append(f"{r['stage']:9} {r['at']:>4.2f} {cell(r['reference_seconds']):>6} {cell(r['killed_at_s']):>6} "
                     f"{cell(r['rerun_seconds']):>7} {r['files_kept']:>4} {len(r['data_files_redone']):>6} "
                     f"{proxies:>7} {str(r['identical']):>9}  {'; '.join(notes)}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, required=True, help="corpus size, a multiple of 50,000")
    ap.add_argument("--reference", type=Path, help="an undisturbed run folder (default: runs/scale-<N>)")
    ap.add_argument("--run", type=Path, help="the run folder to kill (default: runs/scale-<N>-kill)")
    ap.add_argument("--at", type=float, nargs="+", default=[0.5],
                    help="when to kill, as fractions of the reference stage's seconds (one trial each)")
    ap.add_argument("--config", default="pipelines/scale.toml")
    ap.add_argument("--corpus", type=Path, default=ROOT / "runs" / "scale-corpus")
    ap.add_argument("--set", action="append", default=[], help="more config overrides, as for scale.py")
    ap.add_argument("--stages", nargs="+", default=list(STAGES), choices=STAGES)
    ap.add_argument("--keep", action="store_true",
                    help="keep the killed run folder; its finished stages not under test are not copied again")
    ap.add_argument("--out", type=Path, default=RESULTS / "scale_kill.json")
    a = ap.parse_args(argv)
    if a.docs % ROWS_PER_SHARD:
        raise SystemExit(f"scale_kill: --docs is a multiple of {ROWS_PER_SHARD:,}; got {a.docs:,}")
    a.reference = (a.reference or ROOT / "runs" / f"scale-{a.docs}").resolve()
    a.run = (a.run or ROOT / "runs" / f"scale-{a.docs}-kill").resolve()
    if a.run == a.reference:
        raise SystemExit("scale_kill: --run must not be the reference")
    sets = corpus_sets(a.corpus.resolve(), a.docs, a.set)
    upto = STAGES[: max(STAGES.index(s) for s in a.stages) + 1]
    if a.run.exists() and not a.keep:
        shutil.rmtree(a.run)
    a.run.mkdir(parents=True, exist_ok=True)
    a.reference.mkdir(parents=True, exist_ok=True)
    res = {"name": "scale_kill", "docs": a.docs, "config": a.config, "sets": a.set, "at": a.at,
           "reference": str(a.reference), "run": str(a.run), "trials": [],
           "environment": machine("python", "torch", "cpus", "load_avg", "date")}
    # --keep goes on with an earlier invocation's run folder, so its log goes on too
    with open(a.run.parent / f"{a.run.name}.log", "a" if a.keep else "w") as log:
        log.write(f"== scale_kill {' '.join(sys.argv[1:] if argv is None else argv)} ({res['environment']['date']})\n")
        log.flush()
        ensure_reference(a.reference, upto, a.config, sets, log)
        for stage in upto:
            if stage not in a.stages:
                if not (a.keep and run_paths(a.run).manifest(stage).exists()):
                    copy_stage(a.reference, a.run, stage)
                continue
            for at in a.at:
                row = trial(stage, at, a, sets, log)
                res["trials"].append(row)
                print(f"scale_kill: {stage} at {at}: killed at {row['killed_at_s']} s, ok={row['ok']}", flush=True)
                write_result(a.out, res)  # after every trial: a long run keeps what it found
    res["ok"] = all(r["ok"] for r in res["trials"])
    write_result(a.out, res)
    print(table(res["trials"]), flush=True)
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
