"""Retrain an example model; the shipped weights are only replaced when asked.

    python examples/train.py digits_cnn                 # -> examples/weights/retrained/digits_cnn.safetensors
    python examples/train.py all --out /tmp/weights     # -> /tmp/weights/NAME.safetensors
    python examples/train.py all --out examples/weights --overwrite   # replace the shipped weights

Each example file (examples/NAME.py) provides `Net`, `load_split()`,
`evaluate(model)`, a `TRAIN` dict (epochs, lr, weight_decay, batch_size) and
optionally `train_inputs(x)` (transform applied to inputs while training) and
`finalize(model)` (applied to the trained model before saving). Training is
deterministic: fixed seed, single thread, shuffling from a seeded generator.
The weights go to examples/weights/retrained/NAME.safetensors by default (or
to --out DIR), so the shipped, tracked examples/weights/NAME.safetensors that
the examples load are only rewritten with --overwrite. An existing output file
is refused without --overwrite; `--out examples/weights --overwrite` replaces
the shipped weights. Safetensors, no pickle. Not run by the tests.
"""
from __future__ import annotations

import argparse
import json
import importlib.util
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
EXAMPLES = ("digits_cnn", "digits_sensor", "digits_transformer")
SEED = 0
RETRAINED = HERE / "weights" / "retrained"


def load_example(name: str):
    path = HERE / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"mpt_example_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def train(name: str, seed: int = SEED, epochs: int | None = None, out: Path | None = None) -> float:
    """Train example `name` and save its weights to `out` (default: examples/weights/retrained/NAME.safetensors)."""
    from safetensors.torch import save_file

    ex = load_example(name)
    cfg = dict(ex.TRAIN)
    if epochs is not None:
        cfg["epochs"] = epochs
    torch.manual_seed(seed)
    torch.set_num_threads(1)  # bitwise-reproducible reductions on CPU
    torch.use_deterministic_algorithms(True)

    model = ex.Net()
    x_tr, y_tr, _, _ = ex.load_split()
    prep = getattr(ex, "train_inputs", None)
    if prep is not None:
        x_tr = prep(x_tr)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=cfg["weight_decay"])
    steps_per_epoch = -(-len(x_tr) // cfg["batch_size"])
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=cfg["lr"], epochs=cfg["epochs"],
                                                steps_per_epoch=steps_per_epoch)
    t0 = time.perf_counter()
    for epoch in range(cfg["epochs"]):
        model.train()
        perm = torch.randperm(len(x_tr), generator=gen)
        total = 0.0
        for i in range(0, len(x_tr), cfg["batch_size"]):
            idx = perm[i:i + cfg["batch_size"]]
            loss = F.cross_entropy(model(x_tr[idx]), y_tr[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            total += loss.item() * len(idx)
        if (epoch + 1) % 10 == 0 or epoch + 1 == cfg["epochs"]:
            print(f"{name}: epoch {epoch + 1}/{cfg['epochs']} loss {total / len(x_tr):.4f}")

    model.eval()
    fin = getattr(ex, "finalize", None)
    if fin is not None:
        fin(model)
    acc = ex.evaluate(model)

    state = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    target = Path(out) if out is not None else RETRAINED / ex.WEIGHTS.name
    target.parent.mkdir(parents=True, exist_ok=True)
    # One metadata key holding sorted JSON: safetensors writes several keys in a random
    # order, and a single one keeps the file byte-identical from run to run.
    info = {"example": name, "seed": seed, "epochs": cfg["epochs"],
            "test_accuracy_fp32": round(acc, 4), "torch": torch.__version__}
    save_file(state, str(target), metadata={"mpt_example": json.dumps(info, sort_keys=True)})
    reloaded = ex.evaluate(_load_into(ex, target))
    print(f"{name}: held-out accuracy {acc:.4f} (reloaded {reloaded:.4f}), "
          f"{target.stat().st_size / 1024:.1f} KiB -> {target}, {time.perf_counter() - t0:.1f}s")
    return acc


def _load_into(ex, path: Path) -> torch.nn.Module:
    """A fresh Net with the weights in `path` (the example's own build_model reads the shipped file)."""
    from safetensors.torch import load_file

    model = ex.Net()
    model.load_state_dict(load_file(str(path)))
    return model.eval()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", choices=[*EXAMPLES, "all"])
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--epochs", type=int, default=None, help="override the example's TRAIN['epochs']")
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for NAME.safetensors (default: examples/weights/retrained/)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace existing files (--out examples/weights --overwrite: the shipped weights)")
    args = parser.parse_args(argv)
    names = EXAMPLES if args.name == "all" else (args.name,)
    folder = args.out if args.out is not None else RETRAINED
    targets = {name: folder / f"{name}.safetensors" for name in names}
    existing = [str(t) for t in targets.values() if t.exists()]
    if existing and not args.overwrite:
        parser.error(f"{', '.join(existing)} exists; pass --overwrite to replace it, or --out DIR")
    for name in names:
        train(name, seed=args.seed, epochs=args.epochs, out=targets[name])
    return 0


if __name__ == "__main__":
    sys.exit(main())
