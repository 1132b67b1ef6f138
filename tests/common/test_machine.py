"""What a run records of its machine: the CPU and the flags that choose torch's kernels,
read from /proc/cpuinfo's text, and where two records differ."""

from __future__ import annotations

import json

from common.machine import KERNEL_FLAGS, cpu, describe, differences, recorded

X86 = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu vme sse2 avx avx2 fma avx512f avx512_bf16 amx_tile amx_bf16 avx512_vnni
processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu vme sse2 avx avx2 fma avx512f avx512_bf16 amx_tile amx_bf16 avx512_vnni
"""
ARM = """processor\t: 0
BogoMIPS\t: 243.75
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics sve sve2
CPU implementer\t: 0x41
"""


def test_cpu_reads_the_model_and_the_kernel_flags_only() -> None:
    name, flags = cpu(X86)
    assert name == "Intel(R) Xeon(R) Platinum 8480+"
    # in KERNEL_FLAGS' order; "avx" and "sse2" choose no kernel torch has today, so are left out
    assert flags == ["avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16"]
    _, arm = cpu(ARM)
    assert arm == ["asimd", "sve", "sve2"]
    # nothing readable: a name from the platform, no flags (never an error)
    name, flags = cpu("")
    assert isinstance(name, str) and flags == []
    assert set(KERNEL_FLAGS) >= set(cpu(X86)[1])


def test_describe_names_what_moves_a_float() -> None:
    import torch

    got = describe(X86)
    assert got["cpu"] == "Intel(R) Xeon(R) Platinum 8480+" and "amx_bf16" in got["flags"].split()
    assert got["threads"] == torch.get_num_threads() and got["torch"] == torch.__version__
    assert got["cpus"] >= 1 and got["python"].count(".") == 2
    assert "vllm" not in got or isinstance(got["vllm"], str)  # described where installed
    assert json.loads(recorded())["cpus"] == got["cpus"]


def test_differences_between_two_records() -> None:
    a = json.dumps({"cpu": "A", "flags": "avx2", "threads": 2, "torch": "2.13.0"})
    b = json.dumps({"cpu": "B", "flags": "avx2 avx512f", "threads": 2})
    assert differences(a, b) == [("cpu", "A", "B"), ("flags", "avx2", "avx2 avx512f"), ("torch", "2.13.0", None)]
    assert differences(a, a) == []
    # not known: a record without a machine, or a tampered one; neither sameness nor a difference
    for unknown in (None, "", "{not json", "[1, 2]", '"text"'):
        assert differences(a, unknown) is None and differences(unknown, a) is None
