"""Does a committed plan still meet its target? The gate `mpt check` runs in CI.

`check_plan` rebuilds the model as it is now, evaluates its FP32 baseline
(twice or more, to see how noisy `evaluate` is), applies the plan (as
`tuner.load` would) and judges the metric against the target the plan's
tolerance gives against the new baseline. A miss smaller than the noise is
not a regression (`tuner.search.noise.Acceptance.holds`). Every evaluation
borrows the model from a `ModelKeeper`, as in `mpt tune`: one that changed
the model gets it rebuilt before the next, so such a change never passes for
noise. `junit_xml` turns an
outcome into the report CI systems read.
"""
from __future__ import annotations

import datetime as _dt
import math
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from tuner.core.devices import check_device
from tuner.core.errors import ConfigError, OutputError, PlanMismatchError, UserCodeError
from tuner.core.fileio import atomic_write_text
from tuner.core.inputs import ModelInputs
from tuner.core.loader import UserModel, call_forward, load_user_model
from tuner.core.output_files import CHECKPOINT_NAME, PLAN_NAME
from tuner.engine.attach import attach
from tuner.engine.function_mode import PrecisionEngine
from tuner.jobs.prepare import load_model
from tuner.measure.deployed import stored_as, weight_dtypes
from tuner.options.commands import CheckOptions
from tuner.options.shared import tolerance_problem
from tuner.options.tune import TuneOptions
from tuner.policy.plan import Plan
from tuner.report.checkpoint import load
from tuner.report.metric_text import fmt_metric, metric_digits
from tuner.search.noise import Acceptance, Baseline, measure_baseline
from tuner.search.repeatable import drawing_alike, replaying
from tuner.workspace.keeper import ModelKeeper
from tuner.workspace.modelref import resolve_model_ref, resolve_plan_path

__all__ = ["CheckResult", "check_plan", "plan_location", "junit_xml", "write_junit"]


@dataclass(frozen=True)
class CheckResult:
    """The outcome of re-evaluating a plan; `passed` says whether it still meets its target.

    `spread` is the range of the FP32 baseline's repeated evaluations (0 for a
    deterministic evaluate); `margin` the noise the verdict allowed: the larger
    of that spread and the noise recorded when the plan was tuned.
    """

    passed: bool
    metric: float
    baseline: float
    target: float
    tolerance: float
    absolute: bool
    lower_is_better: bool
    plan: str
    model: str
    dtype: str
    preset: str
    weights: str  # "fresh" (the model as built now) or "checkpoint" (DIR/model.safetensors)
    spread: float = 0.0
    margin: float = 0.0
    tuned_baseline: float | None = None
    tuned_metric: float | None = None
    seconds: float = 0.0
    warnings: tuple[str, ...] = ()
    plan_tolerance: float | None = None  # the plan's, when the caller gave another (`tolerance` is what was used)

    @property
    def status(self) -> str:
        return "pass" if self.passed else "fail"

    def verdict(self) -> str:
        """One line: `check: PASS 0.9852 >= target 0.9753 (baseline 0.9852, tolerance 1%)`."""
        digits = metric_digits(self.baseline, self.target, [self.metric])
        m, t, b = (fmt_metric(v, digits) for v in (self.metric, self.target, self.baseline))
        clearance = self.target - self.metric if self.lower_is_better else self.metric - self.target
        if not math.isfinite(self.metric):
            op = "vs"
        elif clearance >= 0:
            op = "<=" if self.lower_is_better else ">="
        elif self.passed:
            op = "within noise of"
        else:
            op = ">" if self.lower_is_better else "<"
        tol = self._tolerance_text(self.tolerance)
        if self.plan_tolerance is not None and self.plan_tolerance != self.tolerance:  # say which one judged
            tol += f" given, the plan's {self._tolerance_text(self.plan_tolerance)}"
        noise = f", noise range {self.margin:.{digits}g}" if self.margin > 0 else ""  # max - min: not a ±
        return f"check: {self.status.upper()} {m} {op} target {t} (baseline {b}, tolerance {tol}{noise})"

    def _tolerance_text(self, tolerance: float) -> str:
        return f"{tolerance:g} absolute" if self.absolute else f"{tolerance * 100:.4g}%"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["warnings"] = list(self.warnings)
        data["status"] = self.status
        data["verdict"] = self.verdict()
        for k in ("metric", "baseline", "target", "tuned_baseline", "tuned_metric"):
            v = data[k]
            if isinstance(v, float) and not math.isfinite(v):
                data[k] = str(v)  # JSON has no NaN/inf
        return data


