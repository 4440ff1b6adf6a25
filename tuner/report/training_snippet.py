"""report.md's "Use it in a training loop" section: the plan around each forward (`tuner.autocast`), the op-type
list files as HMP (`tuner.convert`/`hmp.convert`) and Gaudi autocast take them, and, where the lists cannot
express the plan, which op types they keep FP32 everywhere and the share that costs (measured, not evaluated)."""
from __future__ import annotations

from pathlib import Path

from tuner.core.output_files import FP32_OPS_NAME, HMP_BF16_NAME, HMP_FP32_NAME, LOWER_OPS_NAME
from tuner.report.oplists import TypeLevel


def training_section(lists: TypeLevel | None, out: Path) -> list[str]:
    """The section's Markdown lines (none without `lists`)."""
    if lists is None:
        return []
    plan = lists.plan
    hmp_preset = "" if plan.preset == "hmp" else f', preset="{plan.preset}"'
    head = ("Use it in the training loop (the FP32 weights are yours; the plan around each forward and loss):"
            if plan.for_training else "Or run it as a context around each forward and loss (tuned for inference: "
            "for a training loop, tune with `--for-training`):")
    lines = [head, "", "```python",
             "import tuner", "", "for x, y in loader:",
             f'    with tuner.autocast("{out}", model=model):   # the plan as tuned, per op instance',
             "        loss = loss_fn(model(x), y)", "    loss.backward()", "    optimizer.step()",
             "    optimizer.zero_grad()", "",
             "# or the op-type lists, process-wide, as HMP takes them (hmp.convert takes the same files):",
             f'tuner.convert(bf16_file_path="{out / HMP_BF16_NAME}", fp32_file_path="{out / HMP_FP32_NAME}"'
             f"{hmp_preset})", "```", "",
             "Gaudi autocast (`torch.autocast(\"hpu\", torch.bfloat16)` around the forward) takes the other pair:",
             "", "```bash", f"export PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST={out / LOWER_OPS_NAME}",
             f"export PT_HPU_AUTOCAST_FP32_OPS_LIST={out / FP32_OPS_NAME}", "```", ""]
    return lines + _cost(lists)


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
