"""The shipped presets (configs/presets/*.yaml) against their sources.

Seed-based presets (hmp, hmp-o1, hmp-o2, gaudi, xla) are compared with a golden
copy kept in this file and, when the seed documents are available
(../shared/seeds next to the repository), with lists parsed from the seed text.
torch-cpu / torch-cuda are compared with the installed torch's Autocast
registrations and with op-lists.md (../shared/reference/op-lists.md).
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import yaml

from tuner.policy.opnames import ALIASES, GROUPED_MM_OPS, known_op_names
from tuner.policy.presetfiles import preset_names
from tuner.policy.presets import Policy, load_preset
from tuner.policy.rules import Rule

REPO = Path(__file__).resolve().parents[2]
PRESET_DIR = REPO / "configs" / "presets"
SHARED = Path(__file__).resolve().parents[3] / "shared"
SEEDS = SHARED / "seeds"
OP_LISTS_MD = SHARED / "reference" / "op-lists.md"

ALL_PRESETS = ["hmp", "hmp-o1", "hmp-o2", "gaudi", "xla", "torch-cpu", "torch-cuda"]
NATIVE = {"torch-cpu": "cpu", "torch-cuda": "cuda"}
LISTS = ("lower", "fp32", "promote", "banned")
POLICY_KEYS = {"version", "name", "description", "source", "dtype", "device", "native", "unlisted", "inplace",
               "lower", "fp32", "promote", "banned"}

# --------------------------------------------------------------------------------------------------
# Golden copies of the seed lists (after the typo / family normalisation below)
# --------------------------------------------------------------------------------------------------
HMP_MULTI_INPUTS = {"add", "addcmul", "addcdiv", "cat", "div", "exp", "mul", "pow", "sub", "iadd", "truediv",
                    "stack"}

GOLDEN: dict[str, dict[str, set[str]]] = {
    "hmp": {
        "lower": set("""addmm batch_norm bmm conv1d conv2d conv3d conv_transpose1d conv_transpose2d conv_transpose3d
            dot dropout dropout1d dropout2d dropout3d group_norm instance_norm layer_norm leaky_relu linear matmul
            mm mul mv relu t""".split()),
        "fp32": set("""binary_cross_entropy binary_cross_entropy_with_logits cross_entropy div divide embedding
            embedding_bag log log2 log_softmax nll_loss smooth_l1_loss softmax topk truediv""".split()),
        "promote": HMP_MULTI_INPUTS,
        "banned": set(),
    },
    "hmp-o1": {
        "lower": set("addmm bmm conv1d conv2d conv3d dot mm mv".split()),
        "fp32": set("batch_norm cross_entropy log_softmax softmax nll_loss topk".split()),
        "promote": HMP_MULTI_INPUTS,
        "banned": set(),
    },
    "hmp-o2": {
        "lower": set("""conv1d conv2d conv3d conv_transpose1d conv_transpose2d conv_transpose3d addmm mm bmm mv
            dot""".split()),
        "fp32": set(),
        "promote": set(),
        "banned": set(),
    },
    "gaudi": {
        "lower": set("""addmm addbmm batch_norm baddbmm bmm conv1d conv2d conv3d conv_transpose1d conv_transpose2d
            conv_transpose3d dot dropout feature_dropout group_norm instance_norm layer_norm leaky_relu linear
            matmul mean mm mul mv softmax log_softmax scaled_dot_product_attention""".split()),
        "fp32": set("""acos addcdiv asin atan2 bilinear binary_cross_entropy binary_cross_entropy_with_logits cdist
            cosh cosine_embedding_loss cosine_similarity cross_entropy_loss dist div divide embedding embedding_bag
            erfinv exp expm1 hinge_embedding_loss huber_loss kl_div l1_loss log log10 log1p log2 logsumexp
            margin_ranking_loss mse_loss multi_margin_loss multilabel_margin_loss nll_loss pdist poisson_nll_loss
            pow reciprocal renorm rsqrt sinh smooth_l1_loss soft_margin_loss softplus tan topk triplet_margin_loss
            truediv true_divide""".split()),
        "promote": set("add addcmul addcdiv cat div exp mul pow sub iadd truediv stack".split()),
        "banned": set(),
    },
    "xla": {
        "lower": set("""__matmul__ addbmm addmm addmv addr baddbmm bmm conv1d conv2d conv3d conv_transpose1d
            conv_transpose2d conv_transpose3d linear matmul mm relu prelu max_pool2d""".split()),
        "fp32": set("""batch_norm log_softmax binary_cross_entropy binary_cross_entropy_with_logits prod cdist trace
            cholesky inverse reflection_pad1d reflection_pad2d reflection_pad3d replication_pad1d
            replication_pad2d replication_pad3d mse_loss cosine_embedding_loss nll_loss multilabel_margin_loss qr
            svd triangular_solve linalg_svd linalg_inv_ex""".split()),
        "promote": set("stack cat index_copy".split()),
        "banned": set(),
    },
}

# Seed text -> preset spelling. Typos in seed 003 and op families it names by prefix.
SEED_TYPOS = {"chloesky": "cholesky", "cosine_embbeding_loss": "cosine_embedding_loss"}
SEED_FAMILIES = {
    "reflection_pad": ("reflection_pad1d", "reflection_pad2d", "reflection_pad3d"),
    "replication_pad": ("replication_pad1d", "replication_pad2d", "replication_pad3d"),
}
# hmp-o2: the seed's "(e.g. ...)" examples plus HMP's own O2 list (op-lists.md) adds the transposed convs.
HMP_O2_BEYOND_SEED_EXAMPLES = {"conv_transpose1d", "conv_transpose2d", "conv_transpose3d"}


def normalise(names: list[str]) -> set[str]:
    out: set[str] = set()
    for name in names:
        name = SEED_TYPOS.get(name, name)
        out.update(SEED_FAMILIES.get(name, (name,)))
    return out


# --------------------------------------------------------------------------------------------------
# Helpers: reading presets, seeds and op-lists.md
# --------------------------------------------------------------------------------------------------
def raw_preset(name: str) -> dict:
    with open(PRESET_DIR / f"{name}.yaml", encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def preset_lists(name: str) -> dict[str, set[str]]:
    pol = load_preset(name)
    return {key: set(getattr(pol, key)) for key in LISTS}


def classify(lists: dict[str, set[str]], op: str) -> list[str]:
    return [key for key in LISTS if op in lists[key]]


def seed_text(number: str) -> str:
    if not SEEDS.is_dir():
        pytest.skip(f"seed documents not available ({SEEDS} is missing)")
    found = sorted(SEEDS.glob(f"{number}_*.txt"))
    if not found:
        pytest.skip(f"seed {number} not found in {SEEDS}")
    return found[0].read_text(encoding="utf-8")


def _comma_names(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def bracket_list(text: str, heading: str) -> list[str]:
    """`heading = [a, b, c]` -> [a, b, c]."""
    m = re.search(re.escape(heading) + r"\s*=\s*\[([^\]]*)\]", text)
    assert m, f"heading {heading!r} not found in the seed text"
    return _comma_names(m.group(1))


def line_list(text: str, heading: str) -> list[str]:
    """A bullet line `• heading: a, b, c` -> [a, b, c]."""
    m = re.search(r"^[\s\u2022]*" + re.escape(heading) + r":\s*([^\n]+)$", text, re.M)
    assert m, f"heading {heading!r} not found in the seed text"
    return _comma_names(m.group(1))


def block_names(text: str, start: str, end: str) -> list[str]:
    """Identifiers between two headings (seed 003 puts one list item per line)."""
    m = re.search(re.escape(start) + r"(.*?)" + re.escape(end), text, re.S)
    assert m, f"no text between {start!r} and {end!r}"
    return re.findall(r"[A-Za-z_][A-Za-z0-9_]*", m.group(1))


def seed_lists(preset: str) -> dict[str, set[str]]:
    """The lists of a seed-based preset, parsed from the seed text (normalised)."""
    if preset == "hmp":
        text = seed_text("000")
        return {"lower": normalise(bracket_list(text, "Default BF16 list")),
                "fp32": normalise(bracket_list(text, "Default FP32 list"))}
    if preset == "hmp-o1":
        text = seed_text("002")
        return {"lower": normalise(bracket_list(text, "Default BF16 list")),
                "fp32": normalise(bracket_list(text, "Default FP32 list"))}
    if preset == "hmp-o2":
        text = seed_text("002")
        m = re.search(r"only GEMM and Convolution type OPs \(e\.g\.\s*([^)]*)\)", text)
        assert m, "O2 rule not found in seed 002"
        return {"lower": normalise(_comma_names(m.group(1)))}
    if preset == "gaudi":
        text = seed_text("001")
        return {"lower": normalise(line_list(text, "Lower precision")),
                "fp32": normalise(line_list(text, "FP32")),
                "promote": normalise(line_list(text, "Promote"))}
    if preset == "xla":
        text = seed_text("003")
        return {
            "lower": normalise(block_names(text, "Ops that autocast to bfloat16", "Ops that autocast to float32")),
            "fp32": normalise(block_names(text, "Ops that autocast to float32", "Ops that autocast to widest")),
            "promote": normalise(block_names(text, "Ops that autocast to widest input type:", "AMP on XLA:GPU")),
        }
    raise AssertionError(preset)


def op_lists_md() -> str:
    if not OP_LISTS_MD.is_file():
        pytest.skip(f"op-lists.md not available ({OP_LISTS_MD} is missing)")
    return OP_LISTS_MD.read_text(encoding="utf-8")


def md_section(text: str, title_start: str) -> dict[str, str]:
    """`key: value` entries (with indented continuation lines) of one `## ` section of op-lists.md."""
    sections = re.split(r"^## ", text, flags=re.M)
    body = next((s for s in sections if s.startswith(title_start)), None)
    assert body is not None, f"section {title_start!r} not found in op-lists.md"
    entries: dict[str, str] = {}
    key = None
    for line in body.splitlines()[1:]:
        if not line.strip():
            continue
        if line.startswith((" ", "\t")) and key is not None:
            entries[key] += " " + line.strip()
            continue
        m = re.match(r"^([^:]+):\s*(.*)$", line)
        if m:
            key = m.group(1).strip()
            entries[key] = m.group(2).strip()
    return entries


def aten_names(value: str) -> set[str]:
    """`a, b.overload, c (+ .x, .y); CUDA only: d` -> {a, b, c, d}."""
    value = re.sub(r"\([^)]*\)", " ", value).replace("CUDA only:", ",").replace(";", ",")
    return {item.strip().split(".")[0] for item in value.split(",") if item.strip()}


def expand_slashes(item: str) -> list[str]:
    """`conv1d/2d/3d` -> conv1d conv2d conv3d."""
    parts = item.strip().split("/")
    base = parts[0]
    if len(parts) == 1:
        return [base]
    stem = base[: len(base) - len(parts[1])]
    return [base] + [stem + p for p in parts[1:]]


def md_torch_split(device: str) -> dict[str, str]:
    """op -> lower/fp32/promote/banned from op-lists.md's PyTorch autocast section for `device`."""
    title = "PyTorch autocast, CUDA" if device == "cuda" else "PyTorch autocast, CPU"
    entries = md_section(op_lists_md(), title)
    kinds = {"lower_precision_fp": "lower", "fp32": "fp32", "fp32_set_opt_dtype": "fp32",
             "fp32_append_dtype": "fp32", "promote": "promote", "banned": "banned"}
    split: dict[str, str] = {}
    for key, kind in kinds.items():
        if key not in entries:
            continue
        for op in aten_names(entries[key]):
            assert split.get(op, kind) == kind, f"op-lists.md puts {op} in two lists"
            split[op] = kind
    assert split, f"nothing parsed from op-lists.md section {title!r}"
    return split


