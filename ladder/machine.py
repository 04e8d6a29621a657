"""Which machine a measurement ran on: a description for the record and a class for comparisons.

A throughput measured on one kind of machine says nothing about another, so a stored throughput is
only compared with one measured on a machine of the same class. The class is the hardware a job's
speed is made of: the GPU model and count where the job sees GPUs, else the CPU model and its
logical core count (`cpu:Intel(R) Xeon(R) Platinum 8488C x2`, `gpu:NVIDIA H200 x1`). Software
versions (Python, torch) are recorded but are not part of the class: a slowdown that a torch
upgrade brings on the same hardware is a regression worth reporting.

Nothing here times anything: a measured peak belongs to a benchmark, not to a machine's identity.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

_CPUINFO = Path("/proc/cpuinfo")


def cpu_model(cpuinfo: Path = _CPUINFO) -> str:
    """The CPU's model name (Linux: /proc/cpuinfo; elsewhere what `platform` knows)."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        text = ""
    for key in ("model name", "Model", "Hardware", "cpu model"):  # x86, ARM boards, ARM SoCs, MIPS
        for line in text.splitlines():
            name, sep, value = line.partition(":")
            if sep and name.strip() == key and value.strip():
                return " ".join(value.split())
    return platform.processor() or platform.machine() or "unknown"


def machine_class(info: dict[str, Any]) -> str:
    """The comparable part of `machine_info()`: GPU model and count, else CPU model and cores."""
    if info.get("gpu"):
        return f"gpu:{info['gpu']} x{info.get('gpus', 1)}"
    return f"cpu:{info.get('cpu_model', info.get('cpu', 'unknown'))} x{info.get('cores')}"


def machine_info() -> dict[str, Any]:
    """This process's machine: CPU, cores, versions, the GPUs it can see, and its `class`."""
    info: dict[str, Any] = {"cpu": platform.processor() or platform.machine(), "cpu_model": cpu_model(),
                            "cores": os.cpu_count(), "python": platform.python_version()}
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
            info["gpus"] = torch.cuda.device_count()
    info["class"] = machine_class(info)
    return info
