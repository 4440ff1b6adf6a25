"""The converted checkpoint: parameters stored in the dtype their ops compute in, as safetensors.

A parameter is stored in the lower dtype only when every op call that uses it
cast it to that dtype under the plan (so running the loaded model gives the
same bits as running the FP32 model under the plan). Everything else, buffers
included, stays as it was. Loading never unpickles anything.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from .api import attach, check_plan_fits
from .engine import Decision, PrecisionEngine
from .errors import PlanMismatchError
from .fileio import atomic_write
from .fingerprint import sha256_file
from .plan import Plan

CHECKPOINT_NAME = "model.safetensors"


def lowered_parameters(model: nn.Module, plan: Plan, inputs: tuple) -> dict[str, torch.dtype]:
    """Parameter name -> lower dtype, for parameters every using op casts to the lower dtype."""
    by_id = {id(p): name for name, p in model.named_parameters(remove_duplicate=False)}
    seen: dict[str, set[torch.dtype | None]] = {}
    dtype = plan.torch_dtype

    def record(d: Decision, func: Any, args: tuple, kwargs: dict, out: Any, raw_args: tuple, raw_kwargs: dict) -> None:
        pairs = list(zip(raw_args, args)) + [(raw_kwargs[k], kwargs.get(k)) for k in raw_kwargs]
        for raw, cast in pairs:
            items = zip(raw, cast) if isinstance(raw, (list, tuple)) and isinstance(cast, (list, tuple)) else [(raw, cast)]
            for r, c in items:
                if isinstance(r, nn.Parameter) and id(r) in by_id:
                    seen.setdefault(by_id[id(r)], set()).add(c.dtype if isinstance(c, Tensor) and c is not r else None)

    with torch.no_grad(), PrecisionEngine(plan.policy(), dtype, root=model, recorder=record,
                                          module_overrides=plan.module_overrides(),
                                          instance_overrides=plan.instance_overrides()):
        model(*inputs)
    return {name: dtype for name, dtypes in seen.items() if dtypes == {dtype}}


def save_checkpoint(model: nn.Module, plan: Plan, inputs: tuple, path: str | Path) -> dict[str, Any]:
    """Write the converted state dict; returns {"lowered": n, "bytes": size, "fp32_bytes": size in FP32}."""
    lowered = lowered_parameters(model, plan, inputs)
    tensors: dict[str, Tensor] = {}
    fp32_bytes = 0
    for name, t in model.state_dict().items():
        t = t.detach()
        fp32_bytes += t.numel() * (4 if t.is_floating_point() else t.element_size())
        if name in lowered:
            t = t.to(lowered[name])
        tensors[name] = t.contiguous().clone().cpu()
    meta = {"format": "pt", "mpt_plan_dtype": plan.dtype, "mpt_lowered": json.dumps(sorted(lowered))}
    atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=meta))
    return {"lowered": len(lowered), "bytes": Path(path).stat().st_size, "fp32_bytes": fp32_bytes}


def load(model: nn.Module, directory: str | Path, *, engine: str = "auto") -> nn.Module:
    """Load `mpt tune`'s output into a freshly built FP32 model and attach its plan.

    The returned model runs under the plan with no `with` block. Raises
    PlanMismatchError when the plan was made for another model, when the
    checkpoint's sha256 differs from the one plan.yaml records, or when the
    checkpoint does not fit the model; the model is left untouched then.
    """
    directory = Path(directory)
    plan = Plan.load(directory / "plan.yaml")
    check_plan_fits(plan, model)
    ckpt = directory / CHECKPOINT_NAME
    if not ckpt.is_file():
        raise PlanMismatchError(f"no {CHECKPOINT_NAME} in {directory}")
    if plan.checkpoint_sha256 and sha256_file(ckpt) != plan.checkpoint_sha256:
        raise PlanMismatchError(f"{CHECKPOINT_NAME} does not match plan.yaml: its sha256 differs (corrupted or "
                                f"replaced) in {directory}")
    try:
        tensors = load_file(str(ckpt))
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise PlanMismatchError(f"{ckpt} is truncated or corrupted ({str(exc).splitlines()[0]})") from None
    state = model.state_dict()
    missing = sorted(set(state) - set(tensors))
    extra = sorted(set(tensors) - set(state))
    problems = []
    if missing:
        problems.append(f"missing from the checkpoint: {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")
    if extra:
        problems.append(f"not in the model: {', '.join(extra[:5])}{' ...' if len(extra) > 5 else ''}")
    for name in sorted(set(state) & set(tensors)):
        if tuple(state[name].shape) != tuple(tensors[name].shape):
            problems.append(f"{name}: shape {tuple(tensors[name].shape)} in the checkpoint, "
                            f"{tuple(state[name].shape)} in the model")
    modules = {name for name, _ in model.named_modules()}
    unknown = sorted({i.module for i in plan.fp32_instances if i.module not in modules and i.module != "-"})
    if unknown:
        problems.append(f"plan names modules the model lacks: {', '.join(unknown[:5])}")
    if problems:
        raise PlanMismatchError(f"{directory} does not match this model: " + "; ".join(problems))
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.data = tensors[name].to(p.device)
        for name, b in model.named_buffers():
            if name in tensors:
                b.copy_(tensors[name].to(b.device, b.dtype))
    return attach(model, plan, engine=engine)
