"""The one place that decides which torch device and dtype a stage runs on, and how
many local processes train proxies.

    from climb.runtime.device import resolve_device
    resolve_device("auto")  # "cuda" when there is a GPU, else "mps", else "cpu"
"""
from __future__ import annotations

import torch


def resolve_device(pref: str = "auto") -> str:
    if pref and pref != "auto":
        if pref.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device {pref!r} requested but CUDA is not available; use device=\"auto\" or \"cpu\"")
        return pref
    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def resolve_dtype(pref: str, device: str) -> torch.dtype:
    if pref == "auto":
        if device.startswith("cuda"):
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        if device == "cpu" and cpu_has_bf16():
            return torch.bfloat16
        return torch.float32
    table = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
    if pref not in table:
        raise ValueError(f"dtype must be one of auto, {', '.join(table)}; got {pref!r}")
    return table[pref]


def cpu_has_bf16() -> bool:
    """True where bf16 is faster than fp32 on this CPU: AMX (proxies.train.native_bf16)."""
    from proxies.train import native_bf16
    return native_bf16(torch.device("cpu"))


def proxy_processes(proxy_cfg, executor_cfg) -> int:
    """Local worker processes for proxy runs: `executor.processes`, or (0) one per available
    core when the built-in trainer runs on a CPU; one otherwise (a GPU, an external
    command, a table look-up, or Dask, which has workers of its own)."""
    if executor_cfg.kind == "dask" or executor_cfg.dask_address:
        return 1
    if executor_cfg.processes > 0:
        return executor_cfg.processes
    if proxy_cfg.lookup:
        return 1  # a look-up is instant; worker processes would only cost their start-up
    if proxy_cfg.command or resolve_device(proxy_cfg.device) != "cpu":
        return 1
    from climb.runtime.workers import cpu_slots
    return cpu_slots()
