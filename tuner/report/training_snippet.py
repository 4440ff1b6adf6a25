"""report.md's section on running the plan beyond `tuner.load`: the plan around each forward (`tuner.autocast`),
the op-type list files as HMP (`tuner.convert`/`hmp.convert`) and Gaudi autocast take them, and, where the lists
cannot express the plan, which op types they keep FP32 everywhere and the share that costs (measured, not
evaluated).

A plan tuned for training gets a training loop per way, each one training step as every trial ran it
(`tuner.engine.attach`): the model's forward under the plan, what it returns handed back in FP32, and the loss,
the backward and the optimizer step outside the plan, in FP32, as the user's code writes them; the loss scaled
as the trials scaled it (`tuner.LossScaler`), on the device the tune ran on. So the same run gives the same
metric under `tuner.load`, `tuner.autocast` and the list files (where they express the plan as it is). HMP and
Gaudi autocast run bf16 only: an fp16 plan's list files are for `tuner.convert(..., dtype="fp16")`, and the
section says so instead of giving their recipes.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tuner.core.output_files import FP32_OPS_NAME, HMP_FP32_NAME, LOWER_OPS_NAME, hmp_lower_name
from tuner.engine.scaler import ScalerSummary
from tuner.report.oplists import TypeLevel

VENDOR_DTYPE = "bf16"  # the one lower dtype HMP and Gaudi autocast run


@dataclass(frozen=True)
class Loop:
    """How report.md's training loops run: on `device`, the loss scaled by a `tuner.LossScaler` on
    `scaler` ("cpu", "cuda") when the trials made one (None: no scaler)."""

    device: str = "cpu"
    scaler: str | None = None

    def __post_init__(self) -> None:
        if not self.device or self.scaler == "":
            raise ValueError(f"a training loop needs a device (and a scaler's device, or None), found "
                             f"{self.device!r}, {self.scaler!r}")

    def setup(self) -> list[str]:
        """The lines before the loop: the model onto the device, the scaler."""
        lines = [] if self.device == "cpu" else [f'model.to("{self.device}")   # where the trials trained it']
        if self.scaler is not None:
            lines.append(f'scaler = tuner.LossScaler("{self.scaler}")   # a torch.amp.GradScaler, as the trials '
                         "scaled the loss")
        return lines

    def step(self, indent: str) -> list[str]:
        """The backward and the optimizer step, scaled when the trials scaled them."""
        if self.scaler is None:
            lines = ["optimizer.zero_grad()", "loss.backward()", "optimizer.step()"]
        else:
            lines = ["optimizer.zero_grad()", "scaler.scale(loss).backward()", "scaler.step(optimizer)",
                     "scaler.update()"]
        return [indent + line for line in lines]


def training_section(lists: TypeLevel | None, out: Path, *, device: str = "cpu",
                     scaler: ScalerSummary | None = None) -> list[str]:
    """The section's Markdown lines (none without `lists`). `device`: what the tune ran on; `scaler`: what the
    trials' tuner.LossScaler did (None: they made none)."""
    if lists is None:
        return []
    plan = lists.plan
    loop = Loop(device, scaler.device if scaler is not None else None)
    lines = _training(lists, out, loop) if plan.for_training else _inference(lists, out)
    return lines + _vendor(lists, out) + _cost(lists)


def convert_call(lists: TypeLevel, out: Path) -> str:
    """`tuner.convert(...)` with the list files and the plan's dtype and preset: HMP's own argument names for a
    bf16 plan (`hmp.convert` takes the same call), mpt's for an fp16 one, which HMP does not run."""
    plan = lists.plan
    preset = "" if plan.preset == "hmp" else f', preset="{plan.preset}"'
    lower, fp32 = out / hmp_lower_name(plan.dtype), out / HMP_FP32_NAME
    if plan.dtype == VENDOR_DTYPE:
        return f'tuner.convert(bf16_file_path="{lower}", fp32_file_path="{fp32}"{preset})'
    return f'tuner.convert(lower_list_path="{lower}", fp32_list_path="{fp32}", dtype="{plan.dtype}"{preset})'


def _inference(lists: TypeLevel, out: Path) -> list[str]:
    """A plan tuned for inference: the plan as a context, the lists process-wide."""
    tool = ("as HMP takes them (hmp.convert takes the same files)" if lists.plan.dtype == VENDOR_DTYPE
            else f"in {lists.plan.dtype}")
    return ["Or run it as a context around each forward of the FP32 model as built, or as op-type lists "
            "process-wide (tuned for inference: for a training loop, tune with `--for-training`):", "",
            "```python", "import tuner", "",
            f'with tuner.autocast("{out}", model=model):   # the plan as tuned, per op instance',
            "    out = model(x)", "", f"# or the op-type lists, process-wide, {tool}:", convert_call(lists, out),
            "```", ""]


