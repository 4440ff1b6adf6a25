"""Where the shipped presets live and which names exist: importable without torch.

The options of every command name a preset; they are checked before the CLI
imports torch, so the name check cannot parse the preset (its op names are
torch's). `tuner.policy.presets.load_preset` reads the file found here.
"""
from __future__ import annotations

import difflib
from pathlib import Path

from tuner.core.errors import ConfigError


def preset_dir() -> Path:
    """The folder of the shipped preset files: installed package data (`tuner/configs/presets`, which
    pyproject maps from configs/), else the source tree's configs/presets (a checkout or editable install)."""
    here = Path(__file__).resolve().parents[1]  # the tuner package
    for path in (here / "configs" / "presets", here.parent / "configs" / "presets"):
        if path.is_dir():
            return path
    return here.parent / "configs" / "presets"


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
