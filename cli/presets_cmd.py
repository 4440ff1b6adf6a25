"""`mpt presets`: list the shipped presets, or print one preset's lists."""
from __future__ import annotations

from typing import Any

import click

from .common import guarded
from .options import PRESETS, command_options, options
from .render import console, is_tty


@click.command(PRESETS,
               epilog="\b\nExamples:\n  mpt presets\n  mpt presets hmp\n  mpt presets torch-cpu --lists-only lower")
@options(PRESETS, config=False)
@guarded
def presets_cmd(**values: Any) -> None:
    """List presets, or show one preset's op lists and rules.

    Each preset reproduces one system's defaults: hmp (Habana HMP's default
    lists), hmp-o1 / hmp-o2 (HMP opt levels O1 / O2), gaudi (Intel Gaudi's
    torch.autocast lists), xla (PyTorch/XLA AMP on TPU), torch-cpu / torch-cuda
    (torch.autocast's own CPU / CUDA lists of the installed torch).
    """
    from tuner.policy.presetfiles import preset_names
    from tuner.policy.presets import load_preset

    opts = command_options(values)  # tuner.options.commands.PresetsOptions
    name, lists_only = opts.name, opts.lists_only
    out = console()
    if name is None:
        for n in preset_names():
            p = load_preset(n)
            out.print(f"{n:12} {p.dtype:5} {len(p.lower):3} lower {len(p.fp32):3} fp32 {len(p.promote):3} promote  "
                      f"{p.description}")
        return
    p = load_preset(name)
    if lists_only:
        for op in sorted(getattr(p, lists_only)):
            click.echo(op)
        return
    out.print(f"{p.name}: {p.description}")
    out.print(f"source: {p.source}")
    out.print(f"dtype {p.dtype}; device {p.device or 'any'}; unlisted ops: {p.unlisted}; in-place/out=: {p.inplace}")
    for attr in ("lower", "fp32", "promote", "banned"):
        ops = sorted(getattr(p, attr))
        if ops or attr != "banned":
            text = " ".join(ops) if ops else "(none)"
            if is_tty():
                out.print(f"[bold]{attr}[/bold] ({len(ops)}): {text}")
            else:
                out.print(f"{attr} ({len(ops)}): {text}")
