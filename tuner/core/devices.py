"""Can this device run the dtype, and is it fast there? Checked before any search starts."""
from __future__ import annotations

import torch

from tuner.core.dtypes import parse_dtype
from tuner.core.errors import DeviceError


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _fast_lower_dtypes() -> set[str]:
    """The CPU features that make bf16/fp16 fast, as oneDNN sees them.

    oneDNN's own answer (it honours ONEDNN_MAX_CPU_ISA, so a capped CPU reads
    as the CPU it is capped to); /proc/cpuinfo flags when torch lacks the probe.
    """
    probe = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    probe16 = getattr(torch.ops.mkldnn, "_is_mkldnn_fp16_supported", None)
    if probe is not None and probe16 is not None:
        try:
            fast = set()
            if probe():
                fast.add("bf16")
            if probe16():
                fast.add("fp16")
            return fast
        except RuntimeError:
            pass
    flags = cpu_flags()
    if not flags:
        return {"bf16", "fp16"}  # unknown CPU: do not warn
    fast = set()
    if {"avx512_bf16", "amx_bf16"} & flags:
        fast.add("bf16")
    if {"avx512_fp16", "amx_fp16"} & flags:
        fast.add("fp16")
    return fast


def check_device(device: str, dtype: str) -> str | None:
    """Raise DeviceError if `device` cannot run `dtype`; return a warning when it runs but slowly."""
    dt = parse_dtype(dtype)
    if device == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError("--device cuda: no CUDA device is available (torch.cuda.is_available() is False)")
        if dt == torch.bfloat16 and not torch.cuda.is_bf16_supported():
            raise DeviceError(f"{torch.cuda.get_device_name()} cannot run bfloat16; use --dtype fp16")
        return None
    try:
        a = torch.ones(4, 4, dtype=dt)
        (a @ a).sum().item()
    except RuntimeError as exc:
        raise DeviceError(f"this CPU build cannot run {dtype} matmuls: {str(exc).splitlines()[0]}") from None
    fast = _fast_lower_dtypes()
    if dt == torch.float16 and "fp16" not in fast:
        return ("this CPU has no AVX512-FP16/AMX-FP16: float16 will likely be slower than FP32 here "
                "(bf16 is the fast choice)")
    if dt == torch.bfloat16 and "bf16" not in fast:
        return "this CPU has no AVX512-BF16/AMX-BF16: bfloat16 may be slower than FP32 here"
    return None
