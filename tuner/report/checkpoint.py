"""The converted checkpoint: parameters stored in the dtype their ops compute in, as safetensors.

A parameter is stored in the lower dtype only when every ATen-level use of it
in the deployed forward (the plan attached as `tuner.load` attaches it) is a
cast to that dtype, so running the loaded model gives the same bits as running
the FP32 model under the plan, as the trials did. Everything else, buffers
included, stays as it was. Loading never unpickles anything.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor, nn

from tuner.core.errors import ConfigError, PlanMismatchError
from tuner.core.fileio import atomic_write
from tuner.core.fingerprint import sha256_file
from tuner.core.hf import SentenceEncoder, build_hf_model
from tuner.core.hf_config import hf_folder, is_hf_spec
from tuner.core.inputs import ModelInputs
from tuner.core.output_files import CHECKPOINT_NAME, PLAN_NAME, SHARDED_CHECKPOINT_NAME
from tuner.core.safetensors_write import FORMAT_DTYPES, Written, read_safetensors, stored_form, write_safetensors
from tuner.core.sharding import Sharding
from tuner.engine.attach import attach, check_plan_fits
from tuner.engine.kind import EngineKind
from tuner.measure.deployed import Holding, NotAsClaimed, Observation, stored_as, verify, weight_dtypes
from tuner.measure.recorded import PlanRecord, record_plan
from tuner.measure.shares import Shares
from tuner.policy.plan import Plan
from tuner.report.sharded import checkpoint_digest, load_shards, load_whole
from tuner.report.wrapped import Rename, checkpoint_shapes, find_rename


@dataclass(frozen=True)
class CheckpointInfo:
    """What `save_checkpoint` wrote: how many parameters it stored lowered, and its size against FP32."""

    lowered: int
    bytes: int
    fp32_bytes: int  # the same state dict with every floating-point tensor in FP32
    sha256: str | None = None  # the file's, hashed as it was written (not in report.json)

    def __post_init__(self) -> None:
        if min(self.lowered, self.bytes, self.fp32_bytes) < 0:
            raise ValueError(f"checkpoint info: counts must be >= 0, found {self}")

    def to_dict(self) -> dict[str, int]:
        """report.json's `checkpoint`."""
        return {"lowered": self.lowered, "bytes": self.bytes, "fp32_bytes": self.fp32_bytes}


@dataclass(frozen=True)
class PlanPass:
    """What the plan's forwards on the example inputs tell: the parameters to store lowered, the shares, and
    what the plan claims of each module's matmuls/convs (`claimed`; `tolerated`: its other ops' dtypes)."""

    lowered: dict[str, torch.dtype]
    shares: Shares
    claimed: Mapping[str, frozenset[torch.dtype]] = field(default_factory=dict)
    tolerated: Mapping[str, frozenset[torch.dtype]] = field(default_factory=dict)


def plan_pass(model: nn.Module, plan: Plan, inputs: ModelInputs | tuple, *,
              lowered: Mapping[str, torch.dtype] | None = None, recorded: PlanRecord | None = None) -> PlanPass:
    """Run `inputs` under the plan twice (no grad): once under mpt's engine, recording every op decision
    (`tuner.measure.recorded`: the report's call/FLOP shares, and the dtypes the plan claims), and once as
    deployed (`tuner.measure.deployed.observe`: the plan attached as `tuner.load` and the trials attach it).

    A parameter goes into `lowered` when every use of it in the deployed forward of the FP32 model is a cast
    to the lower dtype, or every one to the fallback dtype (`weight_dtypes`; FP32 where both read it): the
    trials ran with those stored lowered, as the checkpoint stores them; tied parameters (one tensor, several
    names) are lowered under all their names or none. `lowered`: what a deployed forward of this plan on the
    same model and inputs already observed (`TuneResult.lowered`): the second forward is then not run again.
    `recorded`: likewise the first (`TuneResult.recorded`, made by the tune on the same plan less the FP32
    overrides that change nothing, which change no op's dtype).
    """
    inputs = ModelInputs.of(inputs)
    record = record_plan(model, plan, inputs) if recorded is None else recorded
    found = weight_dtypes(model, plan, inputs) if lowered is None else dict(lowered)
    return PlanPass(found, record.shares, record.claimed, record.tolerated)


