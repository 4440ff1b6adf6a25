"""Every option of the mpt commands, defined once; the config file's schema is derived from them.

An option's long name is its config key (`--max-evals` <-> `max_evals`); a
positional argument has a key too (`MODEL.py` <-> `model`, `mpt check`'s
`DIR` <-> `out`). Each click parameter built here carries its key, and
`config_schema` reads the keys, kinds, choices and lower bounds back from the
commands' click parameters, so a config key cannot mean something other than
its flag. The checks themselves live in `tuner.options.config`: click only parses.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import click
from click.core import ParameterSource

from tuner.core.limits import MIN_MAX_EVALS

from . import exitcodes
from .render import err

TUNE, INSPECT, CHECK, PRESETS = "tune", "inspect", "check", "presets"
DTYPES = ("bf16", "fp16", "bfloat16", "float16", "half")
DEVICES = ("cpu", "cuda")


class Kind(click.ParamType):
    """A string whose checks belong to the library (`tuner.options.config` kinds): the CLI passes it on."""

    def __init__(self, kind: str) -> None:
        self.name = kind

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        return value


class Bounded(click.ParamType):
    """An int or float with a lower bound; `tuner.options.config` enforces the bound for flags and config keys alike."""

    def __init__(self, kind: str, minimum: float, *, exclusive: bool = False) -> None:
        self.name, self.minimum, self.exclusive = kind, minimum, exclusive
        self._base = click.INT if kind == "int" else click.FLOAT

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        return self._base.convert(value, param, ctx)


class KeyedOption(click.Option):
    """A click option that knows its config key."""

    def __init__(self, *args: Any, config_key: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.config_key = config_key


class HelpArgument(click.Argument):
    """A positional argument with a help text, listed under "Positional arguments" in --help."""

    def __init__(self, *args: Any, help: str = "", **kwargs: Any) -> None:  # noqa: A002
        super().__init__(*args, **kwargs)
        self.help = help


class KeyedArgument(HelpArgument):
    """A positional argument that knows its config key and its help."""

    def __init__(self, *args: Any, config_key: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.config_key = config_key


@dataclass(frozen=True)
class Param:
    """One option: its key (flag `--key-with-dashes`), the commands' parameter name, and where it is used.

    `per_command` overrides click settings (default, help) for one command;
    `positional` lists the commands that take it as their argument. A
    `negatable` flag is on by default and spelled `--key/--no-key`; its config
    key is `key: true|false`.
    """

    key: str
    dest: str
    help: str
    commands: tuple[str, ...]
    type: Any = None
    metavar: str | None = None
    flag: bool = False
    multiple: bool = False
    short: str | None = None
    default: Any = None
    positional: tuple[str, ...] = ()
    negatable: bool = False
    per_command: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @property
    def flag_name(self) -> str:
        return "--" + self.key.replace("_", "-")

    def decorator(self, command: str) -> Callable[[Any], Any]:
        settings: dict[str, Any] = {"help": self.help, "default": self.default, "type": self.type,
                                    "metavar": self.metavar, **self.per_command.get(command, {})}
        if command in self.positional:
            return click.argument(self.dest, cls=KeyedArgument, config_key=self.key, required=False, **settings)
        if self.flag:
            settings.pop("type")
            settings.pop("metavar")
            settings["default"] = bool(settings["default"])
        first = f"{self.flag_name}/--no-{self.flag_name[2:]}" if self.flag and self.negatable else self.flag_name
        decls = [first, *([self.short] if self.short else []), self.dest]
        return click.option(*decls, cls=KeyedOption, config_key=self.key, is_flag=self.flag,
                            multiple=self.multiple, show_default=settings["default"] not in (None, False),
                            **settings)


ALL = (TUNE, INSPECT, CHECK)
FUNCTION = Kind("function")

PARAMS: tuple[Param, ...] = (
    Param("model", "model_file", "The model file: build_model(), evaluate(model), example_inputs(); "
          "MODEL.py:NAME picks another builder.",
          ALL, Kind("model-file"), "MODEL.py[:build_fn]", positional=(TUNE, INSPECT),
          per_command={CHECK: {"help": "The model file, MODEL.py or MODEL.py:NAME (default: the one the plan "
                                       "records, relative to DIR)."}}),
    Param("out", "out_dir", "Output folder; `mpt check` reads it.", (TUNE, CHECK), click.Path(), "DIR",
          default="mpt-out", positional=(CHECK,),
          per_command={CHECK: {"default": None, "help": "The folder `mpt tune --out` wrote, or its plan.yaml."}}),
    Param("dtype", "dtype", "Lower precision to use (bf16/bfloat16 or fp16/float16/half).", (TUNE, INSPECT),
          click.Choice(DTYPES, case_sensitive=False), default="bf16", per_command={INSPECT: {"default": None}}),
    Param("preset", "preset", "Op-list preset (see `mpt presets`). Default: torch-cpu; torch-cuda for "
          "`mpt tune --device cuda`. torch-cpu is torch.autocast's CPU list: matmuls/convs in the lower dtype, "
          "where AVX512-BF16/AMX give the speed; other ops follow their inputs.", (TUNE, INSPECT),
          Kind("preset"), "NAME"),
    Param("plan", "plan_path", "Plan to apply: a plan.yaml or a `mpt tune` output folder.", (INSPECT,),
          click.Path(), "FILE|DIR"),
    Param("module", "module_overrides", "Per-module override, e.g. --module 'encoder.layers.0.*=fp32'. Repeatable.",
          (INSPECT,), Kind("modules"), "PATH=DTYPE", multiple=True),
    Param("lower_list", "lower_list", "Op-list file (one op per line, HMP/Gaudi format, or YAML) replacing the "
          "preset's lower-precision list.", (INSPECT,), click.Path(), "FILE"),
    Param("fp32_list", "fp32_list", "Op-list file replacing the preset's FP32 list.", (INSPECT,), click.Path(),
          "FILE"),
    Param("tolerance", "tolerance", "Allowed loss against the FP32 baseline: relative (0.01 = 1%) unless "
          "--absolute.", (TUNE, CHECK), Bounded("number", 0), "X", default=0.01,
          per_command={CHECK: {"default": None, "help": "Override the plan's tolerance (default: the one it was "
                                                         "tuned with, in plan.yaml)."}}),
    Param("absolute", "absolute", "Treat --tolerance as an absolute drop of the metric.", (TUNE,), flag=True),
    Param("lower_is_better", "lower_is_better", "The metric is a loss/perplexity: lower is better.", (TUNE,),
          flag=True),
    Param("max_evals", "max_evals", "Stop after N full evaluations (the baseline's runs included; at least 3).",
          (TUNE,), Bounded("int", MIN_MAX_EVALS), "N"),
    Param("time_budget", "time_budget", "Seconds from the start of the command; no evaluation is started that "
          "would end after it (the best confirmed plan is kept).", (TUNE,),
          Bounded("number", 0, exclusive=True), "SECONDS"),
    Param("resume", "resume", "Continue the run in --out; finished evaluations are not repeated.", (TUNE,),
          flag=True),
    Param("overwrite", "overwrite", "Replace a previous run in --out.", (TUNE,), flag=True),
    Param("device", "device", "Where to run the model; a dtype the device cannot run is refused before any "
          "evaluation.", (TUNE, CHECK), click.Choice(DEVICES), default="cpu"),
    Param("thorough", "thorough", "Prove every FP32 instance necessary (more evaluations).", (TUNE,), flag=True),
    Param("latency", "latency", "Time the tuned model against FP32 on the example inputs after the search "
          "(report.json latency_ms); --no-latency skips it (latency_ms: null, no slower-than-FP32 warning).",
          (TUNE,), flag=True, default=True, negatable=True),
    Param("rank", "rank", "How to rank op instances before the search: gradient = one forward with every op's "
          "low-precision error plus a few backward passes (first-order damage to the output); exact = one "
          "forward per op instance (slower; catches saturation effects).", (TUNE,),
          click.Choice(("gradient", "exact")), default="gradient"),
    Param("checkpoint", "checkpoint", "Evaluate DIR/model.safetensors (the stored weights) instead of the "
          "weights build_model gives now.", (CHECK,), flag=True),
    Param("json", "as_json", "Print one JSON document for scripts instead of the table or verdict line.",
          (INSPECT, CHECK), flag=True),
    Param("junit", "junit_path", "Also write a JUnit XML report to FILE.", (CHECK,), click.Path(), "FILE"),
    Param("top", "top", "Show only the N calls that add the most error themselves (local; error where local is "
          "unknown).", (INSPECT,), Bounded("int", 1), "N"),
    Param("quiet", "quiet", "Only the final verdict.", (TUNE,), flag=True, short="-q"),
    Param("build", "model_fn", "Model builder build_model() -> nn.Module (default: build_model).", ALL, FUNCTION,
          "NAME|FILE.py:NAME"),
    Param("eval", "eval_fn", "Metric function evaluate(model) -> float (default: evaluate).", ALL, FUNCTION,
          "NAME|FILE.py:NAME"),
    Param("inputs", "inputs_fn", "Function giving example inputs (default: example_inputs).", ALL, FUNCTION,
          "NAME|FILE.py:NAME"),
    Param("lists_only", "lists_only", "Print just that list, one op per line (the HMP/Gaudi list-file format).",
          (PRESETS,), click.Choice(("lower", "fp32", "promote"))),
)


class ConfigUsageError(click.ClickException):
    """A bad --config file: printed as `mpt: error: ...` (every problem listed), exit code 2."""

    exit_code = exitcodes.USAGE

    def show(self, file: Any = None) -> None:
        err(self.format_message())


def _load_config(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--config's callback: the file's values become click's default_map (defaults < config < flags)."""
    if not value or ctx.resilient_parsing:
        return value
    from tuner.core.errors import ConfigError
    from tuner.options.config import load_config

    root = ctx.find_root().command
    commands = root.commands.values() if isinstance(root, click.Group) else [ctx.command]
    try:
        values = load_config(value, config_schema(commands), command=ctx.command.name)
    except ConfigError as exc:
        raise ConfigUsageError(str(exc)) from None
    dest = {p.config_key: p.name for p in _keyed(ctx.command)}
    ctx.default_map = {**(ctx.default_map or {}), **{dest[k]: v for k, v in values.items()}}
    return value