def plan_location(plan: str | Path) -> tuple[Path, Path]:
    """(folder, plan file) for a `mpt tune` output folder or a plan .yaml file."""
    path = Path(plan)
    if path.is_file() and path.suffix in (".yaml", ".yml"):
        return path.parent, path
    if not path.exists():
        raise ConfigError(f"plan folder not found: {plan} (the output folder of `mpt tune`)")
    if not path.is_dir():
        raise ConfigError(f"{plan} is not a folder or a plan .yaml file")
    plan_file = path / PLAN_NAME
    if not plan_file.is_file():
        raise ConfigError(f"no {PLAN_NAME} in {plan}; run `mpt tune` with this output folder first")
    return path, plan_file


def _check_modules(model: Any, plan: Plan) -> None:
    """The plan's module paths must exist in the model (globs excepted)."""
    names = {name for name, _ in model.named_modules()}
    missing = sorted({i.module for i in (*plan.fp32_instances, *plan.fallback_instances)
                      if i.module not in names and i.module != "-"})
    missing += sorted({p for p, _ in plan.modules if not any(c in p for c in "*?[") and p not in names})
    if missing:
        shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise PlanMismatchError(f"the plan does not match this model: it names modules the model lacks: {shown} "
                                "(was the model changed? re-run mpt tune)")


def _unused_instances(model: Any, plan: Plan, inputs: ModelInputs) -> list[str]:
    """Plan instances the model no longer calls on example_inputs (a sign the plan is stale). The forward runs the
    plan as it is, overrides included: under the preset alone a call the plan keeps FP32 may fail (an op
    torch.autocast cannot run low in the model's own forward)."""
    seen: set[tuple[str, str, int]] = set()

    def record(d: Any, *rest: Any) -> None:
        seen.add((d.module, d.op, d.index))

    with torch.no_grad(), PrecisionEngine(plan.policy(), plan.torch_dtype, root=model, recorder=record,
                                          module_overrides=plan.module_overrides(),
                                          instance_overrides=plan.instance_overrides(), as_deployed=True):
        call_forward(model, inputs, what="forward on example_inputs")
    return [i.label() for i in (*plan.fp32_instances, *plan.fallback_instances) if i.key() not in seen]


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _user_specs(plan: Plan, plan_file: Path, options: CheckOptions) -> tuple[str, dict[str, str | None]]:
    """The model file and function specs: the caller's, else those the plan records (relative to its folder)."""
    given = options.specs()
    if plan.model is None:
        if options.model is None:
            raise ConfigError(f"model: {plan_file} does not record which model it was tuned for; give the model file",
                              fields=("model",))
        return options.model, given
    unused: dict[str, Any] = {role: None for role, spec in given.items() if spec is not None}  # the caller's win
    model_file, *recorded = resolve_model_ref(replace(plan.model, **unused), plan_file.parent, file=options.model)
    return model_file, {role: spec if spec is not None else rec
                        for (role, spec), rec in zip(given.items(), recorded, strict=False)}


def _check_model(model_file: str, specs: dict[str, str | None], plan: Plan, plan_file: Path,
                 options: CheckOptions) -> UserModel:
    """The model to check, its evaluate the built-in metric the plan records (against the FP32 outputs of the
    model as it is now, computed again), unless the caller named an evaluate."""
    ref = plan.model
    if ref is None or ref.metric is None or options.eval is not None:
        return load_user_model(model_file, model=specs["build"], eval=specs["eval"], inputs=specs["inputs"])
    fidelity = {"metric": ref.metric, "output": ref.output, "batch_size": ref.batch_size,
                "data": resolve_plan_path(ref.data, plan_file.parent),
                "tokenizer": resolve_plan_path(ref.tokenizer, plan_file.parent)}
    return load_model(model_file, specs=specs, fidelity=fidelity, device=options.device)