def verify_plan_pass(model: nn.Module, plan: Plan, inputs: ModelInputs | tuple, planned: PlanPass, *,
                     hold: Holding = stored_as, seen: Observation | None = None) -> Any:
    """The deployed forward's output (the model as the trials ran it), after checking that its matmuls/convs
    ran in the dtypes the plan claims and its share of them in the lower dtype is the report's
    (`tuner.measure.deployed.verify`: NotAsClaimed, an internal error naming the modules, when not). `hold`:
    how the lowered parameters are held (`deployed.Holding`). `seen`: the forward as a trial's evaluation
    observed it (`deployed.FirstCall`): checked with no forward of its own (the output is then None)."""
    return verify(model, plan, inputs, planned.lowered, planned.claimed, planned.tolerated, hold=hold,
                  share=planned.shares.flop_share,
                  by_dtype=planned.shares.dtype_shares() if planned.shares.by_dtype else None, seen=seen).output


def check_checkpoint(model: nn.Module, plan: Plan, inputs: ModelInputs | tuple, path: str | Path,
                     lowered: Mapping[str, torch.dtype]) -> None:
    """NotAsClaimed unless the checkpoint at `path` holds, bit for bit, the weights the trials ran with
    (`lowered` stored lowered, everything else as built), under the names `tuner.load` assigns them by.

    `tuner.load` makes each parameter the checkpoint's tensor and copies each buffer from it, so a model
    loaded from a checkpoint with exactly those bytes is the model the trials ran, and gives their
    outputs bit for bit. This reads the whole file: it checks a file found on disk, where `save_checkpoint`
    checks the one it is writing from what it wrote (`_check_written`, with no second read).
    """
    with stored_as(model, lowered):
        state, _ = stored_form(model.state_dict(), None)  # a complex128 tensor as its real view, as the file holds it
        _check_header(path, state, Path(path).stat().st_size)
        try:
            found = read_safetensors(path)
        except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
            raise _not_as_claimed(path, f"cannot be read ({str(exc).splitlines()[0]})") from None
        found, _ = stored_form(found, None)
        for name, t in found.items():
            if not torch.equal(_bytes(t), _bytes(state[name]).to(t.device)):  # (not on a tune's path: a copy each)
                raise _not_as_claimed(path, f"{name} has other values in the file than in the trials")


def _bytes(t: Tensor) -> Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def _not_as_claimed(path: str | Path, problem: str) -> NotAsClaimed:
    return NotAsClaimed(f"the model loaded from {Path(path).name} does not reproduce the tuned model's output bit "
                        f"for bit (an mpt bug): {problem}")


# mpt's writer's names (a dtype it does not know goes to safetensors.torch.save_file, whose name then differs)
_FILE_DTYPES = {name: dtype for dtype, name in FORMAT_DTYPES.items()}


def _check_header(path: str | Path, state: Mapping[str, Tensor], size: int) -> None:
    """NotAsClaimed unless the file's header (read from the disk, and parsed by safetensors as `tuner.load` will)
    lists every tensor of `state` (the model as the trials held it, in its stored form) and no other, each with
    its dtype and shape, their bytes laid end to end and ending where the file ends (`size` bytes)."""
    try:
        with safe_open(str(path), framework="pt") as fh:
            names = set(fh.keys())
        with open(path, "rb") as fh:
            length = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(length))
    except (SafetensorError, OSError, ValueError) as exc:
        raise _not_as_claimed(path, f"its header cannot be read ({str(exc).splitlines()[0]})") from None
    start = 8 + length
    header.pop("__metadata__", None)
    missing = sorted(set(state) - names)
    if missing:
        raise _not_as_claimed(path, f"{missing[0]} is missing")
    at = 0
    for name, info in sorted(header.items(), key=lambda item: tuple(item[1]["data_offsets"])):
        ran = state.get(name)
        begin, end = info["data_offsets"]
        if ran is None:
            raise _not_as_claimed(path, f"{name} is in the file, not in the model")
        if _FILE_DTYPES.get(info["dtype"]) != ran.dtype or tuple(info["shape"]) != tuple(ran.shape):
            raise _not_as_claimed(path, f"{name} is {info['dtype']} {tuple(info['shape'])} in the file, {ran.dtype} "
                                        f"{tuple(ran.shape)} in the trials")
        if begin != at or end - begin != ran.numel() * ran.element_size():
            raise _not_as_claimed(path, f"{name}'s bytes are at {begin}-{end} in the file, not where its "
                                        f"{ran.numel() * ran.element_size()} bytes belong (at {at})")
        at = end
    if start + at != size:
        raise _not_as_claimed(path, f"the file is {size} bytes, its header describes {start + at}")