CONFIG = click.option("--config", "config_path", default=None, metavar="FILE", is_eager=True, callback=_load_config,
                      help="YAML config: keys are the long option names with underscores (max_evals, "
                           "lower_is_better, ...), model for the model file, out for the output folder, plus "
                           "version: 1. Paths in it are relative to the file; flags on the command line win.")


def options(command: str, *, config: bool = True) -> Callable[[Any], Any]:
    """Decorator adding `command`'s parameters in registry order, the argument first (and --config last)."""
    params = [p for p in PARAMS if command in p.commands]
    params.sort(key=lambda p: command not in p.positional)

    def apply(fn: Any) -> Any:
        decorators = [p.decorator(command) for p in params] + ([CONFIG] if config else [])
        for decorate in reversed(decorators):
            fn = decorate(fn)
        return fn

    return apply


def _keyed(command: click.Command) -> list[Any]:
    return [p for p in command.params if hasattr(p, "config_key")]


def _kind(param: click.Parameter) -> dict[str, Any]:
    """Key fields from a click parameter: kind, choices and lower bound."""
    if isinstance(param, click.Option) and param.is_flag:
        return {"kind": "bool"}
    t = param.type
    if isinstance(t, click.Choice):
        return {"kind": "choice", "choices": tuple(str(c) for c in t.choices)}
    if isinstance(t, Bounded):
        return {"kind": t.name, "minimum": t.minimum, "exclusive_min": t.exclusive}
    if isinstance(t, click.Path):
        return {"kind": "path"}
    if isinstance(t, Kind):
        return {"kind": t.name}
    return {"kind": {click.INT: "int", click.FLOAT: "number", click.BOOL: "bool"}.get(t, "str")}


