"""ModelKeeper.borrowed(): the model goes back as built however the block that used it ends."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from tuner.workspace.keeper import ModelKeeper


def build() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))


def test_a_block_that_leaves_the_model_alone_costs_no_rebuild():
    keeper = ModelKeeper(build)
    with keeper.borrowed() as model:
        assert model is keeper.model
        with torch.no_grad():
            model(torch.ones(1, 4))
    assert keeper.rebuilds == 0 and keeper.model is model


def test_an_evaluate_that_trains_the_model_is_undone_on_exit():
    keeper = ModelKeeper(build)
    before = {k: v.clone() for k, v in keeper.model.state_dict().items()}
    with keeper.borrowed() as model:
        with torch.no_grad():
            for p in model.parameters():
                p.data.add_(1.0)  # through .data: no version counter bump, the weights' digest still sees it
    assert keeper.rebuilds == 1 and keeper.model is not model
    after = keeper.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_a_swapped_module_is_undone_even_when_the_block_raises():
    keeper = ModelKeeper(build)
    with pytest.raises(KeyboardInterrupt):
        with keeper.borrowed() as model:
            model[0] = nn.Identity()
            raise KeyboardInterrupt
    assert keeper.rebuilds == 1 and isinstance(keeper.model[0], nn.Linear)


def test_the_last_loan_gives_the_model_away_without_a_rebuild():
    builds = []

    def build() -> nn.Module:
        builds.append(1)
        torch.manual_seed(0)
        return nn.Linear(2, 2)

    keeper = ModelKeeper(build)
    with keeper.borrowed(last=True) as model:
        with torch.no_grad():
            model.weight.add_(1.0)  # a checkpoint loaded into it, say
    assert len(builds) == 1 and keeper.rebuilds == 0 and keeper.model is None
    with pytest.raises(RuntimeError, match="last loan"):
        with keeper.borrowed():
            pass
