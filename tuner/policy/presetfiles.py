"""Where the shipped presets live and which names exist: importable without torch.

The options of every command name a preset; they are checked before the CLI
imports torch, so the name check cannot parse the preset (its op names are
torch's). `tuner.policy.presets.load_preset` reads the file found here.
"""
from __future__ import annotations

import difflib
from importlib import resources
from pathlib import Path

from tuner.core.errors import ConfigError


def preset_dir() -> Path:
    """The folder of the shipped preset files (installed package data, else the source tree's configs/)."""
    try:
        path = Path(str(resources.files("tuner.configs.presets")))
        if path.is_dir():
            return path
    except (ModuleNotFoundError, TypeError):
        pass
    return Path(__file__).resolve().parents[2] / "configs" / "presets"


def preset_names() -> list[str]:
    """The names `load_preset` takes, sorted: the shipped preset files."""
    return sorted(p.stem for p in preset_dir().glob("*.yaml"))


def preset_file(name: str) -> Path:
    """The file of the shipped preset `name`; ConfigError (with the nearest names) when there is none."""
    path = preset_dir() / f"{name}.yaml"
    if not path.is_file():
        near = difflib.get_close_matches(name, preset_names(), n=3)
        hint = f"; did you mean {', '.join(near)}?" if near else f"; available: {', '.join(preset_names())}"
        raise ConfigError(f"unknown preset {name!r}{hint}")
    return path
