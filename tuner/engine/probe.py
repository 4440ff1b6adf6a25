"""Search and deployment agree: does the plan also run the way `tuner.load` will run it?

The search evaluates plans under mpt's own engine, but `tuner.load` /
`tuner.attach(model, plan)` with a torch-* preset runs the model under
`torch.autocast` and only the modules owning overrides under the engine. The
two are numerically the same, yet torch.autocast may not be able to run an
op at all where the engine can: on a CPU without AVX512-BF16, oneDNN cannot
build a bf16 `nn.LSTM` ("could not create a primitive descriptor..."). A plan
approved by the search would then crash once loaded.

`autocast_fixes` runs the model once the way `tuner.load` would, finds the
innermost module that was running when it raised, keeps that module in FP32
(a module override, which puts it under the engine) and tries again. A failure
in the model's own forward, outside any submodule, keeps the op call that
raised in FP32 instead (an FP32 instance of module ""), which makes the root an
FP32 island: its own ops FP32, its submodules still low.
"""
from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from tuner.core.errors import DeployError, UserCodeError, exc_line
from tuner.core.inputs import ModelInputs
from tuner.core.loader import call_forward
from tuner.core.memory import find_out_of_memory, out_of_memory
from tuner.engine.attach import attach, detach, native_device
from tuner.engine.function_mode import PrecisionEngine
from tuner.policy.plan import OpInstance, Plan

ROOT = "(root)"


@dataclass(frozen=True)
class AutocastFixes:
    """What must stay FP32 for a plan to run under `tuner.load` here (`autocast_fixes`).

    `modules`: submodules kept FP32 whole (module overrides), path -> one-line reason. `root_calls`: op calls
    of the model's own forward (module "") that torch.autocast cannot run; as FP32 instances of a plan they
    make the root an FP32 island (`tuner.engine.native`): its own ops run FP32 under
    `torch.autocast(enabled=False)` while its submodules stay low, the narrowest region the native path has
    for code outside any submodule. `root_reason` says why (empty without root calls).
    """

    modules: dict[str, str] = field(default_factory=dict)
    root_calls: tuple[OpInstance, ...] = ()
    root_reason: str = ""

    def apply(self, plan: Plan) -> Plan:
        """`plan` with these modules and root calls kept FP32."""
        plan = with_fp32_modules(plan, self.modules)
        known = set(plan.fp32_instances)
        added = tuple(c for c in self.root_calls if c not in known)
        if not added:
            return plan
        return dataclasses.replace(plan, fp32_instances=plan.fp32_instances + added,
                                   fallback_instances=tuple(i for i in plan.fallback_instances if i not in added))


def autocast_failures(model: nn.Module, inputs: ModelInputs | tuple, plan: Plan, *,
                      max_modules: int = 8) -> dict[str, str]:
    """Submodules that must stay FP32 for `plan` to run under `tuner.load`: {path: one-line reason}.

    `autocast_fixes`' modules; a plan that also needs op calls of the model's own forward kept FP32 raises
    DeployError here (kept so for callers that only add module overrides: `autocast_fixes` gives both).
    """
    fixes = autocast_fixes(model, inputs, plan, max_modules=max_modules)
    if fixes.root_calls:
        raise DeployError(f"the tuned plan cannot run on this machine once loaded (tuner.load runs it under "
                          f"torch.autocast): {fixes.root_reason}, in the model's own forward, outside any "
                          "submodule (autocast_fixes keeps that call FP32)", modules=fixes.modules)
    return fixes.modules


def autocast_fixes(model: nn.Module, inputs: ModelInputs | tuple, plan: Plan, *,
                   max_modules: int = 8) -> AutocastFixes:
    """What must stay FP32 for `plan` to run under `tuner.load` (AutocastFixes).

    Nothing when the plan runs as it is, or when its policy has no native
    torch.autocast path here (then `tuner.load` runs mpt's engine, which the
    search already ran). Each failing forward adds the innermost running
    module as `{path: "fp32"}` to the plan's module overrides and runs again,
    up to `max_modules` modules; a failure in the model's own forward (outside
    any submodule) adds the op call that raised as an FP32 instance, which makes
    the root an FP32 island. Raises DeployError (exit code 2 in the CLI) when
    the failure is inside a module already kept in FP32, in the root's own code
    but in no op call mpt's engine names (or still there once the root is an
    island), or still there after `max_modules`; its `modules` holds what was
    found before. The model is detached afterwards (an earlier `tuner.attach`
    on it is undone).
    """
    if native_device(plan.policy()) is None:
        return AutocastFixes()
    inputs = ModelInputs.of(inputs)
    fixes = AutocastFixes()
    while True:
        current = fixes.apply(plan)
        failure = _first_failure(model, inputs, current)
        if failure is None:
            return fixes
        path, exc = failure
        if not fixes.modules and not fixes.root_calls:
            _check_fp32_runs(model, inputs)
        reason = exc_line(exc, limit=200)
        call = _root_call(model, inputs, current) if path == ROOT and not fixes.root_calls else None
        problem = "" if call is not None else _unfixable(path, fixes, max_modules)
        if problem:
            raise DeployError(f"the tuned plan cannot run on this machine once loaded (tuner.load runs it under "
                              f"torch.autocast): {reason}, {problem}", modules=fixes.modules) from exc
        if call is not None:
            fixes = dataclasses.replace(fixes, root_calls=(call,), root_reason=reason)
        else:
            fixes = dataclasses.replace(fixes, modules={**fixes.modules, path: reason})


