"""climb.runtime.device: which device and dtype a stage runs on, and how many processes train proxies.

CUDA, MPS, bf16 support and the CPU affinity mask are patched, so every branch runs on any machine."""
from __future__ import annotations

import os

import pytest
import torch

from climb.runtime import device
from climb.config import ExecutorConfig, ProxyConfig
from climb.runtime.device import proxy_processes, resolve_device, resolve_dtype


@pytest.fixture
def machine(monkeypatch):
    """Set what the machine has: machine(cuda=..., mps=..., cores=..., cpu_bf16=...)."""
    def set_(cuda=False, mps=False, cores=None, cpu_bf16=False, cuda_bf16=True):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: cuda_bf16)
        monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)
        monkeypatch.setattr(device, "cpu_has_bf16", lambda: cpu_bf16)
        if cores is not None:
            monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    return set_


def test_resolve_device_auto_prefers_cuda_then_mps_then_cpu(machine):
    machine(cuda=True, mps=True)
    assert resolve_device("auto") == resolve_device("") == "cuda"
    machine(cuda=False, mps=True)
    assert resolve_device("auto") == "mps"
    machine(cuda=False, mps=False)
    assert resolve_device("auto") == "cpu"


def test_resolve_device_explicit(machine):
    machine(cuda=True)
    assert resolve_device("cuda:1") == "cuda:1" and resolve_device("cpu") == "cpu"
    machine(cuda=False)
    assert resolve_device("cpu") == "cpu" and resolve_device("mps") == "mps"
    with pytest.raises(ValueError, match=r"device 'cuda:0' requested but CUDA is not available"):
        resolve_device("cuda:0")


def test_resolve_dtype(machine):
    machine(cuda=True, cuda_bf16=True)
    assert resolve_dtype("auto", "cuda") == resolve_dtype("auto", "cuda:1") == torch.bfloat16
    machine(cuda=True, cuda_bf16=False)
    assert resolve_dtype("auto", "cuda") == torch.float16
    machine(cpu_bf16=True)
    assert resolve_dtype("auto", "cpu") == torch.bfloat16
    assert resolve_dtype("auto", "mps") == torch.float32
    machine(cpu_bf16=False)
    assert resolve_dtype("auto", "cpu") == torch.float32
    assert [resolve_dtype(p, "cpu") for p in ("fp32", "fp16", "bf16")] == [torch.float32, torch.float16,
                                                                          torch.bfloat16]
    with pytest.raises(ValueError, match="dtype must be one of auto, fp32, fp16, bf16; got 'float32'"):
        resolve_dtype("float32", "cpu")


def test_proxy_processes_one_per_available_core_on_a_cpu(machine):
    machine(cuda=False, cores=6)
    assert proxy_processes(ProxyConfig(device="auto"), ExecutorConfig()) == 6
    assert proxy_processes(ProxyConfig(device="cpu"), ExecutorConfig()) == 6
    machine(cuda=False, cores=1)
    assert proxy_processes(ProxyConfig(), ExecutorConfig()) == 1


def test_proxy_processes_counts_the_affinity_mask_not_the_machine(machine, monkeypatch):
    machine(cuda=False, cores=3)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert proxy_processes(ProxyConfig(), ExecutorConfig()) == 3
    # Without sched_getaffinity (not Linux): the machine's core count, at least one.
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    assert proxy_processes(ProxyConfig(), ExecutorConfig()) == 64
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert proxy_processes(ProxyConfig(), ExecutorConfig()) == 1


def test_proxy_processes_one_otherwise(machine):
    machine(cuda=True, cores=8)
    assert proxy_processes(ProxyConfig(device="auto"), ExecutorConfig()) == 1  # a GPU
    machine(cuda=False, cores=8)
    assert proxy_processes(ProxyConfig(command="train {weights} {out}"), ExecutorConfig()) == 1
    assert proxy_processes(ProxyConfig(lookup="m.csv", lookup_weights="w.csv"), ExecutorConfig()) == 1
    assert proxy_processes(ProxyConfig(), ExecutorConfig(kind="dask")) == 1  # Dask has workers of its own
    assert proxy_processes(ProxyConfig(), ExecutorConfig(dask_address="tcp://h:8786")) == 1
    # executor.processes wins over the automatic count, but not over Dask
    assert proxy_processes(ProxyConfig(), ExecutorConfig(processes=3)) == 3
    assert proxy_processes(ProxyConfig(command="x {out}"), ExecutorConfig(processes=2)) == 2
    assert proxy_processes(ProxyConfig(), ExecutorConfig(kind="dask", processes=3)) == 1
