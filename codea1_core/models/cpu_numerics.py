"""Which CPU kernels round this process's numbers: MKL's reproducibility branch, ATen's kernel level, the CPU.

What it does: :func:`mkl_cbwr_branch` reads the conditional-numerical-reproducibility (CNR) branch MKL runs in
(through ``mkl_serv_cbwr_get``, which the torch wheel's statically linked MKL exports; None without MKL) and
:func:`describe` returns what decides the rounding of a CPU run — the numerics mode, torch / MKL / oneDNN
versions, ATen's CPU capability, the MKL branch, the thread count, the CPU model and its vector flags — as
flat strings for MLflow tags and ``outputs/numerics/<stage>.json``.

Why: GEMMs in MKL's default mode take other kernels on other CPUs (AMD vs Intel, AVX2 vs AVX-512), which
round otherwise, and a batched GEMM's rounding there can even depend on the batch count; ATen's vectorised
element-wise kernels differ between its levels (``default`` / ``avx2`` / ``avx512``). ``flows/environment.py``
pins both before torch computes anything (``model.cpu_numerics: reproducible``); this module reports what
the process actually got. Reading the MKL branch is the first MKL call when nothing ran before: it fixes the
branch from the environment, as the first GEMM would.

What it does not: set anything (the environment does, before the first kernel runs), or cover GPUs.
"""

from __future__ import annotations

import ctypes
import functools
import re
from pathlib import Path

import torch

CBWR_BRANCHES = {
    0: "OFF",
    1: "OFF",
    2: "AUTO",
    3: "COMPATIBLE",
    4: "SSE2",
    6: "SSSE3",
    7: "SSE4_1",
    8: "SSE4_2",
    9: "AVX",
    10: "AVX2",
    11: "AVX512_MIC",
    12: "AVX512",
    13: "AVX512_MIC_E1",
    14: "AVX512_E1",
}
"""``mkl_cbwr_get(MKL_CBWR_BRANCH)`` values (``mkl_cbwr.h``); ``OFF``: no CNR, MKL picks kernels per CPU and call."""

_MKL_CBWR_BRANCH = 1
VECTOR_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "amx_tile")
"""CPU flags that decide which kernels MKL and ATen can pick (recorded with the CPU model)."""


@functools.cache
def _mkl() -> ctypes.CDLL | None:
    lib = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    try:
        handle = ctypes.CDLL(str(lib))
        handle.mkl_serv_cbwr_get.restype = ctypes.c_int
        handle.mkl_serv_cbwr_get.argtypes = [ctypes.c_int]
    except (OSError, AttributeError):  # another platform or a torch without MKL
        return None
    return handle


def mkl_cbwr_branch() -> str | None:
    """MKL's CNR branch in this process (``COMPATIBLE``, ``AUTO``, ``OFF``, ...), None when torch has no MKL."""
    lib = _mkl() if torch.backends.mkl.is_available() else None
    if lib is None:
        return None
    value = int(lib.mkl_serv_cbwr_get(_MKL_CBWR_BRANCH))
    return CBWR_BRANCHES.get(value & 0xFFFF, str(value))


def batch_invariant_gemm() -> bool:
    """Whether a row's GEMM result may be taken not to depend on the other rows or batches in the call.

    True only in MKL's ``COMPATIBLE`` branch: measured (torch 2.13, MKL 2024.2, AMD EPYC), MKL's default mode
    rounds a small batched GEMM (``[9, 16] x [16, 9]`` per batch) differently for 8 and 14 batches, and its
    other branches pick kernels per CPU. ``tests/core/models/cpu_decode/test_shared_decode.py`` checks the
    split decode under it.
    """
    return mkl_cbwr_branch() == "COMPATIBLE"


def _cpu() -> tuple[str, str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        import platform

        return platform.processor() or platform.machine(), ""
    model = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    flags = re.search(r"^flags\s*:\s*(.+)$", text, re.M)
    have = set(flags.group(1).split()) if flags else set()
    return (model.group(1).strip() if model else "unknown"), " ".join(f for f in VECTOR_FLAGS if f in have)


def describe(mode: str) -> dict[str, str]:
    """What decides this process's CPU rounding, as flat strings (MLflow tags, ``outputs/numerics/``)."""
    build = torch.__config__.show()
    mkl = re.search(r"Math Kernel Library Version ([\w.\-]+)", build)
    onednn = re.search(r"MKL-DNN (v[\w.]+)", build)
    cpu, flags = _cpu()
    return {
        "mode": mode,
        "torch": torch.__version__,
        "mkl": mkl.group(1) if mkl else "none",
        "onednn": onednn.group(1) if onednn else "none",
        "aten_capability": torch.backends.cpu.get_cpu_capability(),
        "mkl_cbwr": mkl_cbwr_branch() or "none",
        "threads": str(torch.get_num_threads()),
        "cpu": cpu,
        "cpu_flags": flags,
    }
