"""The converted checkpoint: parameters stored in the dtype their ops compute in, as safetensors.

A parameter is stored in the lower dtype only when every op call that uses it
cast it to that dtype under the plan (so running the loaded model gives the
same bits as running the FP32 model under the plan). Everything else, buffers
included, stays as it was. Loading never unpickles anything.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from tuner.core.errors import PlanMismatchError
from tuner.core.fileio import atomic_write
from tuner.core.fingerprint import sha256_file
from tuner.core.inputs import ModelInputs
from tuner.core.output_files import CHECKPOINT_NAME, PLAN_NAME
from tuner.engine.attach import attach, check_plan_fits
from tuner.engine.function_mode import Decision, PrecisionEngine
from tuner.engine.kind import EngineKind
from tuner.measure.shares import ShareCounter, Shares
from tuner.policy.plan import Plan


@dataclass(frozen=True)
class CheckpointInfo:
    """What `save_checkpoint` wrote: how many parameters it stored lowered, and its size against FP32."""

    lowered: int
    bytes: int
    fp32_bytes: int  # the same state dict with every floating-point tensor in FP32

    def __post_init__(self) -> None:
        if min(self.lowered, self.bytes, self.fp32_bytes) < 0:
            raise ValueError(f"checkpoint info: counts must be >= 0, found {self}")

    def to_dict(self) -> dict[str, int]:
        """report.json's `checkpoint`."""
        return {"lowered": self.lowered, "bytes": self.bytes, "fp32_bytes": self.fp32_bytes}


@dataclass(frozen=True)
class PlanPass:
    """What one recorded forward under the plan tells: the parameters to store lowered, and the shares."""

    lowered: dict[str, torch.dtype]
    shares: Shares


def plan_pass(model: nn.Module, plan: Plan, inputs: ModelInputs | tuple) -> PlanPass:
    """Run `inputs` once under the plan (mpt's engine, no grad), recording every op decision.

    A parameter goes into `lowered` when every op call that uses it cast it to
    the lower dtype; tied parameters (one tensor, several names) are lowered
    under all their names or none. The same decisions give the report's
    call/FLOP shares, so writing the outputs needs no second forward pass.
    """
    inputs = ModelInputs.of(inputs)
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    seen: dict[int, set[torch.dtype | None]] = {}
    counter = ShareCounter()
    dtype = plan.torch_dtype

    def record(d: Decision, func: Any, args: tuple, kwargs: dict, out: Any, raw_args: tuple, raw_kwargs: dict) -> None:
        counter.add(d, args, kwargs, out)
        pairs = list(zip(raw_args, args, strict=False)) + [(raw_kwargs[k], kwargs.get(k)) for k in raw_kwargs]
        for raw, cast in pairs:
            nested = isinstance(raw, (list, tuple)) and isinstance(cast, (list, tuple))
            items = zip(raw, cast, strict=False) if nested else [(raw, cast)]
            for r, c in items:
                if isinstance(r, nn.Parameter) and id(r) in names:
                    seen.setdefault(id(r), set()).add(c.dtype if isinstance(c, Tensor) and c is not r else None)

    with torch.no_grad(), PrecisionEngine(plan.policy(), dtype, root=model, recorder=record,
                                          module_overrides=plan.module_overrides(),
                                          instance_overrides=plan.instance_overrides()):
        inputs.call(model)
    lowered = {name: dtype for key, dtypes in seen.items() if dtypes == {dtype} for name in names[key]}
    return PlanPass(lowered, counter.shares)


def lowered_parameters(model: nn.Module, plan: Plan, inputs: ModelInputs | tuple) -> dict[str, torch.dtype]:
    """Parameter name -> lower dtype, for parameters every using op casts to the lower dtype."""
    return plan_pass(model, plan, inputs).lowered


def save_checkpoint(model: nn.Module, plan: Plan, inputs: ModelInputs | tuple, path: str | Path, *,
                    lowered: Mapping[str, torch.dtype] | None = None) -> CheckpointInfo:
    """Write the converted state dict; returns how many parameters it lowered and its size.

    No copy of the model is made: FP32 tensors are written from the model's
    own storage (only a non-contiguous tensor, a second name of a tied weight
    or a tensor off the CPU is copied: safetensors writes from host memory),
    and only lowered parameters get new, smaller tensors. `lowered` is `plan_pass(...).lowered` when the caller
    already ran that pass; otherwise it runs here.
    """
    if lowered is None:
        lowered = lowered_parameters(model, plan, inputs)
    tensors: dict[str, Tensor] = {}
    fp32_bytes = 0
    spans: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for name, t in model.state_dict().items():
        t = t.detach()
        fp32_bytes += t.numel() * (4 if t.is_floating_point() else t.element_size())
        if name in lowered:
            t = t.to(lowered[name])
        tensors[name] = _unaliased(t.contiguous().cpu(), spans)
    meta = {"format": "pt", "mpt_plan_dtype": plan.dtype, "mpt_lowered": json.dumps(sorted(lowered))}
    atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=meta))
    return CheckpointInfo(lowered=len(lowered), bytes=Path(path).stat().st_size, fp32_bytes=fp32_bytes)


def _unaliased(t: Tensor, spans: dict[tuple[str, int], list[tuple[int, int]]]) -> Tensor:
    """`t`, or a copy of it when its bytes overlap a tensor already kept (tied weights).

    safetensors refuses tensors that share memory; a state dict with tied
    weights (an embedding reused as the output layer) lists one tensor under
    two names. Only the second name's tensor is copied; both names are
    written, so the checkpoint still loads into a model by name.
    """
    if t.numel() == 0:
        return t
    key = (str(t.device), t.untyped_storage().data_ptr())
    start = t.data_ptr()
    end = start + t.numel() * t.element_size()
    taken = spans.setdefault(key, [])
    if any(start < e and s < end for s, e in taken):
        t = t.clone()
        key = (str(t.device), t.untyped_storage().data_ptr())
        start, end = t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()
        taken = spans.setdefault(key, [])
    taken.append((start, end))
    return t


def load(model: nn.Module, directory: str | Path, *, engine: str | EngineKind = EngineKind.AUTO) -> nn.Module:
    """Load `mpt tune`'s output into a freshly built FP32 model and attach its plan.

    The returned model runs under the plan with no `with` block. Raises
    PlanMismatchError when the plan was made for another model, when the
    checkpoint's sha256 differs from the one plan.yaml records, or when the
    checkpoint does not fit the model; the model is left untouched then.
    """
    directory = Path(directory)
    plan = Plan.load(directory / PLAN_NAME)
    check_plan_fits(plan, model)
    ckpt = directory / CHECKPOINT_NAME
    if not ckpt.is_file():
        raise PlanMismatchError(f"no {CHECKPOINT_NAME} in {directory}")
    if plan.checkpoint_sha256 and sha256_file(ckpt) != plan.checkpoint_sha256:
        raise PlanMismatchError(f"{CHECKPOINT_NAME} does not match {PLAN_NAME}: its sha256 differs (corrupted or "
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