# Registered for AutocastCUDA in CUDA builds with cuDNN only (ATen/cudnn/AutocastRNN.cpp): a CPU build lacks them.
CUDA_BUILD_ONLY = {"_cudnn_rnn"}


def registered(key: str) -> set[str]:
    """ATen ops with a kernel for an Autocast dispatch key in the installed torch (no aten::, no overload), and for
    AutocastCUDA those a CUDA build registers (`CUDA_BUILD_ONLY`) whatever build is installed."""
    names = [n for n in torch._C._dispatch_get_all_op_names()
             if torch._C._dispatch_has_kernel_for_dispatch_key(n, key)]
    return {n.split("::", 1)[-1].split(".")[0] for n in names} | (CUDA_BUILD_ONLY if key == "AutocastCUDA" else set())


# --------------------------------------------------------------------------------------------------
# Every preset
# --------------------------------------------------------------------------------------------------
def test_all_presets_are_shipped_and_load():
    assert set(ALL_PRESETS) <= set(preset_names())
    for name in ALL_PRESETS:
        pol = load_preset(name)
        assert isinstance(pol, Policy)
        assert pol.name == name
        assert pol.description and pol.source


@pytest.mark.parametrize("name", ALL_PRESETS)
def test_preset_file_format(name):
    data = raw_preset(name)
    assert set(data) == POLICY_KEYS
    assert data["version"] == 1
    assert data["name"] == name
    for key in LISTS:
        assert isinstance(data[key], list)
        assert len(data[key]) == len(set(data[key])), f"{name}: duplicate names in {key}"
        unknown = set(data[key]) - known_op_names()
        assert not unknown, f"{name}: unknown op names in {key}: {sorted(unknown)}"


