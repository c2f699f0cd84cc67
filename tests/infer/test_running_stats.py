"""A model with running statistics (BatchNorm) trains eagerly under ``fit``'s default, with one
CompilationWarning: a compiled step would not update the statistics that eval-mode prediction
then uses (measured: num_batches_tracked 10 after 260 compiled steps)."""

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.nn import PyroModule, PyroSample
from torch import nn

import pyro_dropout as pd
from pyro_dropout.infer import CompilationWarning
from pyro_dropout.infer.elbo import running_stat_modules


class _BatchNormNet(PyroModule):
    def __init__(self):
        super().__init__()
        self.l1 = PyroModule[nn.Linear](1, 8)
        self.l1.weight = PyroSample(dist.Normal(0.0, 1.0).expand([8, 1]).to_event(2))
        self.bn = nn.BatchNorm1d(8)
        self.l2 = PyroModule[nn.Linear](8, 1)
        self.l2.weight = PyroSample(dist.Normal(0.0, 1.0).expand([1, 8]).to_event(2))

    def forward(self, x, y=None):
        mu = self.l2(torch.relu(self.bn(self.l1(x)))).squeeze(-1)
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Normal(mu, 0.1), obs=y)
        return mu


def _data():
    torch.manual_seed(0)
    x = 3 + 2 * torch.randn(128, 1)
    return x, torch.sin(x[:, 0])


def test_batchnorm_statistics_move_every_step_under_the_default_fit():
    pyro.clear_param_store()
    x, y = _data()
    model = _BatchNormNet()
    guide = pd.AutoMeanField(model)
    with pytest.warns(CompilationWarning, match=r"bn update running statistics"):
        pd.fit(model, guide, x, y, num_steps=40, batch_size=32, progress=False, seed=0)
    # one update per training run of the model: the 40 steps (and the guide's set-up run)
    assert int(model.bn.num_batches_tracked) >= 40
    # the statistics are those of the data's first layer, not the initial (0, 1)
    assert float(model.bn.running_mean.abs().max()) > 0.05


def test_jit_true_refuses_a_model_with_running_statistics():
    pyro.clear_param_store()
    x, y = _data()
    model = _BatchNormNet()
    with pytest.raises(ValueError, match="running statistics"):
        pd.fit(model, pd.AutoMeanField(model), x, y, num_steps=2, jit=True, progress=False)


def test_which_modules_count():
    model = _BatchNormNet()
    assert running_stat_modules(model) == ["bn"]
    model.eval()
    assert running_stat_modules(model) == []  # eval mode: the statistics do not move
    model.train()
    model.bn.track_running_stats = False
    assert running_stat_modules(model) == []
    assert running_stat_modules(lambda x: x) == []
    assert running_stat_modules(nn.Sequential(nn.Linear(2, 2), nn.LayerNorm(2))) == []
