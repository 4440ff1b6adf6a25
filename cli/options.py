"""The commands' click parameters, made from the library's options dataclasses (tuner.options.commands).

A field becomes an option named after it (`max_evals` -> `--max-evals`) or,
where its Spec says so, the command's positional argument; the click
parameter's name is the field's name, so a command's `**values` build its
options class directly (`command_options`). Click only parses: every check
is the dataclass's (`mpt: error: --max-evals: ...`), except the lists of
choices, which click shows in --help and refuses itself.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import click
from click.core import ParameterSource

from tuner.options.commands import COMMANDS
from tuner.options.fields import Kind, Options, option_fields, spec_of

from . import exitcodes
from .render import err

TUNE, INSPECT, CHECK, PRESETS = "tune", "inspect", "check", "presets"
CONFIG_PARAM = "config_path"


class LibraryChecked(click.ParamType):
    """A string whose checks belong to the library (its options dataclass): the CLI passes it on."""

    def __init__(self, kind: Kind) -> None:
        self.name = kind.value

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        return value


class HelpArgument(click.Argument):
    """A positional argument with a help text, listed under "Positional arguments" in --help."""

    def __init__(self, *args: Any, help: str = "", **kwargs: Any) -> None:  # noqa: A002
        super().__init__(*args, **kwargs)
        self.help = help


def _click_type(kind: Kind, choices: tuple[str, ...]) -> Any:
    if kind is Kind.CHOICE:
        return click.Choice(choices, case_sensitive=False)
    return {Kind.INT: click.INT, Kind.NUMBER: click.FLOAT, Kind.PATH: click.Path()}.get(kind) or LibraryChecked(kind)


def _param(f: dataclasses.Field[Any]) -> Callable[[Any], Any]:
    """The click decorator for one options field."""
    spec = spec_of(f)
    default = None if spec.multiple and not f.default else f.default
    if spec.positional:
        return click.argument(f.name, cls=HelpArgument, required=False, help=spec.help, default=default,
                              type=_click_type(spec.kind, spec.choices), metavar=spec.metavar)
    flag = "--" + f.name.replace("_", "-")
    first = f"{flag}/--no-{flag[2:]}" if spec.negatable else flag
    decls = [first, *([spec.short] if spec.short else []), f.name]
    if spec.kind is Kind.BOOL:
        return click.option(*decls, is_flag=True, default=bool(default), help=spec.help, show_default=bool(default))
    return click.option(*decls, type=_click_type(spec.kind, spec.choices), metavar=spec.metavar, default=default,
                        multiple=spec.multiple, help=spec.help, show_default=default is not None)


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

    try:
        values = load_config(value, command=ctx.command.name)
    except ConfigError as exc:
        raise ConfigUsageError(str(exc)) from None
    ctx.default_map = {**(ctx.default_map or {}), **values}
    return value


CONFIG = click.option("--config", CONFIG_PARAM, default=None, metavar="FILE", is_eager=True, callback=_load_config,
                      help="YAML config: keys are the long option names with underscores (max_evals, "
                           "lower_is_better, ...), model for the model file, out for the output folder, plus "
                           "version: 1. Paths in it are relative to the file; flags on the command line win.")


def _set_debug(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:
        ctx.ensure_object(dict)["debug"] = True  # the group's and its command's contexts share this dict


# The one option that is the command line's own, not a library option: accepted before the command name
# (`mpt --debug tune ...`) and after it (`mpt tune x.py --debug`); `common.guarded` reads it.
DEBUG = click.option("--debug", is_flag=True, expose_value=False, callback=_set_debug,
                     help="Show full tracebacks for errors.")


def options(command: str, *, config: bool = True) -> Callable[[Any], Any]:
    """Decorator adding the parameters of `command`'s options class, in its order (--config and --debug last)."""
    decorators = [_param(f) for f in option_fields(COMMANDS[command])] + ([CONFIG] if config else []) + [DEBUG]

    def apply(fn: Any) -> Any:
        for decorate in reversed(decorators):
            fn = decorate(fn)
        return fn

    return apply


def command_options(values: dict[str, Any]) -> Any:
    """The current command's options object from its click values (raises ConfigError naming the keys).

    An option given on the command line replaces a config value it conflicts with where its field says so
    (`mpt inspect --plan` over a config's `preset`).
    """
    ctx = click.get_current_context()
    values = {k: v for k, v in values.items() if k != CONFIG_PARAM}
    given = {name for name in values
             if ctx.get_parameter_source(name) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)}
    cls: type[Options] = COMMANDS[ctx.command.name or ""]
    return cls.from_layers(values, given)


def display_names(command: click.Command) -> dict[str, str]:
    """How the command line spells each option key: `--max-evals`, or the argument's metavar (`DIR`)."""
    names: dict[str, str] = {}
    for p in command.params:
        if p.name is None or p.name == CONFIG_PARAM:
            continue
        if isinstance(p, click.Argument):
            names[p.name] = p.metavar or p.name.upper()
        else:
            names[p.name] = max((o for o in p.opts if o.startswith("--")), key=len)
    return names
