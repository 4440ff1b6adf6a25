"""Every evaluation sees the FP32 model as the user built it, whatever the previous `evaluate` did.

No spare copy is held: user code gets the model inside `with keeper.borrowed() as model:`
and, when the block ends, `ModelKeeper.restore` compares the model with how it was built
(`fingerprint.ModelState`: object identities, version counters and flags, plus a fast checksum
of every weight byte) and, only when something changed, drops it and calls `build()` again. The
cost is one pass over the weights per borrowing (tens of GB/s on a CPU) and, for an `evaluate`
that trains, folds or rebinds the model, one `build()` per evaluation.

The keeper also owns torch's global state for the run (`tuner.core.torch_state`): the state at its
creation is put back after every build and every borrowing, and a built model that is not FP32 is
refused (it would be taken as the FP32 baseline).
"""
from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator

import torch
from torch import nn

from tuner.core.errors import UserCodeError
from tuner.core.fingerprint import ModelState, weights_digest
from tuner.core.loader import user_site
from tuner.core.torch_state import StateGuard, TorchState, check_fp32_model


class ModelKeeper:
    """Owns the working model; `model` is always the as-built FP32 model between evaluations."""

    def __init__(self, build: Callable[[], nn.Module], device: str | torch.device = "cpu", *,
                 start: TorchState | None = None) -> None:
        self._build = build
        self.device = torch.device(device)
        self.guard = StateGuard(start)  # torch's global state as the run started (default: now)
        self.model: nn.Module = self._fresh()
        self._as_built = ModelState.capture(self.model)
        self._digest: str | None = None
        self.rebuilds = 0

    @property
    def weights_digest(self) -> str:
        """sha256 of the as-built weights (journal and plan fingerprints, rank agreement): computed once, on
        first use; every later look only compares the much cheaper checksum of `ModelState`."""
        if self._digest is None:
            if self.changed():
                self.restore()
            self._digest = weights_digest(self.model)
        return self._digest

    def _fresh(self) -> nn.Module:
        try:
            model = self._build()
        finally:
            self.guard.restore("build_model()")
        check_fp32_model(model, where=user_site(self._build))
        return model.to(self.device).eval()

    def changed(self) -> bool:
        return ModelState.capture(self.model) != self._as_built

    @contextlib.contextmanager
    def borrowed(self, who: str = "the model's forward", *, last: bool = False) -> Iterator[nn.Module]:
        """The model for a block of user code (an evaluate, a recorded forward); restored when the block ends.

        Restored however the block ends, an interrupt included, so the model is as built between blocks and
        no caller has to remember to put it back. An error raised while restoring takes the place of the
        block's own: the model could not be put back, which is the harder failure. torch's global state
        is put back too (`who` names the user code that ran, for the warning). `last`: the keeper's
        final loan (`mpt check`'s planned evaluation); the model is given away instead of restored, so a
        block that changes it (loads a checkpoint) costs no rebuild, and the keeper lends nothing after.
        """
        if self.model is None:
            raise RuntimeError("the keeper gave its model away with its last loan")
        try:
            yield self.model
        finally:
            self.guard.restore(who)
            if last:
                self.model = None  # type: ignore[assignment]
            else:
                self.restore()

    def restore(self) -> bool:
        """Rebuild the model if user code changed it; True when it did."""
        if not self.changed():
            return False
        self.model = None  # type: ignore[assignment]  # free the changed model before building a new one
        gc.collect()
        model = self._fresh()
        state = ModelState.capture(model)
        if state.weights != self._as_built.weights:
            raise UserCodeError("evaluate changed the model, and building it again gave other weights: "
                                "build_model() must return the same weights on every call (seed its random "
                                "initialisation or load saved weights) so every trial starts from the same model")
        self.model, self._as_built = model, state
        self.rebuilds += 1
        return True
