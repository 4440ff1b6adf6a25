"""Op-list files (HMP/Gaudi text format and YAML), list validation and custom policies."""
from __future__ import annotations

import pytest

from tuner.core.errors import ConfigError
from tuner.policy.presets import Policy, custom_policy, load_preset, read_op_list, write_op_list


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# ----- text files -------------------------------------------------------------------------------
def test_text_file_with_comments_and_blank_lines(tmp_path):
    path = write(tmp_path, "ops_bf16.txt", "# my BF16 list\n\nlinear\n  conv2d  \n\n# a comment\nmm  # trailing\n\n")
    assert read_op_list(path) == ["linear", "conv2d", "mm"]


def test_text_file_without_suffix_and_without_final_newline(tmp_path):
    path = write(tmp_path, "lower_list", "bmm\nsoftmax")
    assert read_op_list(path) == ["bmm", "softmax"]


def test_empty_text_file_is_an_empty_list(tmp_path):
    assert read_op_list(write(tmp_path, "empty.txt", "# nothing here\n\n")) == []


def test_text_file_accepts_aten_and_dunder_names(tmp_path):
    path = write(tmp_path, "ops.txt", "cross_entropy_loss\nfeature_dropout\n__matmul__\niadd\ntruediv\n")
    assert read_op_list(path) == ["cross_entropy_loss", "feature_dropout", "__matmul__", "iadd", "truediv"]


# ----- YAML files -------------------------------------------------------------------------------
def test_yaml_list(tmp_path):
    path = write(tmp_path, "lower.yaml", "# comment\n- linear\n- conv2d\n- bmm\n")
    assert read_op_list(path) == ["linear", "conv2d", "bmm"]


def test_yaml_flow_list_with_yml_suffix(tmp_path):
    path = write(tmp_path, "lower.yml", "[linear, matmul]\n")
    assert read_op_list(path) == ["linear", "matmul"]


def test_yaml_ops_mapping(tmp_path):
    path = write(tmp_path, "fp32.yaml", "version: 1\nops:\n  - softmax\n  - log_softmax\n")
    assert read_op_list(path) == ["softmax", "log_softmax"]


def test_yaml_ops_mapping_without_version(tmp_path):
    path = write(tmp_path, "fp32.yaml", "ops: [nll_loss]\n")
    assert read_op_list(path) == ["nll_loss"]


def test_yaml_mapping_with_unknown_key(tmp_path):
    path = write(tmp_path, "bad.yaml", "ops: [linear]\nlower: [mm]\n")
    with pytest.raises(ConfigError) as exc:
        read_op_list(path)
    assert "lower" in str(exc.value) and "ops:" in str(exc.value)


def test_yaml_that_is_not_a_list(tmp_path):
    path = write(tmp_path, "bad.yaml", "linear\n")
    with pytest.raises(ConfigError, match="expected a YAML list"):
        read_op_list(path)


def test_yaml_ops_mapping_that_is_not_a_list(tmp_path):
    path = write(tmp_path, "bad.yaml", "ops: linear\n")
    with pytest.raises(ConfigError, match="expected a YAML list"):
        read_op_list(path)


def test_yaml_non_string_entry(tmp_path):
    path = write(tmp_path, "bad.yaml", "- linear\n- 3\n")
    with pytest.raises(ConfigError) as exc:
        read_op_list(path)
    assert "non-empty strings" in str(exc.value) and "3" in str(exc.value)


def test_malformed_yaml(tmp_path):
    path = write(tmp_path, "broken.yaml", "ops: [linear, conv2d\n  - : :\n")
    with pytest.raises(ConfigError) as exc:
        read_op_list(path)
    assert "malformed YAML at line 2" in str(exc.value)
    assert str(path) in str(exc.value)


# ----- errors -----------------------------------------------------------------------------------
def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        read_op_list(tmp_path / "nope.txt")


def test_unknown_name_with_suggestion(tmp_path):
    path = write(tmp_path, "ops.txt", "lineer\n")
    with pytest.raises(ConfigError) as exc:
        read_op_list(path)
    msg = str(exc.value)
    assert "unknown op 'lineer'" in msg
    assert "did you mean" in msg and "linear" in msg
    assert "ops.txt" in msg


def test_unknown_name_in_yaml_with_suggestion(tmp_path):
    path = write(tmp_path, "ops.yaml", "ops: [softmaks]\n")
    with pytest.raises(ConfigError) as exc:
        read_op_list(path)
    assert "softmaks" in str(exc.value) and "softmax" in str(exc.value)


def test_duplicate_name(tmp_path):
    path = write(tmp_path, "ops.txt", "linear\nmm\nlinear\n")
    with pytest.raises(ConfigError) as exc:
        read_op_list(path)
    assert "'linear' is listed twice" in str(exc.value)