@pytest.mark.parametrize("name", ALL_PRESETS)
def test_lower_and_fp32_never_overlap(name):
    data = raw_preset(name)
    assert not set(data["lower"]) & set(data["fp32"])
    assert not set(data["banned"]) & (set(data["lower"]) | set(data["fp32"]) | set(data["promote"]))


@pytest.mark.parametrize("name", ALL_PRESETS)
def test_native_only_for_torch_presets(name):
    pol = load_preset(name)
    assert pol.native == NATIVE.get(name)
    if name in NATIVE:
        assert pol.device == NATIVE[name]
        assert pol.unlisted == "passthrough" and pol.inplace == "skip"
    else:
        assert pol.device is None


@pytest.mark.parametrize("name,dtype,unlisted,inplace", [
    ("hmp", "bf16", "first_input", "first_input"),
    ("hmp-o1", "bf16", "first_input", "first_input"),
    ("hmp-o2", "bf16", "fp32", "first_input"),
    ("gaudi", "bf16", "passthrough", "skip"),
    ("xla", "bf16", "passthrough", "skip"),
    ("torch-cpu", "bf16", "passthrough", "skip"),
    ("torch-cuda", "fp16", "passthrough", "skip"),
])
def test_rules(name, dtype, unlisted, inplace):
    pol = load_preset(name)
    assert (pol.dtype, pol.unlisted, pol.inplace) == (dtype, unlisted, inplace)