def _training(lists: TypeLevel, out: Path, loop: Loop) -> list[str]:
    """A plan tuned for training: one loop per way to run it, each training as the trials trained."""
    dtype = lists.plan.dtype
    tuner_import = ["import tuner", ""] if loop.scaler is not None else []
    lists_note = "" if lists.exact else " (not the plan: see below)"
    tool = ", as HMP takes them (`hmp.convert` takes the same files, `hmp.disable_casts()` the same block)" \
        if dtype == VENDOR_DTYPE else f", in {dtype}"
    lines = ["Train with it as every trial trained: the plan inside the model's forward (FP32 weights and buffers, "
             f"{dtype} compute per op as planned), what the forward returns handed back in FP32, and the loss, the "
             "backward and the optimizer step in FP32 as your code writes them. The same run gives the same "
             "metric in each of these ways. The model `tuner.load` returned (above), as it is:", "",
             "```python", *tuner_import, *loop.setup(), "model.train()", "for x, y in loader:",
             "    loss = loss_fn(model(x), y)   # its outputs come back FP32", *loop.step("    "), "```", "",
             "Or the plan around each forward of your FP32 model as built (no `tuner.load`), the loss outside the "
             "block:", "", "```python", "import tuner", "", *loop.setup(), "model.train()", "for x, y in loader:",
             f'    with tuner.autocast("{out}", model=model):   # the plan as tuned, per op instance',
             "        out = model(x)", "    loss = loss_fn(out.float(), y)", *loop.step("    "), "```", "",
             f"Or the op-type lists{lists_note}, process-wide{tool}, the loss and the step outside them:", "",
             "```python", "import tuner", "", convert_call(lists, out), *loop.setup(), "model.train()",
             "for x, y in loader:", "    out = model(x)", "    with tuner.disable_casts():",
             "        loss = loss_fn(out.float(), y)", *loop.step("        "), "```", ""]
    if dtype != VENDOR_DTYPE and loop.scaler is None:
        lines += [f"> The trials scaled no loss with `tuner.LossScaler`; {dtype} training usually needs loss "
                  "scaling: if your loop scales it with `torch.amp.GradScaler`, keep it in these loops as it is.", ""]
    return lines


def _vendor(lists: TypeLevel, out: Path) -> list[str]:
    """Gaudi autocast's recipe for a bf16 plan; for another dtype, why HMP's and Gaudi's are none."""
    plan = lists.plan
    if plan.dtype != VENDOR_DTYPE:
        return [f"> HMP and Gaudi autocast run bf16 only (Gaudi: \"Float16 datatype is not supported\"), so this "
                f"{plan.dtype} plan's list files are not theirs to run: `{hmp_lower_name(plan.dtype)}`/"
                f"`{HMP_FP32_NAME}` (HMP's format) and `{LOWER_OPS_NAME}`/`{FP32_OPS_NAME}` (Gaudi's) run under "
                f"`tuner.convert(..., dtype=\"{plan.dtype}\")` above, the plan itself under `tuner.load` or "
                "`tuner.autocast`. For Gaudi, tune with `--dtype bf16`.", ""]
    lines = ["Gaudi autocast (`torch.autocast(\"hpu\", torch.bfloat16)` around the forward) takes the other pair, "
             "named before the process starts:", "", "```bash",
             f"export PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST={out / LOWER_OPS_NAME}",
             f"export PT_HPU_AUTOCAST_FP32_OPS_LIST={out / FP32_OPS_NAME}", "```", ""]
    if plan.for_training:
        lines += ["```python", "for x, y in loader:", "    with torch.autocast(\"hpu\", torch.bfloat16):",
                  "        out = model(x)", "    loss = loss_fn(out.float(), y)   # outside, in FP32, as the trials",
                  "    optimizer.zero_grad()", "    loss.backward()", "    optimizer.step()", "```", ""]
    return lines


def _cost(lists: TypeLevel) -> list[str]:
    """What the lists cost where they cannot express the plan; one line saying they do where they can."""
    dtype = lists.plan.dtype
    if lists.fallback:
        return [lists.fallback_text(), ""]
    if lists.exact:
        return ["The lists express this plan as it is: every op type is FP32 everywhere or nowhere.", ""]
    types = ", ".join(f"`{t}`" for t in lists.mixed)
    text = (f"> The op-type lists cannot express this plan: it keeps {types} FP32 in some places and runs it in "
            f"{dtype} in others, so the lists keep {'it' if len(lists.mixed) == 1 else 'them'} FP32 everywhere")
    if lists.plan_shares is not None and lists.list_shares is not None:
        own, listed = lists.plan_shares.flop_share, lists.list_shares.flop_share
        text += (f": {listed:.1%} of matmul/conv FLOPs in {dtype} against the plan's {own:.1%} "
                 f"({(own - listed) * 100:.1f} points lost)")
    if lists.raised:
        text += (f"; that list plan makes the model's own code raise on the example inputs ({lists.raised}), so "
                 "its share is not known. `mpt tune --granularity type` tunes the best plan op-type lists can "
                 "express and confirms it.")
    else:
        text += (". That list plan was measured, not evaluated; `mpt tune --granularity type` tunes the best plan "
                 "op-type lists can express and confirms it.")
    return [text, ""]