def test_all_problems_reported_at_once(tmp_path):
    path = write(tmp_path, "ops.txt", "lineer\nconv2d\nsofmax\nconv2d\n")
    with pytest.raises(ConfigError) as exc:
        read_op_list(path)
    err = exc.value
    msg = str(err)
    assert len(err.errors) == 3
    assert "lineer" in msg and "linear" in msg
    assert "sofmax" in msg and "softmax" in msg
    assert "'conv2d' is listed twice" in msg
    assert "3 problems" in msg


def test_two_bad_names_both_in_message(tmp_path):
    path = write(tmp_path, "ops.yaml", "- lineer\n- matmull\n")
    with pytest.raises(ConfigError) as exc:
        read_op_list(path)
    assert len(exc.value.errors) == 2
    assert "lineer" in str(exc.value) and "matmull" in str(exc.value)


def test_write_then_read_round_trip(tmp_path):
    path = tmp_path / "out.txt"
    write_op_list(path, ["mm", "linear", "conv2d", "mm"], header="made by a test\nsecond line")
    text = path.read_text(encoding="utf-8")
    assert text.startswith("# made by a test\n# second line\n")
    assert read_op_list(path) == ["conv2d", "linear", "mm"]


# ----- Policy validation ------------------------------------------------------------------------
def test_op_in_lower_and_fp32_is_an_error():
    with pytest.raises(ConfigError) as exc:
        Policy(name="p", lower=frozenset({"linear", "mm"}), fp32=frozenset({"linear", "softmax"}))
    assert exc.value.errors == ["ops in both the lower-precision and the FP32 list: linear"]
    assert "linear" in str(exc.value) and "policy 'p'" in str(exc.value)


def test_policy_reports_overlap_and_unknown_names_together():
    with pytest.raises(ConfigError) as exc:
        Policy(name="p", lower=frozenset({"bmm", "lineer"}), fp32=frozenset({"bmm"}), unlisted="sometimes")
    errors = exc.value.errors
    assert any("bmm" in e and "both" in e for e in errors)
    assert any("lineer" in e for e in errors)
    assert any("unlisted" in e for e in errors)
    assert len(errors) == 3


def test_op_in_promote_and_lower_is_allowed():
    pol = Policy(name="p", lower=frozenset({"mul"}), promote=frozenset({"mul", "add"}))
    assert pol.rule_for("mul")[0] == "lower"
    assert pol.rule_for("add")[0] == "promote"


# ----- custom_policy ----------------------------------------------------------------------------
def test_custom_policy_lower_file_replaces_the_list(tmp_path):
    base = load_preset("hmp")
    path = write(tmp_path, "bf16.txt", "linear\nsoftmax\n")
    pol = custom_policy(base, lower_file=path)
    assert pol.lower == {"linear", "softmax"}
    assert "softmax" not in pol.fp32  # the custom lower list wins over the default FP32 list
    assert pol.fp32 == base.fp32 - {"softmax"}
    assert pol.promote == base.promote
    assert pol.unlisted == base.unlisted and pol.inplace == base.inplace
    assert pol.name == "hmp+custom"
    assert pol.native is None
    assert pol.rule_for("conv2d") == ("first_input", "unlisted: first input")


def test_custom_policy_fp32_file_replaces_the_list(tmp_path):
    base = load_preset("hmp")
    path = write(tmp_path, "fp32.yaml", "ops: [linear, topk]\n")
    pol = custom_policy(base, fp32_file=path)
    assert pol.fp32 == {"linear", "topk"}
    assert pol.lower == base.lower - {"linear"}


def test_custom_policy_both_files(tmp_path):
    base = load_preset("gaudi")
    lower = write(tmp_path, "lower.txt", "linear\n")
    fp32 = write(tmp_path, "fp32.txt", "softmax\n")
    pol = custom_policy(base, lower_file=lower, fp32_file=fp32)
    assert (pol.lower, pol.fp32) == ({"linear"}, {"softmax"})


def test_custom_policy_both_files_overlapping_is_an_error(tmp_path):
    lower = write(tmp_path, "lower.txt", "linear\n")
    fp32 = write(tmp_path, "fp32.txt", "linear\n")
    with pytest.raises(ConfigError, match="linear"):
        custom_policy(load_preset("hmp"), lower_file=lower, fp32_file=fp32)


def test_custom_policy_bad_file_is_reported(tmp_path):
    path = write(tmp_path, "bf16.txt", "lineer\nconvv2d\n")
    with pytest.raises(ConfigError) as exc:
        custom_policy(load_preset("hmp"), lower_file=path)
    assert "lineer" in str(exc.value) and "convv2d" in str(exc.value)


def test_custom_policy_of_a_native_preset_is_not_native(tmp_path):
    path = write(tmp_path, "lower.txt", "linear\n")
    pol = custom_policy(load_preset("torch-cpu"), lower_file=path)
    assert pol.native is None
    assert pol.device == "cpu"