def test_hmp_list_precedence_over_promote():
    pol = load_preset("hmp")
    assert pol.rule_for("mul")[0] == "lower"  # in BF16 and multi-input lists: BF16 list wins
    assert pol.rule_for("div")[0] == "fp32"  # in FP32 and multi-input lists: FP32 list wins
    assert pol.rule_for("add")[0] == "promote"
    assert pol.rule_for("tanh")[0] == "first_input"
    assert load_preset("hmp-o2").rule_for("softmax") == (Rule.UNLISTED_FP32, "unlisted: fp32")  # O2: FP32 by default


# --------------------------------------------------------------------------------------------------
# Seed-based presets
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(GOLDEN))
def test_seed_preset_equals_golden(name):
    assert preset_lists(name) == GOLDEN[name]


@pytest.mark.parametrize("name", list(GOLDEN))
def test_seed_preset_equals_seed_text(name):
    parsed = seed_lists(name)
    lists = preset_lists(name)
    for key, from_seed in parsed.items():
        assert from_seed, f"{name}: nothing parsed for {key}"
        if name == "hmp-o2" and key == "lower":
            # The seed gives examples ("e.g."); HMP's O2 list also has the transposed convolutions.
            assert from_seed | HMP_O2_BEYOND_SEED_EXAMPLES == lists[key]
            assert from_seed | HMP_O2_BEYOND_SEED_EXAMPLES == GOLDEN[name][key]
            assert not from_seed & HMP_O2_BEYOND_SEED_EXAMPLES
            continue
        assert lists[key] == from_seed, f"{name}.{key}: preset != seed text"
        assert GOLDEN[name][key] == from_seed, f"{name}.{key}: golden != seed text"


def test_seed_typos_are_really_in_the_seed():
    text = seed_text("003")
    for typo in SEED_TYPOS:
        assert typo in text
    assert "cholesky" not in text.replace("chloesky", "")


def test_hmp_promote_covers_the_seed_examples():
    text = seed_text("000")
    m = re.search(r"maintained in a separate list, e\.g\.\s*(.*?)\s*etc\.", text)
    assert m
    examples = set(_comma_names(m.group(1)))
    assert examples == {"add", "sub", "cat", "stack"}
    assert examples <= load_preset("hmp").promote
    assert examples <= load_preset("hmp-o1").promote


def test_hmp_o2_says_all_other_ops_fp32():
    text = seed_text("002")
    assert re.search(r"all other OPs should run in FP32", text)
    assert load_preset("hmp-o2").unlisted == "fp32"


