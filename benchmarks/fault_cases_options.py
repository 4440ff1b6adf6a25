"""Fault classes of what the user types: `option` (bad command-line values), `config` (bad, huge or malicious
config YAML), `oplist` (bad op lists), `presets`, `inspect` and `cli` (--debug after the command, --module
patterns that match nothing).
"""
from __future__ import annotations

from fault_harness import Case, exists_note, intact, problems_note, suggestion_note, took, tune
from fault_models import BINARY, CONTAINER_MODEL, MODULELIST, OK, deep_yaml, model_src

CLASSES = ("option", "config", "oplist", "presets", "inspect", "cli")
T = "{T}"  # the case's temp folder, in argv
M = {"m.py": OK}  # the battery's MLP: the files of most cases


def cuda_expected() -> int:
    try:
        import torch

        return 0 if torch.cuda.is_available() else 2
    except Exception:  # noqa: BLE001
        return 2


BILLION_LAUGHS = "version: 1\n" + 'a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]\n" for i in range(1, 9)) + "model: m.py\n"


def cases() -> list[Case]:
    return [*_options(), *_configs(), *_oplists(), *_cli()]


def _options() -> list[Case]:
    """Bad command-line values."""
    C: list[Case] = []
    add = C.append
    # --- options -----------------------------------------------------------------------------------------------------
    add(Case("option: --dtype int8", tune(f"{T}/m.py", "--dtype", "int8"), 2, M))
    add(Case("option: --preset torch-cpux (suggestion?)", tune(f"{T}/m.py", "--preset", "torch-cpux"), 2, M,
             note=suggestion_note))
    add(Case("option: --tolerance -1", tune(f"{T}/m.py", "--tolerance", "-1"), 2, M))
    add(Case("option: --max-evals 1", tune(f"{T}/m.py", "--max-evals", "1"), 2, M))
    add(Case("option: --time-budget 0", tune(f"{T}/m.py", "--time-budget", "0"), 2, M))
    add(Case("option: --resume --overwrite", tune(f"{T}/m.py", "--resume", "--overwrite"), 2, M))
    add(Case("option: --device cuda without CUDA", tune(f"{T}/m.py", "--device", "cuda"), cuda_expected(), M))
    add(Case("option: --out is an existing file", tune(out=f"{T}/out.txt"), 2, {**M, "out.txt": "not a folder\n"},
             note=intact("out.txt", "not a folder\n")))
    add(Case("option: --out unwritable (/proc/mpt-out)", tune(out="/proc/mpt-out"), 2, M))
    add(Case("option: --max-evals 0 (README: N >= 2)", tune(f"{T}/m.py", "--max-evals", "0"), 2, M))
    add(Case("option: --tolerance nan", tune(f"{T}/m.py", "--tolerance", "nan"), 2, M))
    return C


def _configs() -> list[Case]:
    """Config files: bad, huge, malicious."""
    C: list[Case] = []
    add = C.append
    # --- config YAML -------------------------------------------------------------------------------------------------
    def cfg(text: str | bytes) -> dict[str, str | bytes]:
        return {**M, "mpt.yaml": text}

    good_cfg = "version: 1\nmodel: m.py\nout: out\ntolerance: 0.01\n"
    add(Case("config: unknown key (suggestion?)", ["tune", "--config", f"{T}/mpt.yaml"], 2,
             cfg(good_cfg + "tolerence: 0.02\n"), note=suggestion_note))
    add(Case("config: wrong type", ["tune", "--config", f"{T}/mpt.yaml"], 2,
             cfg(good_cfg.replace("tolerance: 0.01", "tolerance: one percent"))))
    add(Case("config: missing version", ["tune", "--config", f"{T}/mpt.yaml"], 2,
             cfg(good_cfg.replace("version: 1\n", ""))))
    add(Case("config: several errors at once", ["tune", "--config", f"{T}/mpt.yaml"], 2,
             cfg("version: 7\nmodel: m.py\nout: out\ntolerance: -3\nmax_evals: two\ndtype: int8\nbogus: 1\n"),
             note=problems_note))
    add(Case("config: YAML alias bomb (9 levels)", ["tune", "--config", f"{T}/mpt.yaml"], 2, cfg(BILLION_LAUGHS),
             note=took))
    add(Case("config: a list, not a mapping", ["tune", "--config", f"{T}/mpt.yaml"], 2,
             cfg("- version: 1\n- model: m.py\n")))
    add(Case("config: malformed YAML", ["tune", "--config", f"{T}/mpt.yaml"], 2,
             cfg("version: 1\nmodel: [m.py\nout: {out\n")))
    add(Case("config: UTF-8 BOM", ["tune", "--config", f"{T}/mpt.yaml"], 0, cfg(b"\xef\xbb\xbf" + good_cfg.encode()),
             note=lambda c, r: exists_note(c, "out/plan.yaml")))
    add(Case("config: file missing", ["tune", "--config", f"{T}/nosuch.yaml"], 2, M))
    add(Case("config: model file missing", ["tune", "--config", f"{T}/mpt.yaml"], 2,
             {"mpt.yaml": "version: 1\nmodel: nosuch.py\nout: out\n"}))
    add(Case("config: empty file", ["tune", "--config", f"{T}/mpt.yaml"], 2, {**M, "mpt.yaml": ""}))
    add(Case("config: nested 200 levels deep", ["tune", "--config", f"{T}/mpt.yaml"], 2,
             {**M, "mpt.yaml": deep_yaml(200)}, note=took))
    add(Case("config: quoted latency \"false\"", ["tune", "--config", f"{T}/mpt.yaml"], 2,
             {**M, "mpt.yaml": 'version: 1\nmodel: m.py\nout: out\nlatency: "false"\n'}))
    return C


