"""Every evaluation sees the FP32 model as the user built it, whatever the previous `evaluate` did.

No spare copy is held: user code gets the model inside `with keeper.borrowed() as model:`
and, when the block ends, `ModelKeeper.restore` compares the model with how it was built
(`fingerprint.ModelState`: object identities, version counters and flags, plus a fast checksum
of every weight byte) and, only when something changed, drops it and calls `build()` again. The
cost is one pass over the weights per borrowing (tens of GB/s on a CPU) and, for an `evaluate`
that trains, folds or rebinds the model, one `build()` per evaluation. A light loan (mpt's own forwards,
which only steer the search) compares identities and version counters at its end and leaves the bytes to
the next loan that is not light, so dozens of guide forwards on a large model cost no pass each.

A loan may ask for some parameters held lowered (`lowered`: a trial's model as its checkpoint stores it,
`tuner.measure.held`). They stay held after the loan, and the next loan changes only the parameters whose
dtype differs, so consecutive trials do not pay for lowering the same weights again. The comparison after
such a loan is against the state captured once they were held; everything else (`model`, a plain loan) puts
every FP32 tensor back first.

The keeper also owns torch's global state for the run (`tuner.core.torch_state`): the state at its
creation is put back after every build and every borrowing, and a built model that is not FP32 is
refused (it would be taken as the FP32 baseline).
"""
from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator, Mapping

import torch
from torch import nn

from tuner.core.errors import UserCodeError
from tuner.core.fingerprint import ModelState, tensor_checksums, weights_digest
from tuner.core.loader import user_site
from tuner.core.torch_state import StateGuard, TorchState, check_fp32_model
from tuner.measure.held import HeldLowered