def _tolerance(options: CheckOptions, metrics: dict[str, Any], plan_file: Path) -> float:
    """The caller's tolerance, else the plan's; a relative one must be below 1 (the rule `mpt tune` obeys)."""
    tolerance = options.tolerance if options.tolerance is not None else _number(metrics.get("tolerance"))
    if tolerance is None:
        raise ConfigError(f"tolerance: {plan_file} records no tolerance (metrics.tolerance); give one",
                          fields=("tolerance",))
    problem = tolerance_problem(tolerance, bool(metrics.get("absolute", False)))
    if problem:
        raise ConfigError(problem, fields=("tolerance",))
    return tolerance


def _fp32_baseline(user: UserModel, keeper: ModelKeeper, plan: Plan, folder: Path) -> Baseline:
    """The FP32 baseline of the model as it is built now (which must still fit the plan).

    Every evaluation borrows the model from `keeper`, as in `mpt tune`: an `evaluate` that changes the
    model (trains it, folds its layers) gets it rebuilt before the next one, so its change cannot pass
    for noise (and widen the margin the verdict allows)."""
    if plan.model is not None:
        plan.model.check_structure(keeper.model, what=f"the plan in {folder}", folder=folder)
    _check_modules(keeper.model, plan)

    def evaluate_fp32() -> float:
        with keeper.borrowed("evaluate") as model:
            value = user.evaluate(model)
        if not math.isfinite(value):
            raise UserCodeError(f"evaluate returned {value} for the FP32 model; the baseline must be finite")
        return value

    return measure_baseline(evaluate_fp32)


def _planned_metric(user: UserModel, keeper: ModelKeeper, plan: Plan, folder: Path, plan_file: Path,
                    options: CheckOptions) -> tuple[float, list[str]]:
    """The metric of the model under the plan (or with the stored checkpoint), and warnings about a stale plan.

    The model is the keeper's (as built, whatever the baseline's evaluations did to theirs), with the plan
    applied the way `tuner.load` would."""
    warnings: list[str] = []
    example = user.example_inputs() if user.inputs_fn is not None else None
    if example is not None:
        with keeper.borrowed() as model:
            unused = _unused_instances(model, plan, example.to(options.device))
        if unused:
            warnings.append(f"the model no longer calls {len(unused)} of the plan's FP32 op instance(s) on "
                            f"example_inputs ({', '.join(unused[:3])}{' ...' if len(unused) > 3 else ''}); "
                            "the plan may be stale")
    if options.checkpoint and plan.for_training:
        raise ConfigError(f"checkpoint: a training plan has no {CHECKPOINT_NAME} (its weights are the model's own, "
                          "FP32); check it without --checkpoint", fields=("checkpoint",))
    if options.checkpoint and plan_file.name != PLAN_NAME:
        raise ConfigError(f"checkpoint: needs the tune output folder (with {PLAN_NAME} and {CHECKPOINT_NAME})",
                          fields=("checkpoint",))
    with keeper.borrowed("evaluate", last=True) as tuned:  # the last evaluation: the model need not be restored after
        if options.checkpoint:
            load(tuned, folder)
            return user.evaluate(tuned), warnings
        # the model as tuner.load builds it from the plan (and as the tune's trials ran it): the parameters the
        # checkpoint stores lowered held lowered
        lowered = weight_dtypes(tuned, plan, example.to(options.device)) \
            if example is not None and not plan.for_training else {}  # a training plan's weights stay FP32
        with stored_as(tuned, lowered):
            attach(tuned, plan)
            return user.evaluate(tuned), warnings


