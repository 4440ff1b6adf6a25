"""Which CPU paths a test pass runs under, printed in CI's log (issue 47): the suite's bf16/fp16 numbers differ
between AMX, AVX512-BF16 and AVX2 kernels, so a red or green pass says little without them.

    python .ci/cpu_paths.py          one line: the CPU, ATen's capability, the oneDNN cap, the bf16/fp16 matmul
                                     kernels oneDNN picks (or that ATen runs them), the CPU's AMX/AVX512 flags
    python .ci/cpu_paths.py --amx    exit 0 when the CPU has AMX-BF16 (then .ci/run adds a pass capped below it)

The kernels are read from oneDNN's own verbose log of one 64x64 matmul per dtype, in the pass's environment
(ONEDNN_MAX_CPU_ISA, ATEN_CPU_CAPABILITY); a tiny model's 8-row matmuls may take ATen's path even on AMX.
"""
from __future__ import annotations

import os
import re
import sys
import tempfile


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            return next((set(line.split(":", 1)[1].split()) for line in fh if line.startswith("flags")), set())
    except OSError:
        return set()


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            return next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), "?")
    except OSError:
        return "?"


def matmul_kernels() -> dict[str, str]:
    """dtype -> the oneDNN matmul implementation that ran a 64x64 matmul of it, or "aten" when oneDNN did not (no
    bf16/fp16 support at the capped ISA: ATen's own kernels then). oneDNN's verbose log goes to the C stdout:
    caught from file descriptor 1."""
    import torch

    kernels = {}
    with tempfile.TemporaryFile(mode="w+") as log:
        for dtype in (torch.bfloat16, torch.float16):
            a = torch.randn(64, 64).to(dtype)
            sys.stdout.flush()
            saved = os.dup(1)
            os.dup2(log.fileno(), 1)
            try:
                with torch.no_grad(), torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
                    torch.nn.functional.linear(a, a)
            finally:
                os.dup2(saved, 1)
                os.close(saved)
            log.seek(0)
            found = re.findall(r"^onednn_verbose,.*,primitive,exec,cpu,matmul,([^,]+),", log.read(), flags=re.M)
            kernels[str(dtype).split(".")[1]] = found[-1] if found else "aten"
            log.seek(0)
            log.truncate()
    return kernels


def describe(kernels: dict[str, str]) -> str:
    """The one line: the CPU, ATen's capability, the oneDNN cap, the matmul kernels, AMX, the flags that matter."""
    import torch

    flags = cpu_flags()
    has = [f for f in ("amx_bf16", "amx_fp16", "avx512_bf16", "avx512_fp16", "avx512f", "avx2") if f in flags]
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "-")
    return (f"CPU paths: {cpu_name()}; torch {torch.__version__}; ATen capability "
            f"{torch.backends.cpu.get_cpu_capability()}; ONEDNN_MAX_CPU_ISA={cap}; "
            f"bf16 matmul {kernels.get('bfloat16', '?')}, fp16 matmul {kernels.get('float16', '?')}; "
            f"AMX {'yes' if 'amx_bf16' in flags else 'no'}; flags {' '.join(has) or '-'}")


def main() -> int:
    if sys.argv[1:] == ["--amx"]:
        return 0 if "amx_bf16" in cpu_flags() else 1
    print(describe(matmul_kernels()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