class ModelKeeper:
    """Owns the working model; `model` is the as-built FP32 model (lowered parameters put back first)."""

    def __init__(self, build: Callable[[], nn.Module], device: str | torch.device = "cpu", *,
                 start: TorchState | None = None, before_build: Callable[[], None] | None = None) -> None:
        self._build = build
        self._before_build = before_build  # a training tune's: every generator as at the first build
        self.device = torch.device(device)
        self.guard = StateGuard(start)  # torch's global state as the run started (default: now)
        self._model: nn.Module | None = self._fresh()
        self._as_built = ModelState.capture(self._model)
        self._expected = self._as_built  # the state between loans: as built, or with `_held` held lowered
        self._held = HeldLowered()
        self._digest: str | None = None
        self._unchecked = False  # a light loan ended: its bytes are compared before the next use (`_settle`)
        self._given = False  # the last loan (`borrowed(last=True)`) gave the model away
        self.written: frozenset[str] = frozenset()  # the parameters the last loan wrote (`restore`)
        self.rebuilds = 0

    @property
    def model(self) -> nn.Module:
        """The model as built: any parameters held lowered are put back first (None after the last loan)."""
        if not self._given:
            self._lent()  # built again when an interrupt cut the last rebuild short: the best plan's outputs
        self._settle()
        self._hold({})
        return self._model  # type: ignore[return-value]

    @property
    def checked(self) -> nn.Module:
        """The model as it is now, any parameters held lowered left so, its bytes compared first when a light
        loan left them unread (rebuilt if that loan changed them): for the outputs, which hold what the last
        trial held, and need the FP32 weights only for a forward of their own (`model` then)."""
        self._lent()
        self._settle()
        return self._lent()

    @property
    def modules(self) -> nn.Module:
        """The model, for its module tree alone (paths, classes): its parameters may be held lowered now."""
        return self._lent()

    def _lent(self) -> nn.Module:
        if self._model is None and not self._given:
            self._rebuild()  # an interrupt (Ctrl-C, SIGTERM) landed inside the last rebuild
        if self._model is None:
            raise RuntimeError("the keeper gave its model away with its last loan")
        return self._model

    def _hold(self, lowered: Mapping[str, torch.dtype]) -> None:
        """Hold exactly `lowered` lowered; when that changed anything, the state to expect after a loan is
        the last one with the changed parameters' bytes read again (nothing else was written since). After a
        light loan those bytes are first compared with the state expected: else a write it made to one of them
        would become the state to expect."""
        if self._unchecked and self._model is not None and self._written(lowered):
            self._settle()  # a light loan wrote a weight about to be repacked: compare all, rebuild
        changed = [] if self._model is None else self._held.match(self._model, lowered)
        if changed:
            self._expected = (ModelState.capture(self._lent(), since=self._expected, changed=changed,
                                                 known=self._held.known_checksums(self._lent()))
                              if self._held.dtypes else self._as_built)

    def _written(self, lowered: Mapping[str, torch.dtype]) -> bool:
        """Whether a parameter whose held dtype `lowered` changes holds other bytes than the state expected."""
        held = self._held.dtypes
        names = {n for n in set(held) | set(lowered) if held.get(n) != lowered.get(n)}
        params = dict(self._lent().named_parameters())
        touched = [params[n] for n in names if n in params]
        if not touched:
            return False
        now = tensor_checksums(self._lent(), since=self._expected.weights, changed=touched)
        return {e for e in now if e[0] in names} != {e for e in self._expected.weights if e[0] in names}

    @property
    def weights_digest(self) -> str:
        """sha256 of the as-built weights (journal and plan fingerprints, rank agreement): computed once, on
        first use, from the checksums the keeper took of the model as built (no byte is read again: on GPT-2
        774M two passes over 3 GB less per tune)."""
        if self._digest is None:
            if ModelState.identities(self._lent()) != self._expected.graph:  # a loan swapped parts: as built first
                self.restore()
            self._digest = weights_digest(self._lent(), self._as_built.weights)
        return self._digest

    def _fresh(self) -> nn.Module:
        if self._before_build is not None:
            self._before_build()
        try:
            model = self._build()
        finally:
            self.guard.restore("build_model()", keep_hooks=True)
        check_fp32_model(model, where=user_site(self._build))
        return model.to(self.device).eval()

    def changed(self) -> bool:
        """True when the model is not as the keeper left it (as built, or with its held parameters)."""
        self._unchecked = False  # the full comparison below
        return ModelState.capture(self._lent()) != self._expected

    def _settle(self) -> None:
        """Compare the bytes a light loan left unread (and rebuild if they changed) before the model is used
        for anything that counts: an evaluate, the outputs."""
        if self._unchecked:
            self._unchecked = False
            self.restore()

    @contextlib.contextmanager
    def borrowed(self, who: str = "the model's forward", *, last: bool = False,
                 lowered: Mapping[str, torch.dtype] | None = None, light: bool = False) -> Iterator[nn.Module]:
        """The model for a block of user code (an evaluate, a recorded forward); restored when the block ends.

        Restored however the block ends, an interrupt included, so the model is as built between blocks and
        no caller has to remember to put it back. An error raised while restoring takes the place of the
        block's own: the model could not be put back, which is the harder failure. torch's global state
        is put back too (`who` names the user code that ran, for the warning). `last`: the keeper's
        final loan (`mpt check`'s planned evaluation); the model is given away instead of restored, so a
        block that changes it (loads a checkpoint) costs no rebuild, and the keeper lends nothing after.
        `lowered`: parameters to hold in a lower dtype during the loan and after it (see the module docstring).
        `light`: the block runs mpt's own forwards, whose results only steer the search (the guide, the
        ranking): after it only identities and version counters are compared (`ModelState.identities`), the
        weights' bytes before the next loan that is not light, or the next use of `model`. So a forward that
        writes a weight behind torch's back (through `.data`) is still undone before any evaluate or output,
        and the dozens of guide forwards of a large model cost no pass over its weights each.
        """
        if not light:
            self._settle()
        model = self._lent()
        self._hold({} if last else lowered or {})
        try:
            yield model
        finally:
            self.guard.restore(who)
            if last:
                self._model, self._given = None, True
            elif light and ModelState.identities(model) == self._expected.graph:
                self._unchecked = True
            else:
                self.restore()

    @contextlib.contextmanager
    def holding(self, model: nn.Module, lowered: Mapping[str, torch.dtype]) -> Iterator[nn.Module]:
        """`deployed.stored_as` on the keeper's own record (a `deployed.Holding`): `lowered` held for the block
        and after it, so the report's verifying forward and the checkpoint written after it pack the weights
        once, not twice (1.1B parameters: seconds each way). Like `stored_as`, the block is not compared with
        the model as built after it: what runs in it is mpt's measuring, and the checkpoint is checked
        against the bytes it held."""
        self._settle()
        if model is not self._model:
            raise ValueError("keeper.holding: the model is not the keeper's")
        self._hold(lowered)
        yield model

    def restore(self) -> bool:
        """Rebuild the model if user code changed it; True when it did. `written` then names the parameters
        whose bytes it changed (an evaluate that trains: `tuner.search.misuse`)."""
        self.written = frozenset()
        now = ModelState.capture(self._lent())
        self._unchecked = False
        if now == self._expected:
            return False
        before = set(self._expected.weights)
        params = {n for n, _ in self._lent().named_parameters()}
        self.written = frozenset(e[0] for e in now.weights if e not in before and e[0] in params)
        self._held.forget()  # what it held belongs to the changed model
        self._model = None  # free the changed model before building a new one
        gc.collect()
        self._rebuild()
        return True

    def _rebuild(self) -> None:
        """The model built again, checked to hold the weights first built. An interrupt inside `build()` leaves
        no model, and the next use of the keeper (the outputs of the best plan confirmed so far) builds it."""
        model = self._fresh()
        state = ModelState.capture(model)
        if state.weights != self._as_built.weights:
            raise UserCodeError("evaluate changed the model, and building it again gave other weights: "
                                "build_model() must return the same weights on every call (seed its random "
                                "initialisation or load saved weights) so every trial starts from the same model")
        self._model, self._as_built, self._expected = model, state, state
        self.rebuilds += 1