def _root_call(model: nn.Module, inputs: ModelInputs, plan: Plan) -> OpInstance | None:
    """The op call of the model's own forward that fails under `tuner.attach(model, plan)`, named as mpt's engine
    and a plan name it; None when the failure is in no op call of the root's (its own code raised).

    The forward runs again as `tuner.load` runs it, with mpt's engine on top in dry-run mode: it names every
    call (module, op, index) and changes none, so the same call fails and the engine says which it was."""
    engine = PrecisionEngine(plan.policy(), plan.torch_dtype, root=model, dry_run=True, recorder=_ignore)
    try:
        attach(model, plan)
        try:
            with torch.no_grad(), engine:
                inputs.call(model)
        except Exception as exc:  # noqa: BLE001 - only its call is wanted: the caller reports the first failure
            key = engine.failed_call(exc)
            return OpInstance(*key) if key is not None and key[0] == "" else None
        return None
    finally:
        detach(model)


def _ignore(*args: Any) -> None:
    """A recorder that keeps nothing: with one, the engine counts calls, which `failed_call` needs."""


def _check_fp32_runs(model: nn.Module, inputs: ModelInputs) -> None:
    """UserCodeError (exit 4) when the model's plain FP32 forward fails on `inputs` too: then the inputs
    (example_inputs() of the wrong shape or dtype, made under a leaked default dtype) or the forward are at
    fault, not the plan or this machine."""
    try:
        with torch.no_grad():
            call_forward(model, inputs)
    except UserCodeError as exc:
        raise UserCodeError(f"{exc.args[0]}; it fails in FP32 too, without any plan: check that "
                            "example_inputs() returns what forward takes (shapes, dtypes, device)",
                            original=exc.original) from exc


def with_fp32_modules(plan: Plan, paths: Iterable[str]) -> Plan:
    """`plan` with each of `paths` added as a module override to FP32 (what `autocast_failures` found)."""
    known = {pattern for pattern, _ in plan.modules}
    added = tuple((p, "fp32") for p in paths if p not in known)
    return dataclasses.replace(plan, modules=plan.modules + added)


def _unfixable(path: str, fixes: AutocastFixes, max_modules: int) -> str:
    """Why keeping `path` in FP32 cannot help ("" when it can)."""
    found = fixes.modules
    if path == ROOT and fixes.root_calls:
        return "in the model's own forward, which already runs in FP32 (an FP32 island) under torch.autocast"
    if path == ROOT:
        return "in the model's own forward, outside any submodule and in no op call mpt can keep in FP32"
    inside = next((f for f in found if path == f or path.startswith(f + ".")), None)
    if inside is not None:
        return f"in {path}, which already runs in FP32 under mpt's engine ({inside} is kept in FP32)"
    if len(found) >= max_modules:
        return f"in {path}, still failing after keeping {len(found)} modules in FP32 ({', '.join(found)})"
    return ""


def _first_failure(model: nn.Module, inputs: ModelInputs, plan: Plan) -> tuple[str, Exception] | None:
    """None when one forward under `tuner.attach(model, plan)` runs; else (innermost module path, exception)."""
    stack = _ModuleStack(model)
    try:
        attach(model, plan)  # a plan for another model raises PlanMismatchError here, as tuner.load would
        try:
            with torch.no_grad():
                inputs.call(model)
        except Exception as exc:
            if find_out_of_memory(exc) is not None:  # the machine's limit, not the plan's: no module to blame
                raise out_of_memory(exc, "checking that the plan runs under torch.autocast") from exc
            return stack.culprit(exc), exc
        return None
    finally:
        detach(model)
        stack.remove()


class _ModuleStack:
    """Forward pre-hooks push a module's path, forward hooks (always_call) pop it.

    The first pop that happens while an exception unwinds is the innermost
    module that was running when it was raised; it is recorded against that
    exception object, so an exception a module raised and caught itself does
    not blame it for a later one.
    """

    def __init__(self, model: nn.Module) -> None:
        self.stack: list[str] = []
        self.blamed: dict[int, tuple[BaseException, str]] = {}
        self.handles = []
        for path, module in model.named_modules():
            if path:
                self.handles.append(module.register_forward_pre_hook(self._push(path)))
                self.handles.append(module.register_forward_hook(self._pop(path), always_call=True))

    def _push(self, path: str) -> Any:
        def hook(module: nn.Module, args: Any) -> None:
            self.stack.append(path)
        return hook

    def _pop(self, path: str) -> Any:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            exc = sys.exc_info()[1]
            if output is None and exc is not None and self.stack:
                self.blamed.setdefault(id(exc), (exc, self.stack[-1]))
            if self.stack and self.stack[-1] == path:
                self.stack.pop()
        return hook

    def culprit(self, exc: BaseException) -> str:
        """The module blamed for `exc` or for an exception it was raised from; ROOT when none."""
        seen: set[int] = set()
        current: BaseException | None = exc
        while current is not None and id(current) not in seen:
            seen.add(id(current))
            hit = self.blamed.get(id(current))
            if hit is not None and hit[0] is current:
                return hit[1]
            current = current.__cause__ or current.__context__
        return ROOT

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