def test_hmp_lists_against_op_lists_md():
    entries = md_section(op_lists_md(), "HMP default text files")
    assert set(entries["ops_multi_inputs.txt"].split()) == load_preset("hmp").promote == HMP_MULTI_INPUTS
    o2 = entries["O2"].split("=", 1)[1].split(";", 1)[0]
    o2_names = {n for item in o2.split(",") for n in expand_slashes(item)}
    assert o2_names == load_preset("hmp-o2").lower
    # The preset follows seed 000, whose lists differ from HMP's shipped text files in op-lists.md:
    # the seed's BF16 list has dropout1d/2d/3d and not `mean`; its FP32 list has `embedding`.
    shipped_bf16 = set(entries["ops_bf16.txt"].split())
    assert shipped_bf16 - GOLDEN["hmp"]["lower"] == {"mean"}
    assert GOLDEN["hmp"]["lower"] - shipped_bf16 == {"dropout1d", "dropout2d", "dropout3d"}
    assert set(entries["ops_fp32.txt"].split()) == GOLDEN["hmp"]["fp32"] - {"embedding"}


def test_gaudi_against_op_lists_md():
    entries = md_section(op_lists_md(), "Gaudi autocast defaults")
    lists = preset_lists("gaudi")
    assert set(re.sub(r"\([^)]*\)", " ", entries["lower"]).split()) == lists["lower"]
    assert set(entries["fp32"].split()) == lists["fp32"]
    assert set(entries["promote (fixed)"].split()) == lists["promote"]


# --------------------------------------------------------------------------------------------------
# torch-cpu / torch-cuda against the installed torch and op-lists.md
# --------------------------------------------------------------------------------------------------
TORCH_PRESETS = {"torch-cpu": ("cpu", "AutocastCPU"), "torch-cuda": ("cuda", "AutocastCUDA")}

# Python-level names listed on top of the registered ATen ops -> the registered op(s) they call.
PYTHON_EXTRAS = {
    "torch-cpu": {
        "linalg_matmul": {"matmul"}, "einsum": {"bmm"}, "tensordot": {"mm"}, "inner": {"mm"},
        "chain_matmul": {"mm"}, "linalg_multi_dot": {"mm"}, "matrix_power": {"matmul"},
        "linalg_matrix_power": {"matmul"}, "concat": {"cat"}, "concatenate": {"cat"},
    },
    "torch-cuda": {
        "linalg_matmul": {"matmul"}, "matrix_power": {"matmul"}, "linalg_matrix_power": {"matmul"},
        "arccos": {"acos"}, "arcsin": {"asin"}, "special_expm1": {"expm1"}, "special_log1p": {"log1p"},
        "special_erfinv": {"erfinv"}, "special_logsumexp": {"logsumexp"}, "special_softmax": {"softmax"},
        "special_log_softmax": {"log_softmax"}, "linalg_norm": {"linalg_vector_norm", "linalg_matrix_norm"},
        "cross_entropy_loss": {"log_softmax", "nll_loss"}, "arctan2": {"atan2"}, "inner": {"tensordot"},
    },
}

# Matmul-like ops torch.autocast does not list that the torch-* presets lower, mpt casting them itself (issue 44):
# the grouped GEMM of MoE experts (tuner/engine/grouped.py).
MPT_EXTRAS = GROUPED_MM_OPS


@pytest.mark.parametrize("name", list(TORCH_PRESETS))
def test_mpt_lowers_grouped_gemms_torch_autocast_leaves_fp32(name):
    device, key = TORCH_PRESETS[name]
    assert MPT_EXTRAS <= preset_lists(name)["lower"]
    assert not MPT_EXTRAS & registered(key)  # still not torch.autocast's: else it is no addition of mpt's
    if device == "cpu" and hasattr(torch, "_grouped_mm"):
        a, b = torch.randn(8, 8), torch.randn(2, 8, 4)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert torch._grouped_mm(a, b, offs=torch.tensor([4, 8], dtype=torch.int32)).dtype == torch.float32