def check_plan(options: CheckOptions | str | Path) -> CheckResult:
    """Re-evaluate the plan in `options.out` (a `mpt tune` output folder, or a plan.yaml) on the model as it is now.

    A path stands for `CheckOptions(out=path)`. The model file
    (MODEL.py[:build_fn]) and the build/eval/inputs specs default to those
    the plan records (`Plan.model`); a plan that records none needs
    `model`. `tolerance` defaults to the plan's own (a config file's is the tune's: `mpt check --config`
    ignores it, tuner.options.commands.COMMAND_LINE_ONLY); the verdict says when another one judged.

    Raises ConfigError (bad folder, plan or options), PlanMismatchError (the
    plan or checkpoint was made for another model), DeviceError or UserCodeError.
    """
    if not isinstance(options, CheckOptions):
        options = CheckOptions(out=str(options))
    t0 = time.monotonic()
    folder, plan_file = plan_location(options.out or "")
    loaded = Plan.load(plan_file)
    model_file, specs = _user_specs(loaded, plan_file, options)
    metrics = dict(loaded.metrics or {})
    tolerance = _tolerance(options, metrics, plan_file)
    search = TuneOptions(dtype=loaded.dtype, preset=loaded.preset, tolerance=tolerance,
                         absolute=bool(metrics.get("absolute", False)),
                         lower_is_better=bool(metrics.get("lower_is_better", False)), device=options.device)
    check_device(options.device, loaded.dtype)
    user = _check_model(model_file, specs, loaded, plan_file, options)
    if loaded.for_training and user.eval_fn is not None:  # as the tune's trials ran: the same model and draws
        user = replace(user, eval_fn=drawing_alike(user.eval_fn))
    keeper = ModelKeeper(user.build, options.device,
                         before_build=replaying(user.build) if loaded.for_training else None)
    baseline = _fp32_baseline(user, keeper, loaded, folder)
    target = search.target(baseline.value)
    margin = max(_number(metrics.get("noise")) or 0.0, baseline.spread)
    metric, warnings = _planned_metric(user, keeper, loaded, folder, plan_file, options)
    return CheckResult(
        passed=Acceptance(target, margin, search.lower_is_better).holds(metric), metric=metric,
        baseline=baseline.value, target=target, tolerance=float(tolerance), absolute=search.absolute,
        lower_is_better=search.lower_is_better, plan=str(plan_file), model=str(user.path), dtype=loaded.dtype,
        preset=loaded.preset, weights="checkpoint" if options.checkpoint else "fresh", spread=baseline.spread,
        margin=margin, tuned_baseline=_number(metrics.get("baseline")), tuned_metric=_number(metrics.get("tuned")),
        seconds=time.monotonic() - t0, warnings=tuple(warnings), plan_tolerance=_number(metrics.get("tolerance")))


def junit_xml(name: str, *, seconds: float, failure: str | None = None, error: str | None = None,
              error_type: str = "Error", details: str = "", output: str = "") -> str:
    """A JUnit XML document with one testsuite holding one testcase (a <failure> or <error> when not passing)."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    counts = {"tests": "1", "failures": "1" if failure else "0", "errors": "1" if error else "0",
              "skipped": "0", "time": f"{seconds:.3f}"}
    root = ET.Element("testsuites", {"name": "mpt check", **{k: v for k, v in counts.items() if k != "skipped"}})
    suite = ET.SubElement(root, "testsuite", {"name": "mpt check", **counts, "timestamp": stamp})
    case = ET.SubElement(suite, "testcase", {"classname": "mpt.check", "name": name, "time": f"{seconds:.3f}"})
    if failure:
        ET.SubElement(case, "failure", {"message": failure, "type": "TargetNotMet"}).text = details or failure
    if error:
        ET.SubElement(case, "error", {"message": error, "type": error_type}).text = details or error
    if output:
        ET.SubElement(case, "system-out").text = output
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def write_junit(path: str | Path, text: str) -> None:
    """Write a JUnit report atomically, creating its folder."""
    target = Path(path)
    if target.is_dir():
        raise ConfigError(f"junit: {path} is a folder; give a file name such as {target / 'mpt-check.xml'}",
                          fields=("junit",))
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(target, text)
    except OSError as exc:
        raise OutputError(f"cannot write the JUnit report {path}: {exc.strerror or exc}") from None
