"""The op-type list files a tune writes: HMP's and Gaudi autocast's format, read back by `tuner.convert` as HMP's
`bf16_file_path`/`fp32_file_path`, and what they cost where they cannot express the plan (issue 41)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

import tuner
from tuner.core.errors import ConfigError
from tuner.core.inputs import ModelInputs
from tuner.jobs.tune_call import _user_model
from tuner.jobs.tune_run import tune_into_folder
from tuner.policy.opnames import known_op_names
from tuner.policy.plan import Plan
from tuner.report.oplists import type_level
from tuner.report.training_snippet import training_section

LIST_FILES = ("hmp_ops_bf16.txt", "hmp_ops_fp32.txt", "lower_precision_ops.txt", "fp32_ops.txt")


class OffsetNorms(nn.Module):
    """Two LayerNorms: the first over readings offset by 4096 (bf16 rounds them to nothing: it must stay FP32),
    the second over a linear's output (harmless in bf16). Under HMP's lists both are lowered."""

    def __init__(self) -> None:
        super().__init__()
        self.n1 = nn.LayerNorm(16)
        self.l1 = nn.Linear(16, 32)
        self.n2 = nn.LayerNorm(32)
        self.l2 = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l2(self.n2(self.l1(self.n1(x + 4096.0))).relu())


def build() -> nn.Module:
    torch.manual_seed(0)
    return OffsetNorms()


def batches() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randn(32, 16, generator=g) * 4 for _ in range(2)]


def tuned(out: Path, granularity: str) -> tuner.TuneResult:
    """`tuner.tune(build, metric="cosine", ..., out=out)` as it runs, less the latency timing (seconds)."""
    options = tuner.TuneOptions(metric="cosine", preset="hmp", granularity=granularity)
    user = _user_model(build, None, batches(), options)
    return tune_into_folder(user, options, out, latency=False).result


def op_dtypes(context: object, model: nn.Module, x: torch.Tensor | None = None) -> list[tuple[str, str]]:
    """(op, compute dtype) of every call of one forward (of `x`, else a batch) under `context`, which gets the
    recorder."""
    seen: list = []
    x = batches()[0] if x is None else x
    with context(seen.append):  # type: ignore[operator]
        model(x)
    return [(d.op, d.compute_name) for d in seen]


def converted_dtypes(model: nn.Module, **lists: object) -> list[tuple[str, str]]:
    """(op, compute dtype) of every call of one forward with `tuner.convert(**lists)` on."""
    return converted_dtypes_of(model, batches()[0], **lists)


def converted_dtypes_of(model: nn.Module, x: torch.Tensor, **lists: object) -> list[tuple[str, str]]:
    """(op, compute dtype) of every call of the forward of `x` with `tuner.convert(**lists)` on."""
    seen: list = []
    tuner.convert(verbose=seen.append, **lists)  # type: ignore[arg-type]
    try:
        model(x)
    finally:
        tuner.revert()
    return [(d.op, d.compute_name) for d in seen]


@pytest.fixture(scope="module")
def type_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, tuner.TuneResult]:
    out = tmp_path_factory.mktemp("types") / "out"
    return out, tuned(out, "type")


def test_list_files_hold_one_known_op_name_a_line_and_nothing_else(type_run):
    out, _ = type_run
    known = known_op_names()
    for name in LIST_FILES:
        text = (out / name).read_text(encoding="utf-8")
        lines = text.split("\n")
        assert lines[-1] == "" and all(lines[:-1]), name  # LF-terminated lines, none empty (getline reads each)
        ops = lines[:-1]
        assert ops == sorted(set(ops)), name
        assert all(op == op.strip() and not op.startswith("#") and op in known for op in ops), name
    hmp_fp32 = (out / "hmp_ops_fp32.txt").read_text().split()
    gaudi_fp32 = (out / "fp32_ops.txt").read_text().split()
    # each tool's own spelling: HMP wraps F.cross_entropy, Gaudi registers the ATen op cross_entropy_loss
    assert "cross_entropy" in hmp_fp32 and "cross_entropy_loss" not in hmp_fp32
    assert "cross_entropy_loss" in gaudi_fp32 and "cross_entropy" not in gaudi_fp32
    assert "layer_norm" in hmp_fp32 and "layer_norm" not in (out / "hmp_ops_bf16.txt").read_text().split()


def test_list_files_load_in_convert_as_hmp_format_with_the_plans_dtypes(type_run):
    out, result = type_run
    model = build()
    planned = op_dtypes(lambda rec: tuner.autocast(out, model=model, verbose=rec), model)
    assert ("layer_norm", "fp32") in planned and ("linear", "bf16") in planned
    hmp = converted_dtypes(model, bf16_file_path=out / "hmp_ops_bf16.txt", fp32_file_path=out / "hmp_ops_fp32.txt")
    gaudi = converted_dtypes(model, bf16_file_path=str(out / "lower_precision_ops.txt"),
                             fp32_file_path=str(out / "fp32_ops.txt"))
    assert hmp == planned and gaudi == planned


def test_convert_refuses_a_list_named_twice(tmp_path):
    path = tmp_path / "bf16.txt"
    path.write_text("linear\n")
    with pytest.raises(ConfigError, match="bf16_file_path and lower_list_path"):
        tuner.convert(bf16_file_path=path, lower_list_path=path)


def test_granularity_type_gives_every_instance_of_a_type_one_dtype_and_meets_the_target(type_run):
    out, result = type_run
    assert result.status.value == "ok"
    model = build()
    dtypes: dict[str, set[str]] = {}
    for op, dtype in op_dtypes(lambda rec: tuner.autocast(Plan.load(out), model=model, verbose=rec), model):
        dtypes.setdefault(op, set()).add(dtype)
    assert dtypes["layer_norm"] == {"fp32"} and dtypes["linear"] == {"bf16"}
    assert all(len(d) == 1 for d in dtypes.values()), dtypes
    assert "The lists express this plan as it is" in (out / "report.md").read_text()


def test_instance_plan_lists_say_which_types_they_cost(tmp_path):
    out = tmp_path / "out"
    result = tuned(out, "instance")
    assert [i.label() for i in result.plan.fp32_instances] == ["n1:layer_norm#0"]  # n2's runs in bf16
    assert "layer_norm" in (out / "hmp_ops_fp32.txt").read_text().split()  # the type, FP32 everywhere
    md = (out / "report.md").read_text()
    assert "cannot express this plan: it keeps `layer_norm` FP32 in some places" in md
    assert "points lost" in md and "tuner.convert(bf16_file_path=" in md and "tune with `--for-training`" in md
    assert "PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST" in md
    report = json.loads((out / "report.json").read_text())
    assert report["op_lists"]["exact"] is False and report["op_lists"]["mixed"] == ["layer_norm"]
    # layer_norm has no matmul FLOPs and l2 stays in the lower list: FP32 everywhere costs no FLOP share here
    assert report["op_lists"]["low_precision_flop_share"] == report["low_precision_flop_share"] > 0
    assert "(0.0 points lost)" in md


def test_granularity_is_an_enum_option_kept_in_the_journals_settings():
    with pytest.raises(ConfigError, match="granularity"):
        tuner.TuneOptions(granularity="types")
    assert "granularity" not in tuner.TuneOptions().settings()  # journals from before it still resume
    assert tuner.TuneOptions(granularity="type").settings()["granularity"] == "type"


def test_a_type_kept_fp32_in_one_place_costs_the_lists_its_share_everywhere():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    plan = Plan(dtype="bf16", preset="hmp", fp32_instances=(("2", "linear", 0),), for_training=True)
    lists = type_level(plan, model, ModelInputs.of((batches()[0],)))
    assert lists.mixed == ("linear",) and not lists.exact
    assert "linear" in lists.fp32 and "linear" not in lists.lower
    assert lists.plan_shares.flop_share == 0.8 and lists.list_shares.flop_share == 0.0  # 16x64 of 16x64 + 64x4
    assert lists.names("gaudi")[1] == sorted(set(lists.names("gaudi")[1]))
    text = "\n".join(training_section(lists, Path("out")))
    assert "0.0% of matmul/conv FLOPs in bf16 against the plan's" in text and "measured, not evaluated" in text
    assert text.startswith("Train with it as every trial trained")  # a plan tuned for training


def test_a_list_plan_that_makes_the_models_own_code_raise_is_reported_not_an_internal_error():
    """The plan keeps `key` FP32 and runs: the lists keep `linear` FP32 everywhere, `query` too, while `matmul`
    stays low, and the model masks the bf16 scores with float32's min (`torch.finfo(q.dtype)`), which raises. Before: the tune ended in an internal error after
    its plan was confirmed (DeBERTa-v2 in benchmarks/hazard_zoo.py)."""
    from tests.assets import mixed_raise

    plan = Plan(dtype="bf16", preset="torch-cpu", fp32_instances=(("key", "linear", 0),))
    lists = type_level(plan, mixed_raise.build_model(), ModelInputs.of(mixed_raise.example_inputs()))
    assert lists.mixed == ("linear",) and lists.list_shares is None
    assert "cannot be converted to type c10::BFloat16" in lists.raised
    text = "\n".join(training_section(lists, Path("out")))
    assert "makes the model's own code raise" in text and "measured, not evaluated" not in text


class Encoder(nn.Module):
    """An nn.TransformerEncoderLayer between an embedding and a head: its self-attention calls linear (in and out
    projections) and scaled_dot_product_attention from one module."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, 16)
        self.block = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.head = nn.Linear(16, 20)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.emb(x)))