# Golden split of the registered ops (torch 2.13), used whatever op-lists.md says or whether it exists.
GOLDEN_TORCH = {
    "torch-cpu": {
        "lower": set("""_addmm_activation _convolution _native_multi_head_attention addbmm addmm baddbmm bmm conv1d
            conv2d conv3d conv_tbc conv_transpose1d conv_transpose2d conv_transpose3d linalg_vecdot linear matmul
            mkldnn_rnn_layer mm prelu scaled_dot_product_attention""".split()),
        "promote": {"cat", "index_copy", "stack"},
        "banned": set(),
    },
    "torch-cuda": {
        "lower": set("""_convolution _scaled_dot_product_flash_attention _thnn_fused_gru_cell _thnn_fused_lstm_cell
            addbmm addmm addmv addr baddbmm bmm chain_matmul conv1d conv2d conv3d conv_tbc conv_transpose1d
            conv_transpose2d conv_transpose3d convolution cudnn_convolution cudnn_convolution_transpose einsum
            gru_cell linalg_multi_dot linalg_vecdot linear lstm_cell matmul mm mv prelu rnn_relu_cell rnn_tanh_cell
            scaled_dot_product_attention _cudnn_rnn""".split()),
        "promote": set("addcdiv addcmul atan2 bilinear cross dot vdot grid_sampler index_put tensordot "
                       "scatter_add".split()),
        "banned": {"binary_cross_entropy"},
    },
}


@pytest.mark.parametrize("name", list(TORCH_PRESETS))
def test_every_registered_op_in_exactly_one_list(name):
    _, key = TORCH_PRESETS[name]
    ops = registered(key)
    assert len(ops) > 50, f"few {key} registrations found: {sorted(ops)}"
    lists = preset_lists(name)
    wrong = {op: classify(lists, op) for op in ops if len(classify(lists, op)) != 1}
    assert not wrong, f"{name}: registered ops not in exactly one list: {wrong}"


@pytest.mark.parametrize("name", list(TORCH_PRESETS))
def test_only_registered_ops_and_declared_python_names(name):
    _, key = TORCH_PRESETS[name]
    lists = preset_lists(name)
    listed = set().union(*lists.values())
    extras = listed - registered(key) - MPT_EXTRAS
    assert extras == set(PYTHON_EXTRAS[name])
    for extra, targets in PYTHON_EXTRAS[name].items():
        kind = classify(lists, extra)
        assert len(kind) == 1
        for target in targets:
            assert classify(lists, target) == kind, f"{extra} -> {target}: lists differ"
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{extra}", "CompositeImplicitAutograd")
        assert extra in known_op_names()
    # Python names that opnames.ALIASES already maps to a listed name are not repeated.
    for extra in extras:
        assert not set(ALIASES.get(extra, ())) & listed, f"{extra} duplicates {ALIASES[extra]}"
    for alias in ("__matmul__", "__rmatmul__", "cross_entropy"):
        assert alias not in listed


@pytest.mark.parametrize("name", list(TORCH_PRESETS))
def test_registered_split_equals_golden(name):
    _, key = TORCH_PRESETS[name]
    ops = registered(key)
    lists = preset_lists(name)
    golden = GOLDEN_TORCH[name]
    for kind in ("lower", "promote", "banned"):
        assert lists[kind] & ops == golden[kind] & ops, f"{name}.{kind}"
    fp32_golden = ops - golden["lower"] - golden["promote"] - golden["banned"]
    assert lists["fp32"] & ops == fp32_golden


@pytest.mark.parametrize("name", list(TORCH_PRESETS))
def test_registered_split_matches_op_lists_md(name):
    device, key = TORCH_PRESETS[name]
    split = md_torch_split(device)
    ops = registered(key)
    lists = preset_lists(name)
    mismatched = {op: (kind, classify(lists, op)) for op, kind in split.items()
                  if op in ops and classify(lists, op) != [kind]}
    assert not mismatched, f"{name}: preset differs from op-lists.md: {mismatched}"
    # Everything op-lists.md names is still registered in the installed torch.
    assert set(split) - ops == set()
    # Registered ops op-lists.md does not know (newer torch) are listed by the preset all the same.
    for op in ops - set(split):
        assert len(classify(lists, op)) == 1


def test_torch_cuda_split_matches_installed_autocast_header():
    header = Path(torch.__file__).parent / "include" / "ATen" / "autocast_mode.h"
    if not header.is_file():
        pytest.skip("torch's C++ headers are not installed")
    text = header.read_text(encoding="utf-8", errors="replace")

    def macro(name):
        m = re.search(r"#define %s\(_\)(.*?)\n\s*\n" % name, text, re.S)
        assert m, name
        return set(re.findall(r"_\((\w+)", m.group(1)))

    lists = preset_lists("torch-cuda")
    ops = registered("AutocastCUDA")
    assert macro("AT_FORALL_LOWER_PRECISION_FP") & ops <= lists["lower"]
    assert macro("AT_FORALL_FP32") & ops <= lists["fp32"]
    assert macro("AT_FORALL_FP32_SET_OPT_DTYPE") & ops <= lists["fp32"]
    assert macro("AT_FORALL_PROMOTE") & ops <= lists["promote"]
    assert "norm" in lists["fp32"]  # fp32_append_dtype (AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE)