def _oplists() -> list[Case]:
    """Op lists."""
    C: list[Case] = []
    add = C.append
    # --- op lists ----------------------------------------------------------------------------------------------------
    def lists(**files: str | bytes) -> dict[str, str | bytes]:
        return {**M, **files}

    add(Case("oplist: unknown op name (suggestion?)", ["inspect", f"{T}/m.py", "--lower-list", f"{T}/lower.txt"], 2,
             lists(**{"lower.txt": "linear\nlineer\nmatmul\n"}), note=suggestion_note))
    add(Case("oplist: duplicate op", ["inspect", f"{T}/m.py", "--lower-list", f"{T}/lower.txt"], 2,
             lists(**{"lower.txt": "linear\nmatmul\nlinear\n"})))
    add(Case("oplist: op in both lists", ["inspect", f"{T}/m.py", "--lower-list", f"{T}/lower.txt", "--fp32-list",
                                          f"{T}/fp32.txt"], 2,
             lists(**{"lower.txt": "linear\nmatmul\n", "fp32.txt": "softmax\nlinear\n"})))
    add(Case("oplist: UTF-8 BOM", ["inspect", f"{T}/m.py", "--lower-list", f"{T}/lower.txt"], 0,
             lists(**{"lower.txt": b"\xef\xbb\xbflinear\nmatmul\n"})))
    add(Case("oplist: binary garbage", ["inspect", f"{T}/m.py", "--lower-list", f"{T}/lower.bin"], 2,
             lists(**{"lower.bin": BINARY})))
    add(Case("oplist: 5 MB lower list", ["inspect", f"{T}/m.py", "--lower-list", f"{T}/lower.txt"], 2,
             {**M, "lower.txt": "linear\n" * 750_000}, note=took))

    return C


def _cli() -> list[Case]:
    """presets, inspect and --debug/--module."""
    C: list[Case] = []
    add = C.append
    add(Case("presets: unknown name (suggestion?)", ["presets", "hmpp"], 2, note=suggestion_note))
    add(Case("inspect: --module without '='", ["inspect", f"{T}/m.py", "--module", "0"], 2, M))
    add(Case("inspect: --module with a bad dtype", ["inspect", f"{T}/m.py", "--module", "0=int8"], 2, M))
    add(Case("inspect: --top -1", ["inspect", f"{T}/m.py", "--top", "-1"], 2, M))
    add(Case("inspect: --plan file missing", ["inspect", f"{T}/m.py", "--plan", f"{T}/nosuch.yaml"], 2, M))
    # --- --debug, module patterns ------------------------------------------------------------------------------
    add(Case("cli: --debug after the command", tune(f"{T}/m.py", "--debug"), 0, M))
    add(Case("cli: --debug after the command, evaluate raises", tune(f"{T}/m.py", "--debug"), 4,
             {"m.py": model_src(evaluate="def evaluate(model):\n    raise KeyError('labels')\n")},
             note=lambda c, r: "traceback shown" if "Traceback" in r.stderr else "NO traceback with --debug"))
    add(Case("cli: --module 'nosuch.*=fp32' (inspect)", ["inspect", f"{T}/m.py", "--module", "nosuch.*=fp32"],
             2, M))
    add(Case("cli: --module 'nosuch=fp32' (inspect)", ["inspect", f"{T}/m.py", "--module", "nosuch=fp32"], 2, M))
    add(Case("cli: --module 'block.layers.9=fp32' past a ModuleList's end",
             ["inspect", f"{T}/m.py", "--module", "block.layers.9=fp32"], 2,
             {"m.py": model_src(build=CONTAINER_MODEL % MODULELIST)}))
    add(Case("cli: --module '0=fp32' (matches: control)", ["inspect", f"{T}/m.py", "--module", "0=fp32"], 0, M))

    return C