def config_schema(commands: Iterable[click.Command]) -> dict[str, Any]:
    """{config key: tuner.options.config.Key} from the click parameters of the commands that take --config."""
    return schema([c for c in commands if any(p.name == "config_path" for p in c.params)])


def schema(commands: Iterable[click.Command]) -> dict[str, Any]:
    """{key: tuner.options.config.Key} from the commands' keyed click parameters; one key has one kind everywhere."""
    from tuner.options.config import Key

    fields: dict[str, dict[str, Any]] = {}
    users: dict[str, set[str]] = {}
    for command in commands:
        for p in _keyed(command):
            derived = {**_kind(p), "help": p.help or ""}
            known = fields.setdefault(p.config_key, derived)
            if {k: v for k, v in known.items() if k != "help"} != {k: v for k, v in derived.items() if k != "help"}:
                raise AssertionError(f"config key {p.config_key} has two kinds: {known} and {derived}")
            users.setdefault(p.config_key, set()).add(command.name or "")
    return {key: Key(commands=frozenset(users[key]), **f) for key, f in fields.items()}


def command_values(ctx: click.Context) -> tuple[dict[str, Any], set[str]]:
    """The command's option values by config key, and the keys given on the command line."""
    values: dict[str, Any] = {}
    given: set[str] = set()
    for p in _keyed(ctx.command):
        values[p.config_key] = ctx.params.get(p.name)
        if ctx.get_parameter_source(p.name) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT):
            given.add(p.config_key)
    return values, given


def display_names(command: click.Command) -> dict[str, str]:
    """How the command line spells each config key: `--max-evals`, or the argument's metavar (`DIR`)."""
    names: dict[str, str] = {}
    for p in _keyed(command):
        if isinstance(p, click.Argument):
            names[p.config_key] = p.metavar or p.name.upper()
        else:
            names[p.config_key] = max((o for o in p.opts if o.startswith("--")), key=len)
    return names