# Running ops under torch.autocast("cpu"): the preset's rule must be what autocast does.
BF, F32 = torch.bfloat16, torch.float32


def _r(*shape, dtype=F32):
    return torch.randn(*shape, dtype=dtype)


def _spd(n, dtype):
    a = torch.randn(n, n)
    return (a @ a.T + n * torch.eye(n)).to(dtype)


F_ = torch.nn.functional
CPU_LOWER_PROBES = {
    "addmm": lambda d: torch.addmm(_r(3, 3, dtype=d), _r(3, 4, dtype=d), _r(4, 3, dtype=d)),
    "bmm": lambda d: torch.bmm(_r(2, 3, 4, dtype=d), _r(2, 4, 3, dtype=d)),
    "conv2d": lambda d: F_.conv2d(_r(1, 2, 5, 5, dtype=d), _r(3, 2, 3, 3, dtype=d)),
    "conv_transpose1d": lambda d: F_.conv_transpose1d(_r(1, 2, 5, dtype=d), _r(2, 3, 3, dtype=d)),
    "linear": lambda d: F_.linear(_r(2, 3, dtype=d), _r(4, 3, dtype=d)),
    "matmul": lambda d: torch.matmul(_r(3, 4, dtype=d), _r(4, 3, dtype=d)),
    "prelu": lambda d: F_.prelu(_r(2, 3, dtype=d), _r(1, dtype=d)),
    "linalg_vecdot": lambda d: torch.linalg.vecdot(_r(3, dtype=d), _r(3, dtype=d)),
    "scaled_dot_product_attention": lambda d: F_.scaled_dot_product_attention(
        _r(1, 2, 3, 4, dtype=d), _r(1, 2, 3, 4, dtype=d), _r(1, 2, 3, 4, dtype=d)),
    # Python-level names
    "linalg_matmul": lambda d: torch.linalg.matmul(_r(3, 4, dtype=d), _r(4, 3, dtype=d)),
    "einsum": lambda d: torch.einsum("bij,bjk->bik", _r(2, 3, 4, dtype=d), _r(2, 4, 3, dtype=d)),
    "tensordot": lambda d: torch.tensordot(_r(3, 4, dtype=d), _r(4, 3, dtype=d), dims=1),
    "inner": lambda d: torch.inner(_r(3, 4, dtype=d), _r(2, 4, dtype=d)),
    "chain_matmul": lambda d: torch.chain_matmul(_r(3, 3, dtype=d), _r(3, 3, dtype=d), _r(3, 3, dtype=d)),
    "linalg_multi_dot": lambda d: torch.linalg.multi_dot([_r(3, 3, dtype=d), _r(3, 3, dtype=d), _r(3, 3, dtype=d)]),
    "matrix_power": lambda d: torch.matrix_power(_r(3, 3, dtype=d), 3),
    "linalg_matrix_power": lambda d: torch.linalg.matrix_power(_r(3, 3, dtype=d), 3),
}
CPU_FP32_PROBES = {
    "mse_loss": lambda d: F_.mse_loss(_r(4, dtype=d), _r(4, dtype=d)),
    "cross_entropy_loss": lambda d: F_.cross_entropy(_r(3, 5, dtype=d), torch.tensor([0, 1, 2])),
    "nll_loss": lambda d: F_.nll_loss(_r(3, 5, dtype=d), torch.tensor([0, 1, 2])),
    "binary_cross_entropy": lambda d: F_.binary_cross_entropy(torch.rand(4).to(d), torch.rand(4).to(d)),
    "avg_pool3d": lambda d: F_.avg_pool3d(_r(1, 1, 4, 4, 4, dtype=d), 2),
    "max_pool3d": lambda d: torch.max_pool3d(_r(1, 1, 4, 4, 4, dtype=d), 2),
    "reflection_pad2d": lambda d: torch._C._nn.reflection_pad2d(_r(1, 2, 5, 5, dtype=d), [1, 1, 1, 1]),
    "cdist": lambda d: torch.cdist(_r(3, 2, dtype=d), _r(4, 2, dtype=d)),
    "prod": lambda d: torch.prod(_r(4, dtype=d)),
    "trace": lambda d: torch.trace(_r(3, 3, dtype=d)),
    "cholesky_inverse": lambda d: torch.cholesky_inverse(torch.linalg.cholesky(_spd(3, F32)).to(d)),
    "linalg_inv": lambda d: torch.linalg.inv(_spd(3, d)),
    "linalg_svdvals": lambda d: torch.linalg.svdvals(_r(3, 3, dtype=d)),
    "fft_rfft": lambda d: torch.fft.rfft(_r(8, dtype=d)),
    "quantile": lambda d: torch.quantile(_r(5, dtype=d), 0.5),
    "kl_div": lambda d: F_.kl_div(_r(4, dtype=d), _r(4, dtype=d), reduction="sum"),
    "grid_sampler": lambda d: torch.grid_sampler(_r(1, 1, 4, 4, dtype=d), _r(1, 2, 2, 2, dtype=d).clamp(-1, 1),
                                                 0, 0, False),
}
CPU_PROMOTE_PROBES = {
    "cat": lambda a, b: torch.cat([_r(2, dtype=a), _r(2, dtype=b)]),
    "stack": lambda a, b: torch.stack([_r(2, dtype=a), _r(2, dtype=b)]),
    "index_copy": lambda a, b: torch.index_copy(_r(3, dtype=a), 0, torch.tensor([0]), _r(1, dtype=b)),
    "concat": lambda a, b: torch.concat([_r(2, dtype=a), _r(2, dtype=b)]),
    "concatenate": lambda a, b: torch.concatenate([_r(2, dtype=a), _r(2, dtype=b)]),
}