def build_encoder() -> nn.Module:
    torch.manual_seed(0)
    return Encoder()


TOKENS = torch.randint(0, 20, (4, 6), generator=torch.Generator().manual_seed(2))


def linears_fp32(model: nn.Module) -> float:
    """1 when the model's linears ran FP32, else 0: a metric that fails every plan running `linear` low and no other
    (every CPU alike), so a type search keeps `linear` FP32 and the attention's matmuls low."""
    seen: list[torch.dtype] = []
    handle = model.block.linear1.register_forward_hook(lambda m, a, out: seen.append(out.dtype))
    try:
        with torch.no_grad():
            model(TOKENS)
    finally:
        handle.remove()
    return float(seen == [torch.float32])


def trained_linears_fp32(model: nn.Module) -> float:
    """`linears_fp32` after one optimizer step: a --for-training evaluate must train the model it is given."""
    model.train()
    loss = model(TOKENS).float().square().mean()
    loss.backward()
    torch.optim.SGD(model.parameters(), lr=1e-3).step()
    return linears_fp32(model)


@pytest.mark.parametrize("for_training", [False, True])
def test_granularity_type_keeps_a_transformer_layers_linears_fp32_and_runs_its_attention_low_as_the_lists_do(
        tmp_path, for_training):
    """Before: the type plan (every `linear` FP32) ran nn.MultiheadAttention as an FP32 island, its attention in
    FP32 too, and the tune ended in an internal NotAsClaimed error ("block.self_attn: matmuls/convs ran in
    float32, the plan claims float16") with or without --for-training (issue 45)."""
    options = tuner.TuneOptions(dtype="fp16", granularity="type", tolerance=0.0, absolute=True,
                                for_training=for_training)
    user = _user_model(build_encoder, trained_linears_fp32 if for_training else linears_fp32, (TOKENS,), options)
    result = tune_into_folder(user, options, tmp_path, latency=False).result
    assert result.status.value == "ok" and {i.op for i in result.plan.fp32_instances} == {"linear"}
    model = build_encoder()
    planned = op_dtypes(lambda rec: tuner.autocast(tmp_path, model=model, verbose=rec), model, TOKENS)
    assert ("scaled_dot_product_attention", "fp16") in planned and ("linear", "fp32") in planned
    assert ("linear", "fp16") not in planned
    listed = converted_dtypes_of(model, TOKENS, dtype="fp16", preset="torch-cpu",
                                 lower_list_path=tmp_path / "lower_precision_ops.txt",
                                 fp32_list_path=tmp_path / "fp32_ops.txt")
    assert listed == planned  # the list files run what the trials ran, call for call
    assert "The lists express this plan as it is" in (tmp_path / "report.md").read_text()
