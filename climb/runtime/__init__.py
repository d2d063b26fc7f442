"""Run bookkeeping and execution:

- `stage`: `RunPaths` (every path in a run folder), the stages' typed outputs,
  manifests and `execute` (skip a finished stage, resume an unfinished one task by task);
- `results`: the append-only results log a search resumes from; `runlock`: one
  process per run folder;
- `executor`, `dask_client`, `workers`: where tasks run (in-process, a pool of
  processes, or Dask); `device`: which device and how many proxy processes;
- `proxy_runs`: one proxy run (train + score, an external command, or a table look-up
  in `lookup`) as a task an executor maps.
"""
