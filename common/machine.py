"""The machine a run ran on, as far as it can move a result's last bits.

The same spec, seed and code give the same steps (the same result keys) on any machine,
but a float result is bit for bit only on the same kind of machine: torch picks its CPU
kernels by the processor's vector instructions (AVX2, AVX-512, AMX) and splits their sums
by its thread count, and GPU kernels differ by model and library. A run records
`describe()` of its driver (the `runs` view's `machine`, JSON), so that two runs of one
spec whose numbers differ can be told apart by where they ran (`pipeline diff`).

`describe` imports no library: torch's threads and GPUs are read where the process has
loaded it (a run's driver has), and the libraries' versions from their installed metadata.
`pin_threads` sets torch's threads the one way every computation of a result does.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

#: the CPU flags that choose torch's kernels (x86: /proc/cpuinfo "flags"; Arm: "Features")
KERNEL_FLAGS = (
    "avx2",
    "fma",
    "avx512f",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "asimd",
    "sve",
    "sve2",
)
#: environment variables that choose torch's CPU kernels without changing the CPU: a
#: process with other values computes other floats, as another machine would
KERNEL_ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR")
#: libraries whose version can change a result, described where they are installed
LIBRARIES = ("torch", "transformers", "vllm")


def cpu(cpuinfo: str | None = None) -> tuple[str, list[str]]:
    """The processor's model name and which of `KERNEL_FLAGS` it has (from /proc/cpuinfo,
    or `cpuinfo`'s text; elsewhere `platform.processor()` and no flags)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            cpuinfo = ""
    name, flags = "", set[str]()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "hardware", "cpu model") and not name:
            name = value.strip()
        elif key in ("flags", "features") and not flags:
            flags = set(value.split())
    return name or platform.processor() or platform.machine(), [f for f in KERNEL_FLAGS if f in flags]


def describe(cpuinfo: str | None = None) -> dict[str, Any]:
    """What can make this machine's floats differ from another's: the CPU, its kernel
    flags (and the variables that choose among them, where set), the logical CPUs, torch's
    threads and GPUs, and the installed libraries' versions."""
    name, flags = cpu(cpuinfo)
    out: dict[str, Any] = {
        "cpu": name,
        "flags": " ".join(flags),
        "cpus": os.cpu_count(),
        "system": f"{platform.system()} {platform.machine()}",
        "python": platform.python_version(),
        **{k: os.environ[k] for k in KERNEL_ENV if k in os.environ},
    }
    torch = sys.modules.get("torch")
    if torch is not None:
        out["threads"] = int(torch.get_num_threads())
        out["gpus"] = int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
    for lib in LIBRARIES:
        try:
            out[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            continue
    return out


def kernel_kind(cpuinfo: str | None = None) -> str:
    """The kind of CPU a float result is bit for bit on, as a record names it: the model
    and its kernel flags ("AMD EPYC: avx2 fma avx512f avx512_vnni avx512_bf16"); with
    torch's threads where the process has loaded torch."""
    name, flags = cpu(cpuinfo)
    out = f"{name}: {' '.join(flags) or 'no kernel flags'}"
    torch = sys.modules.get("torch")
    return out + (f", {torch.get_num_threads()} torch threads" if torch is not None else "")


def machine_class() -> str:
    """The machine's class as a result record names it: its logical CPUs, and its GPUs
    where torch is loaded and sees some ("2-core CPU", "16-core CPU, 1 GPU NVIDIA H100")."""
    out = f"{os.cpu_count()}-core CPU"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        out += f", {torch.cuda.device_count()} GPU {torch.cuda.get_device_name(0)}"
    return out


def pin_threads() -> int:
    """Set torch's threads explicitly to the count it uses now (a sweep trial's
    `trial_cpus`, set before; else torch's default, the machine's cores): on CPU the call
    itself changes the floats that follow, so every run makes it as it starts, and so does
    a rebuild of a version kept in memory (why, measured: docs/architecture.md, "A lost
    trainer is rebuilt")."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(n)
    return n


def matmul_gflops(dtype: Any = None, n: int = 1024, repeats: int = 20) -> float:
    """GFLOP/s of an n x n matmul in `dtype` (torch's; float32 by default) on this
    process's torch threads, the best of 3: the machine's rate a bench divides by."""
    import torch

    a, b = (torch.randn(n, n).to(dtype or torch.float32) for _ in range(2))
    a @ b
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(repeats):
            a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 * repeats / best / 1e9


def recorded() -> str:
    """`describe()` as the JSON a run record keeps."""
    return json.dumps(describe(), sort_keys=True)


def differences(a: str | None, b: str | None) -> list[tuple[str, Any, Any]] | None:
    """(key, a's value, b's value) for every key where two recorded machines differ, or
    None where either is not known: a record made before runs kept their machine, or one
    that is not a JSON object (tampered)."""
    ma, mb = _parsed(a), _parsed(b)
    if ma is None or mb is None:
        return None
    return [(k, ma.get(k), mb.get(k)) for k in sorted(set(ma) | set(mb)) if ma.get(k) != mb.get(k)]


def _parsed(text: str | None) -> dict[str, Any] | None:
    try:
        value = json.loads(text) if text else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
