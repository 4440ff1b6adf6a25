"""What a fallback chain's tune writes (issue 46): report.md and report.json give the FLOP share per dtype and
"16-bit" in all, the checkpoint stores each weight in its op's dtype, `tuner.load` and `tuner.autocast` run
the plan as tuned, `mpt inspect` splits the share by dtype, and the list files say what they cannot express."""
from __future__ import annotations

import json

import pytest
import torch

import tuner
from tests.assets import fp16_chains
from tuner.jobs.tune_call import _user_model
from tuner.jobs.tune_run import tune_into_folder
from tuner.measure.inspection import inspect_model
from tuner.options.tune import TuneOptions
from tuner.policy.plan import Plan


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """`mpt tune --dtype fp16 --fallback bf16 --no-latency` of the GeGLU chain, written to a folder."""
    out = tmp_path_factory.mktemp("chain")
    options = TuneOptions(dtype="fp16", fallback="bf16")
    user = _user_model(fp16_chains.build_geglu, fp16_chains.evaluate, fp16_chains.example_inputs, options)
    result = tune_into_folder(user, options, out, overwrite=True, latency=False).result
    return out, result, json.loads((out / "report.json").read_text()), (out / "report.md").read_text()


def test_report_json_and_md_give_each_dtypes_share(tuned):
    out, result, report, md = tuned
    split = report["flop_share_by_dtype"]
    assert split["16-bit"] == 1.0 and split["fp32"] == 0.0 and split["bf16"] > 0.1 and split["fp16"] > 0.5
    assert report["fp32_instances"] == [] and "mlp1.down_proj:linear#0" in report["fallback_instances"]
    assert report["plan"]["fallback"] == "bf16"
    assert "in fp16, bf16 as first fallback" in md and "| in 16-bit | 100% of matmul/conv FLOPs" in md
    assert "in 16-bit (bf16 " in md and "bf16 op instances (the first fallback) and why" in md
    lists = report["op_lists"]
    assert lists["fallback"] and not lists["exact"] and lists["low_precision_flop_share"] < 1.0
    assert "take one lower dtype per run" in md and "points lost" in md


def test_search_html_lists_each_fallback_instance_and_why_as_report_md_does(tuned):
    out, result, report, md = tuned
    page = (out / "search.html").read_text()
    assert "bf16 op instances, the first fallback" in page and "<dt>in 16-bit</dt>" in page
    for label in report["fallback_instances"]:
        assert f"<code>{label}</code>" in page and f"`{label}`" in md
    assert page.count("confirmed it in bf16") + page.count("so it runs there") == len(report["fallback_instances"])


def test_the_checkpoint_load_and_autocast_run_the_plan_as_tuned(tuned):
    out, result, _, _ = tuned
    loaded = tuner.load(fp16_chains.build_geglu(), out)
    dtypes = {n: p.dtype for n, p in loaded.named_parameters()}
    assert dtypes["mlp1.down_proj.weight"] is torch.bfloat16 and dtypes["embed.weight"] is torch.float16
    assert fp16_chains.evaluate(loaded) == result.metric
    x = fp16_chains.example_inputs()
    with torch.no_grad():
        want = loaded(*x) if isinstance(x, tuple) else loaded(x)
        model = fp16_chains.build_geglu().eval()
        with tuner.autocast(Plan.load(out), model=model):
            got = model(*x) if isinstance(x, tuple) else model(x)
    assert torch.isfinite(got).all() and torch.equal(got, want)
    summary = inspect_model(fp16_chains.build_geglu().eval(), x, Plan.load(out)).summary
    assert summary.flop_share_by_dtype["bf16"] > 0.1 and summary.lower_flop_share == 1.0