def _check_written(model: nn.Module, path: str | Path, written: Written) -> None:
    """The check of a checkpoint just written, with no second read of it: the file on the disk is as long as
    what the writer handed it (`written.size`) and its header, read back, lays out exactly the model's tensors as
    the trials held them (names, dtypes, shapes: `_check_header`); their bytes are the writer's, taken from those
    very tensors, and hashed as they were written (`written.sha256`, which plan.yaml records and every
    `tuner.load` compares with the whole file: a byte changed on its way to the disk is refused there)."""
    size = Path(path).stat().st_size
    if size != written.size:
        raise _not_as_claimed(path, f"the file is {size} bytes, {written.size} were written")
    state, _ = stored_form(model.state_dict(), None)  # (no copies: views of the model's own tensors)
    _check_header(path, state, size)


def lowered_parameters(model: nn.Module, plan: Plan, inputs: ModelInputs | tuple) -> dict[str, torch.dtype]:
    """Parameter name -> lower dtype, for parameters every using op casts to the lower dtype."""
    return plan_pass(model, plan, inputs).lowered


def save_checkpoint(model: nn.Module, plan: Plan, inputs: ModelInputs | tuple, path: str | Path, *,
                    lowered: Mapping[str, torch.dtype] | None = None, check: bool = False,
                    hold: Holding = stored_as, grouped: bool = False) -> CheckpointInfo:
    """Write the converted state dict; returns how many parameters it lowered, its size and its sha256.

    No copy of the model is made: tensors are written from the model's own storage, the lowered ones packed in
    place as the trials held them (`deployed.stored_as`; only a non-contiguous tensor is copied; tensors off the
    CPU come to the host a group at a time: `tuner.core.safetensors_write`). The file is hashed as it is
    written. `lowered` is `plan_pass(...).lowered` when the caller already ran that pass; otherwise it runs
    here. `check`: then the file written is checked against the model as the trials held it (`_check_written`:
    its size and header, no second read), in the same packing of the weights (the lowered parameters packed
    once, not twice). `hold`: how the lowered parameters are held (`deployed.Holding`; the tune's keeper leaves
    them held for what comes next). `grouped`: every tensor comes to the host through the groups a GPU's take
    (`write_safetensors`).
    """
    if lowered is None:
        lowered = lowered_parameters(model, plan, inputs)
    fp32_bytes = sum(t.numel() * (4 if t.is_floating_point() else t.element_size())
                     for t in model.state_dict(keep_vars=True).values())
    with hold(model, lowered):  # the lowered parameters as the trials held them: bf16 packed in place
        # (a tied weight is written under each of its names from the same memory: the file holds it twice)
        tensors = {name: t.detach().contiguous() for name, t in model.state_dict().items()}
        written: list[Written] = []
        # one metadata key: safetensors writes its metadata map in a random order, and the checkpoint's bytes
        # (its sha256 in plan.yaml) must be the same for the same weights. Which tensors were lowered is their dtype.
        atomic_write(path, lambda tmp: written.append(_save(tensors, tmp, grouped=grouped)))
        tensors.clear()  # views of packed storages: gone before they are unpacked
        if check:
            _check_written(model, path, written[0])
    return CheckpointInfo(lowered=len(lowered), bytes=Path(path).stat().st_size, fp32_bytes=fp32_bytes,
                          sha256=written[0].sha256)


def _save(tensors: dict[str, Tensor], path: str | Path, *, grouped: bool = False) -> Written:
    return write_safetensors(tensors, path, metadata={"format": "pt"}, grouped=grouped)