def _first_float_dtype(out):
    if isinstance(out, (tuple, list)):
        out = next(o for o in out if isinstance(o, torch.Tensor) and (o.is_floating_point() or o.is_complex()))
    return out.dtype


@pytest.mark.filterwarnings("ignore:torch.chain_matmul is deprecated")
@pytest.mark.parametrize("op", sorted(CPU_LOWER_PROBES))
def test_cpu_lower_ops_run_in_bf16_under_autocast(op):
    assert op in load_preset("torch-cpu").lower
    with torch.autocast("cpu", BF):
        assert _first_float_dtype(CPU_LOWER_PROBES[op](F32)) == BF


@pytest.mark.parametrize("op", sorted(CPU_FP32_PROBES))
def test_cpu_fp32_ops_run_in_fp32_under_autocast(op):
    assert op in load_preset("torch-cpu").fp32
    with torch.autocast("cpu", BF):
        assert _first_float_dtype(CPU_FP32_PROBES[op](BF)) in (F32, torch.complex64)


@pytest.mark.parametrize("op", sorted(CPU_PROMOTE_PROBES))
def test_cpu_promote_ops_widen_under_autocast(op):
    assert op in load_preset("torch-cpu").promote
    with torch.autocast("cpu", BF):
        assert CPU_PROMOTE_PROBES[op](BF, F32).dtype == F32
        assert CPU_PROMOTE_PROBES[op](BF, BF).dtype == BF


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_rules_under_autocast():
    pol = load_preset("torch-cuda")
    dev = "cuda"
    a = torch.randn(4, 4, device=dev)
    with torch.autocast("cuda", torch.float16):
        assert "mm" in pol.lower and torch.mm(a, a).dtype == torch.float16
        assert "linalg_matmul" in pol.lower and torch.linalg.matmul(a, a).dtype == torch.float16
        assert "exp" in pol.fp32 and torch.exp(a.half()).dtype == F32
        assert "arccos" in pol.fp32 and torch.arccos(a.half().clamp(-1, 1)).dtype == F32
        assert "rms_norm" in pol.fp32 and F_.rms_norm(a.half(), (4,)).dtype == F32
        assert "softmax" in pol.fp32 and torch.softmax(a.half(), 0).dtype == F32
        assert "atan2" in pol.promote and torch.atan2(a.half(), a).dtype == F32
        assert "arctan2" in pol.promote and torch.arctan2(a.half(), a.half()).dtype == torch.float16
        assert "binary_cross_entropy" in pol.banned
        with pytest.raises(RuntimeError):
            F_.binary_cross_entropy(torch.rand(4, device=dev), torch.rand(4, device=dev))

