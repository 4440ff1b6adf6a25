"""What an `evaluate` gets wrong that the FP32 baseline's run shows: the mistakes that would give a plan that
claims what did not happen (issue 45).

The baseline runs the model as built, FP32, with no plan attached, so during its forwards:
- a torch.autocast that is on was opened by evaluate itself: the "FP32 baseline" ran in a lower precision and
  every plan runs the same (refused);
- a parameter that is not FP32 was converted by evaluate (`model.half()`, `.to(torch.bfloat16)`): the same
  (refused);
- no forward in training mode, while evaluate trained the model: it forgot `model.train()` (mpt lends the model
  in eval mode, as built), so dropout and BatchNorm's batch statistics were off (a warning).
After it, the keeper tells which parameters evaluate changed (`ModelKeeper.written`): a training tune whose
evaluate changed none never stepped an optimizer, so no trial trained anything (refused); a tune not for
training whose evaluate changed them trains the model without `--for-training` (a warning: its plan lowers the
weights a training loop updates).
"""
from __future__ import annotations

import torch
from torch import nn

from tuner.core.errors import UserCodeError
from tuner.core.torch_state import active_autocast


class BaselineWatch:
    """Looks at the FP32 baseline's forwards (called from a forward pre-hook with the module called)."""

    def __init__(self) -> None:
        self.autocast: set[str] = set()  # device types whose torch.autocast was on during a forward
        self.train_mode = False  # some forward ran in training mode
        self.lowered: tuple[str, torch.dtype] | None = None  # a parameter not FP32 at the first forward
        self._looked = False

    def __call__(self, module: nn.Module) -> None:
        self.autocast.update(active_autocast())
        self.train_mode = self.train_mode or module.training
        if not self._looked:
            self._looked = True
            self.lowered = next(((n, p.dtype) for n, p in module.named_parameters()
                                 if p.is_floating_point() and p.dtype != torch.float32), None)

    def check(self, where: str | None) -> None:
        """UserCodeError (exit 4) when the baseline did not run FP32."""
        if self.autocast:
            raise UserCodeError(f"evaluate runs the model inside torch.autocast({sorted(self.autocast)[0]!r}): the "
                                "FP32 baseline then runs in a lower precision and every plan runs alike; remove "
                                "torch.autocast from evaluate (mpt runs each plan's precision itself, and "
                                "tuner.autocast/tuner.load run the chosen one)", where=where)
        if self.lowered is not None:
            name, dtype = self.lowered
            raise UserCodeError(f"evaluate converted the model to {str(dtype).replace('torch.', '')} before running "
                                f"it ({name}: model.half() or .to(dtype)?): the FP32 baseline would not be FP32; "
                                "keep the model FP32 in evaluate (mpt chooses each op's precision)", where=where)


def trained_warnings(watch: BaselineWatch, trained: bool, training: bool, where: str | None) -> list[str]:
    """The baseline's mistakes after it ran, as warnings; UserCodeError for a training tune that trained nothing.
    `trained`: evaluate changed a parameter of the model it was lent."""
    if training and not trained:
        raise UserCodeError("--for-training: evaluate changed no parameter of the model it was given (no "
                            "optimizer.step() on it?), so no trial would train anything; train the model mpt passes "
                            "to evaluate, or drop --for-training for an evaluate that only scores it", where=where)
    if not training and trained:
        return ["evaluate changed the model's parameters (does it train it?); did you mean --for-training? A plan "
                "tuned without it lowers the weights a training loop updates, and is judged on that"]
    if training and not watch.train_mode:
        return ["evaluate trained the model with every forward in eval mode (mpt lends the model in eval mode, as "
                "built): call model.train() before the training loop, or dropout and BatchNorm's batch statistics "
                "stay off in every trial"]
    return []