def load(model: nn.Module | str, plan: str | Path | Plan | None = None, *,
         engine: str | EngineKind = EngineKind.AUTO) -> nn.Module:
    """Load `mpt tune`'s output into a freshly built FP32 model and attach its plan.

    `model` is the model as built for the tune, or `"hf:DIR"` for an `hf:` run: the folder is then loaded
    the way `mpt tune hf:DIR` loaded it (`tuner.core.hf`; a sentence-transformers folder as the
    SentenceTransformer, whose `encode` then runs under the plan). The model may also be the one the tuned model
    wrapped, or one that wraps it (a sentence-transformers run loads into the user's `SentenceTransformer`
    or `AutoModel.from_pretrained(DIR)`): the names are mapped (`tuner.report.wrapped`).
    `plan` is the output folder (its plan.yaml and model.safetensors), a plan
    .yaml file (the model.safetensors beside it is loaded when the plan records
    one: `mpt tune` writes that digest; a plan saved with `result.plan.save()`
    records none) or a `Plan` (attached to the model with its own weights).
    The returned model runs under the plan with no `with` block. Raises
    PlanMismatchError when the plan was made for another model, when the
    checkpoint's sha256 differs from the one plan.yaml records, or when the
    checkpoint does not fit the model; the model is left untouched then.
    ConfigError when `plan` is no folder, plan file or Plan, or `model` no module or hf: folder.

    Without `plan`, the model's own folder holds it: `"hf:SAVED"`, or a model loaded with
    `from_pretrained(SAVED)`, where SAVED is a folder `mpt tune --save-pretrained` wrote (its plan.yaml and
    model.safetensors are the run's: `tuner.report.pretrained`).
    """
    source = _own_folder(model) if plan is None else plan
    loaded, ckpt = _plan_and_checkpoint(source)
    model = _model(model)
    rename = _rename(model, ckpt)
    if rename is not None:
        loaded = rename.plan(loaded)
    else:
        check_plan_fits(loaded, model, folder=_plan_folder(source))
    if ckpt is not None:
        _load_checkpoint(model, loaded, ckpt, rename)
    return attach(model, loaded, engine=engine)


def _own_folder(model: nn.Module | str) -> Path:
    """The folder `load(model)` takes its plan from when given none: the `hf:` folder, or the one a
    transformers model was loaded from (`name_or_path`), when `--save-pretrained` wrote its plan.yaml there."""
    if isinstance(model, str) and is_hf_spec(model):
        folder = hf_folder(model)
    else:
        name = getattr(model, "name_or_path", None) if isinstance(model, nn.Module) else None
        folder = Path(name) if isinstance(name, str) and name else Path()
        if not name or not (folder / PLAN_NAME).is_file():
            raise ConfigError("tuner.load takes the run's output folder (or plan) as its second argument: "
                              "tuner.load(model, OUT); only a folder mpt tune --save-pretrained wrote carries its "
                              "own plan: tuner.load(\"hf:SAVED\")")
    if not (folder / PLAN_NAME).is_file():
        raise ConfigError(f"{folder} holds no {PLAN_NAME}: tuner.load(\"hf:DIR\") alone loads a folder mpt tune "
                          f"--save-pretrained wrote; for a tuned run give its output folder: "
                          f"tuner.load(\"hf:DIR\", OUT)")
    return folder


def _model(model: nn.Module | str) -> nn.Module:
    """The model `load` loads into: `model` itself, or the FP32 model of `hf:DIR` built as mpt tune builds it."""
    if isinstance(model, nn.Module):
        return model
    if isinstance(model, str) and is_hf_spec(model):
        built = build_hf_model(hf_folder(model))
        # mpt's wrapper only adapts the call for the search: the user gets the SentenceTransformer (encode())
        return built.model if isinstance(built, SentenceEncoder) else built
    shown = repr(model) if isinstance(model, str) else type(model).__name__
    raise ConfigError(f"tuner.load takes the model (an nn.Module) or \"hf:DIR\" (a Hugging Face folder), "
                      f"found {shown}")


