"""Options are defined once, as fields of the library's dataclasses (tuner.options.commands): the CLI's click
parameters and the config file's schema are derived from them, a config key and its flag mean the same thing,
and library errors are rendered with the flag's name."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import click
import pytest
import yaml

from mpt_cli import exitcodes
from mpt_cli import options as cli_options
from mpt_cli.main import main
from tuner.core.errors import ConfigError
from tuner.options import commands, config
from tuner.options.commands import COMMANDS, CONFIGURED, TuneCommandOptions
from tuner.options.config import SCHEMA, validate_config
from tuner.options.fields import Kind, option, option_fields, spec_of
from tuner.options.tune import TuneOptions

ASSETS = Path(__file__).parents[1] / "assets"
MODEL = (ASSETS / "valid_model.py").read_text()
CONFIGURED_COMMANDS = [c for c in main.commands.values() if any(p.name == "config_path" for p in c.params)]


def _squeeze(text: str) -> str:
    return "".join(text.split())


def test_every_command_but_presets_takes_a_config():
    assert sorted(c.name for c in CONFIGURED_COMMANDS) == ["check", "inspect", "tune"] == sorted(CONFIGURED)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_field_is_a_click_parameter_of_its_command(name):
    """Each field of a command's options class is a parameter of the command, with the same name, kind, choices,
    default, and nothing else is (but --config and --help)."""
    command = main.commands[name]
    params = [p for p in command.params if p.name not in ("config_path", "help", "debug")]  # --debug: CLI's own
    fields = option_fields(COMMANDS[name])
    assert [p.name for p in params] == [f.name for f in fields]
    for p, f in zip(params, fields, strict=True):
        spec = spec_of(f)
        assert isinstance(p, click.Argument) == spec.positional, f.name
        if isinstance(p, click.Option):
            assert f"--{f.name.replace('_', '-')}" in p.opts, (f.name, p.opts)
            assert p.is_flag == (spec.kind is Kind.BOOL) and p.multiple == spec.multiple
            assert p.help == spec.help
        if spec.kind is Kind.CHOICE:
            assert tuple(p.type.choices) == spec.choices
        elif spec.kind is Kind.INT:
            assert p.type is click.INT
        elif spec.kind is Kind.NUMBER:
            assert p.type is click.FLOAT
        assert p.default == (None if spec.multiple else f.default), f.name
        assert p.metavar == spec.metavar or spec.kind is Kind.BOOL


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_shows_every_fields_help(runner, name):
    res = runner.invoke(main, [name, "--help"])
    assert res.exit_code == 0
    for f in dataclasses.fields(COMMANDS[name]):
        assert _squeeze(spec_of(f).help) in _squeeze(res.output), f.name


@pytest.mark.parametrize("name", CONFIGURED)
def test_every_field_is_a_config_key_of_the_same_kind(name):
    for f in dataclasses.fields(COMMANDS[name]):
        spec, key = spec_of(f), SCHEMA[f.name]
        assert name in key.commands
        assert (key.kind, key.choices, key.minimum, key.exclusive_min) == \
            (spec.kind, spec.choices, spec.minimum, spec.exclusive_min), f.name
    assert {k for k, key in SCHEMA.items() if name in key.commands} == \
        {f.name for f in dataclasses.fields(COMMANDS[name])}


def test_schema_kinds_come_from_the_fields():
    assert SCHEMA["model"].kind == "model-file" and SCHEMA["build"].kind == "function"
    assert SCHEMA["max_evals"].kind == "int" and SCHEMA["max_evals"].minimum == 2
    assert SCHEMA["time_budget"].kind == "number" and SCHEMA["time_budget"].exclusive_min
    assert SCHEMA["device"].choices == ("cpu", "cuda") and SCHEMA["resume"].kind == "bool"
    assert SCHEMA["dtype"].choices == ("bf16", "fp16", "bfloat16", "float16", "half")
    assert SCHEMA["out"].kind == "path" and SCHEMA["out"].commands == {"tune", "check"}
    assert SCHEMA["model"].commands == {"tune", "inspect", "check"}
    assert "version" not in SCHEMA and "config" not in SCHEMA and "lists_only" not in SCHEMA


def test_a_key_has_one_kind_in_every_command():
    assert config.schema() == dict(SCHEMA)  # schema() refuses a key with two kinds


def test_adding_an_option_is_one_field(monkeypatch, runner, tmp_path):
    """A new field on the tune options is a flag of `mpt tune` (with its help and bound) and a config key."""

    @dataclasses.dataclass(frozen=True)
    class WithKnob(TuneCommandOptions):
        knob: int | None = option(None, "A new knob for the search.", Kind.INT, minimum=2, metavar="N")

    monkeypatch.setitem(COMMANDS, "tune", WithKnob)
    seen: list[TuneCommandOptions] = []

    @click.command("tune")
    @cli_options.options("tune")
    def tune(**values):
        seen.append(cli_options.command_options(values))

    res = runner.invoke(tune, ["--help"])
    assert "--knob N" in res.output and "A new knob for the search." in res.output
    assert runner.invoke(tune, ["m.py", "--knob", "5"]).exit_code == 0
    assert seen[-1].knob == 5 and seen[-1].model == "m.py"
    with pytest.raises(ConfigError, match="knob: expected an integer >= 2, found 1"):
        WithKnob(model="m.py", knob=1)
    schema = config.schema()
    assert schema["knob"].kind == "int" and schema["knob"].minimum == 2 and schema["knob"].commands == {"tune"}
    assert validate_config({"version": 1, "knob": 4}, schema) == {"knob": 4}


def test_the_options_import_no_torch():
    """`mpt` checks its options before it imports torch (its first line comes first)."""
    code = ("import sys; import mpt_cli.main; from tuner.options.commands import TuneCommandOptions; "
            "import tuner.options.config; TuneCommandOptions(model='m.py', dtype='fp16', preset='hmp'); "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_model_and_build_mean_the_same_everywhere():
    tune, check = main.commands["tune"], main.commands["check"]
    assert [p.name for p in tune.params if isinstance(p, click.Argument)] == ["model"]
    assert [p.name for p in check.params if isinstance(p, click.Argument)] == ["out"]
    model_option = next(p for p in check.params if p.name == "model")
    assert model_option.opts == ["--model"]
    for command in main.commands.values():
        assert not any("--model-file" in getattr(p, "opts", ()) for p in command.params)
        build = [p for p in command.params if p.name == "build"]
        assert command.name == "presets" or build[0].opts == ["--build"]


def test_library_options_validate_once_with_one_wording():
    with pytest.raises(ConfigError) as info:
        TuneOptions(tolerance=2)
    assert info.value.errors == ["tolerance: a relative tolerance must be below 1 (0.01 = 1%), found 2; "
                                 "set `absolute` for an absolute drop"]
    assert TuneOptions(tolerance=2, absolute=True).tolerance == 2
    assert TuneOptions(dtype="bfloat16").dtype == "bf16" and TuneOptions(device="cuda").preset == "torch-cuda"
    with pytest.raises(ConfigError) as info:
        TuneCommandOptions(model="m.py", resume=True, overwrite=True)
    assert info.value.errors == ["resume and overwrite: give one of them, not both"]
    assert commands.InspectOptions(model="m.py", module={"a.b": "fp32"}).modules() == {"a.b": "fp32"}
    with pytest.raises(ConfigError, match="give `preset` or `plan`, not both"):
        commands.InspectOptions(model="m.py", preset="hmp", plan="p.yaml")


# --- a config key and its flag give the same result ------------------------------------------------------------

@pytest.fixture
def model(tmp_path) -> Path:
    path = tmp_path / "model.py"
    path.write_text(MODEL + "\n\ndef make():\n    return build_model()\n")
    return path


@pytest.mark.parametrize("yaml_line,flags", [
    ("dtype: fp16", ["--dtype", "fp16"]),
    ("preset: hmp-o1", ["--preset", "hmp-o1"]),
    ("module: {'0': fp32}", ["--module", "0=fp32"]),
    ("top: 1", ["--top", "1"]),
    ("build: make", ["--build", "make"]),
])
def test_config_key_and_flag_agree(runner, tmp_path, model, yaml_line, flags):
    by_flag = runner.invoke(main, ["inspect", str(model), "--json", *flags])
    assert by_flag.exit_code == 0, by_flag.output
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"version: 1\nmodel: model.py\njson: true\n{yaml_line}\n")
    by_key = runner.invoke(main, ["inspect", "--config", str(cfg)])
    assert by_key.exit_code == 0, by_key.output
    assert json.loads(by_key.stdout) == json.loads(by_flag.stdout)


def test_a_bad_value_says_the_same_as_flag_and_key(runner, tmp_path, model):
    by_flag = runner.invoke(main, ["tune", str(model), "--max-evals", "1", "--out", str(tmp_path / "o")])
    assert by_flag.exit_code == exitcodes.USAGE
    assert by_flag.stderr.startswith("mpt: error: --max-evals: expected an integer >= 2, found 1")
    cfg = tmp_path / "c.yaml"
    cfg.write_text("version: 1\nmax_evals: 1\n")
    by_key = runner.invoke(main, ["tune", str(model), "--config", str(cfg)])
    assert by_key.exit_code == exitcodes.USAGE
    assert by_key.stderr.startswith(f"mpt: error: {cfg}: max_evals: expected an integer >= 2, found 1")
    assert not (tmp_path / "o").exists()


def test_rules_over_several_options_name_the_flags(runner, tmp_path, model):
    res = runner.invoke(main, ["tune", str(model), "--tolerance", "5", "--resume", "--overwrite"])
    assert res.exit_code == exitcodes.USAGE
    assert "--tolerance: a relative tolerance must be below 1 (0.01 = 1%), found 5.0; set --absolute" in res.stderr
    assert "--resume and --overwrite: give one of them, not both" in res.stderr
    assert "2 problems" in res.stderr
    res = runner.invoke(main, ["inspect", str(model), "--preset", "hmpp"])
    assert res.exit_code == exitcodes.USAGE and "--preset: unknown preset 'hmpp'; did you mean hmp" in res.stderr


def test_the_library_speaks_keys():
    with pytest.raises(ConfigError) as info:
        TuneCommandOptions(model="m.py", max_evals=1, tolerance=5.0, absolute=False)
    assert info.value.fields == ("max_evals", "tolerance")
    assert info.value.errors[0] == "max_evals: expected an integer >= 2, found 1"
    assert "set `absolute`" in info.value.errors[1]
    with pytest.raises(ConfigError) as info:
        validate_config({"version": 1, "max_eval": 3, "top": 0}, SCHEMA)
    assert info.value.fields == ("max_eval", "top")


def test_check_takes_the_model_file_from_flag_or_key(runner, tmp_path, model):
    out = tmp_path / "run"
    assert runner.invoke(main, ["tune", str(model), "--out", str(out), "-q"]).exit_code == 0
    plan = out / "plan.yaml"
    data = yaml.safe_load(plan.read_text())
    del data["model"]  # a plan that does not say which model it was made for
    plan.write_text(yaml.safe_dump(data))
    res = runner.invoke(main, ["check", str(out)])
    assert res.exit_code == exitcodes.USAGE and "--model: " in res.stderr
    assert runner.invoke(main, ["check", str(out), "--model", str(model)]).exit_code == 0
    cfg = tmp_path / "c.yaml"
    cfg.write_text("version: 1\nmodel: model.py\nout: run\n")
    res = runner.invoke(main, ["check", "--config", str(cfg)])
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize(("arch", "metric"), [
    ("GPT2LMHeadModel", "agreement"), ("XLMWithLMHeadModel", "agreement"), ("LlamaForCausalLM", "agreement"),
    ("BertForSequenceClassification", "agreement"), ("T5ForConditionalGeneration", "agreement"),
    ("BertModel", "cosine"), ("BertForQuestionAnswering", "cosine"), ("DPTForDepthEstimation", "cosine"),
    ("MarianMTModel", "agreement"), ("SegformerForSemanticSegmentation", "agreement"),
    ("ElectraForPreTraining", "agreement"), ("BertForTokenClassification", "agreement"), ("MarianModel", "cosine"),
    ("ViTMAEForPreTraining", "cosine")])
def test_an_hf_folders_default_metric_follows_what_its_class_outputs(tmp_path, arch, metric):
    """Logits over a vocabulary or classes get agreement, whatever the class is called (no "For" in GPT-2's
    LM head, `MarianMTModel` a sequence-to-sequence LM by transformers' own task lists); embeddings, spans and
    regressions get cosine."""
    (tmp_path / "config.json").write_text(json.dumps({"architectures": [arch]}))
    assert TuneCommandOptions(model=f"hf:{tmp_path}").metric == metric


@pytest.mark.parametrize("changed, named", [({"thorough": True}, "thorough"), ({"rank": "exact"}, "rank")])
def test_resume_refuses_a_changed_thorough_or_rank(tmp_path, changed, named):
    """A journal's trials came from one way of searching: --resume with another --thorough/--rank would mix two
    searches (and rewrite outputs missing a journaled trial), so it is refused naming the option."""
    from tuner.core.errors import ConfigError
    from tuner.workspace.journal import Journal, RunFingerprint

    def journal(options: TuneOptions, resume: bool) -> Journal:
        return Journal(tmp_path / "journal.jsonl", RunFingerprint("s", "w", options.settings()), resume=resume)

    journal(TuneOptions(), resume=False).append("baseline#1", {"metric": 1.0, "seconds": 0.1})
    with pytest.raises(ConfigError, match=f"`{named}` was not set when the journal was written and is .* now"):
        journal(TuneOptions(**changed), resume=True)
    assert journal(TuneOptions(), resume=True).get("baseline#1") is not None  # unchanged: resumes
    journal(TuneOptions(**changed), resume=False).append("baseline#1", {"metric": 1.0, "seconds": 0.1})
    with pytest.raises(ConfigError, match=f"`{named}` was .* when the journal was written and is not set now"):
        journal(TuneOptions(), resume=True)
    assert journal(TuneOptions(**changed), resume=True).get("baseline#1") is not None


def test_for_training_with_a_builtin_metric_and_seeds_without_training_are_refused():
    """Issue 45: a built-in metric only runs forwards (nothing trains), and --seeds trains each trial N times."""
    from tuner.core.errors import ConfigError

    with pytest.raises(ConfigError, match="for_training: the built-in metric agreement only runs forwards"):
        TuneOptions(for_training=True, metric="agreement")
    with pytest.raises(ConfigError, match="seeds: 3 training runs per trial need `for_training`"):
        TuneOptions(seeds=3)
    assert TuneOptions(seeds=3, for_training=True).settings()["seeds"] == 3
    assert "seeds" not in TuneOptions(for_training=True).settings()  # journals from before --seeds still resume
