"""A stand-in external trainer whose behaviour a test scripts through a control file.

    python scripted_proxy.py WEIGHTS_JSON OUT_JSON CONTROL_JSON

CONTROL_JSON: {"mode": ..., "ids": [mixture ids] or null (= all), "modes": {id: mode},
"log": path, "gate": path}. Mixtures not in "ids" (nor "modes") are scored like
quadratic_proxy.py ({"loss": d}). For the others, by mode:
- "ok": scored normally;
- "fail": exit 1 with a message on stderr;
- "null" / "nan": write the loss as null / NaN;
- "hang": start a grandchild that sleeps, note both PIDs and the weights file in
  "log" (one JSON line), then sleep forever;
- "gate": note as for hang, then wait until the file "gate" exists and score normally.
Every call is logged ({"mixture_id", "pid", "mode", ...} per line in "log"). The
control file is read on every call, so a test can change it between runs.
"""
import json
import os
import subprocess
import sys
import time

weights_file, out, control = sys.argv[1:4]
ctl = json.load(open(control))
rec = json.load(open(weights_file))
w = rec["weights"]
target = [0.1 / (len(w) - 1)] * (len(w) - 1) + [0.9]
loss = sum((a - b) ** 2 for a, b in zip(w, target))
mode = ctl.get("mode", "ok") if ctl.get("ids") is None or rec["mixture_id"] in ctl["ids"] else "ok"
mode = ctl.get("modes", {}).get(rec["mixture_id"], mode)


def note(**extra):
    with open(ctl["log"], "a") as fh:
        fh.write(json.dumps({"mixture_id": rec["mixture_id"], "pid": os.getpid(), "weights": weights_file,
                             **extra}) + "\n")


if mode not in ("hang", "gate"):
    note(mode=mode)
if mode == "fail":
    print(f"trainer crashed on {rec['mixture_id']}: CUDA error: out of memory", file=sys.stderr)
    sys.exit(1)
if mode in ("hang", "gate"):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    note(child=child.pid, mode=mode)
    while mode == "hang" or not os.path.exists(ctl["gate"]):
        time.sleep(0.05)
    child.kill()
value = {"null": None, "nan": float("nan")}.get(mode, loss)
with open(out, "w") as fh:
    metrics = {"loss": value}
    if ctl.get("aux"):  # a second metric, pulling toward the first cluster, for weighted objectives
        metrics["aux"] = sum((a - b) ** 2 for a, b in zip(w, [0.9] + [0.1 / (len(w) - 1)] * (len(w) - 1)))
    fh.write(json.dumps({"metrics": metrics, "tokens": 0}))