def _rename(model: nn.Module, ckpt: Path | None) -> Rename | None:
    """How the checkpoint's names map onto `model`'s when the tune ran a wrapper of it (or it wraps what was
    tuned); None when they agree as they are (or nothing can be mapped: the usual checks then say why)."""
    if ckpt is None or not ckpt.is_file() or (ckpt.parent / SHARDED_CHECKPOINT_NAME).is_dir() \
            or Sharding.of(model).sharded:
        return None
    shapes = checkpoint_shapes(ckpt)
    return None if shapes is None else find_rename(model, shapes)


def _plan_folder(source: str | Path | Plan) -> Path | None:
    """The folder of the plan `load` was given (its recorded paths are relative to it); None for a Plan."""
    if isinstance(source, Plan):
        return None
    path = Path(source)
    return path if path.is_dir() else path.parent


def _plan_and_checkpoint(source: str | Path | Plan) -> tuple[Plan, Path | None]:
    """The plan `load` attaches and the checkpoint it loads first (None: the model's own weights)."""
    if isinstance(source, Plan):
        return source, None
    if not isinstance(source, (str, Path)):
        raise ConfigError(f"tuner.load takes an output folder, a plan .yaml file or a Plan, found "
                          f"{type(source).__name__}")
    path = Path(source)
    if path.is_dir():  # a training plan's folder has no checkpoint: the weights are the model's own (FP32)
        plan = Plan.load(path / PLAN_NAME)
        return plan, None if plan.for_training else path / CHECKPOINT_NAME
    if path.suffix not in (".yaml", ".yml") and not path.is_file():
        raise ConfigError(f"{path}: no such output folder or plan file")
    plan = Plan.load(path)
    return plan, path.parent / CHECKPOINT_NAME if plan.checkpoint_sha256 else None


def _load_checkpoint(model: nn.Module, plan: Plan, ckpt: Path, rename: Rename | None = None) -> None:
    """The checkpoint's weights into `model`, after checking it is the plan's and fits the model.

    A sharded run's folder (model.dcp/) loads into a sharded model through DCP, into an unsharded one from
    its consolidated model.safetensors when it has one, else through DCP too; an unsharded run's
    model.safetensors loads into a sharded model slice by slice (`tuner.report.sharded`). `rename`: the
    checkpoint's names as the model's (`find_rename`)."""
    directory = ckpt.parent
    sharded_run = (directory / SHARDED_CHECKPOINT_NAME).is_dir()
    if not ckpt.is_file() and not sharded_run:
        raise PlanMismatchError(f"no {CHECKPOINT_NAME} in {directory}")
    digest = checkpoint_digest(directory) if sharded_run else sha256_file(ckpt)
    if plan.checkpoint_sha256 and digest != plan.checkpoint_sha256:
        raise PlanMismatchError(f"{SHARDED_CHECKPOINT_NAME if sharded_run else CHECKPOINT_NAME} does not match "
                                f"{PLAN_NAME}: its sha256 differs (corrupted or replaced) in {directory}")
    if sharded_run and (Sharding.of(model).sharded or not ckpt.is_file()):
        _check_fits(model, plan, directory, dict(model.state_dict()))
        load_shards(model, directory)
        return
    try:
        tensors = read_safetensors(ckpt)
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise PlanMismatchError(f"{ckpt} is truncated or corrupted ({str(exc).splitlines()[0]})") from None
    if rename is not None:
        tensors = rename.tensors(tensors)
    _check_fits(model, plan, directory, tensors)
    if Sharding.of(model).sharded:
        load_whole(model, tensors)
        return
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.data = tensors[name].to(p.device)
        for name, b in model.named_buffers():
            if name in tensors:
                b.copy_(tensors[name].to(b.device, b.dtype))


def _check_fits(model: nn.Module, plan: Plan, directory: Path, tensors: Mapping[str, Tensor]) -> None:
    """PlanMismatchError unless the checkpoint's `tensors` (name -> tensor) and the plan's modules fit `model`."""
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
    unknown = sorted({i.module for i in (*plan.fp32_instances, *plan.fallback_instances)
                      if i.module not in modules and i.module != "-"})
    if unknown:
        problems.append(f"plan names modules the model lacks: {', '.join(unknown[:5])}")
    if problems:
        raise PlanMismatchError(f"{directory} does not match this model: " + "; ".join(problems))
