"""A zoo of Pyro models written the way Pyro's tutorials and forum posts write them, not for
this library: ``PyroModule[nn.Linear]`` with ``PyroSample`` weights, functional models with
``pyro.sample`` weights and matmuls, ``PyroModule[nn.Conv2d]`` CNNs with pooling, a
``bayesianize``d ``nn.Sequential`` CNN, a ``Categorical(logits=...)`` classifier and a model
with a subsample plate. Each entry builds ``(model, x, y)`` on small data."""

import pyro
import pyro.distributions as dist
import torch
import torch.nn as nn
from pyro.nn import PyroModule, PyroSample

from pyro_dropout import BayesianModel, bayesianize


class TutorialBNN(PyroModule):
    """Pyro's "Bayesian regression" tutorial network: PyroModule[nn.Linear] layers with
    PyroSample weights, a learned noise site, the likelihood in a data plate."""

    def __init__(self, in_dim=1, out_dim=1, hid_dim=10, prior_scale=1.0):
        super().__init__()
        self.activation = nn.Tanh()
        self.layer1 = PyroModule[nn.Linear](in_dim, hid_dim)
        self.layer2 = PyroModule[nn.Linear](hid_dim, out_dim)
        self.layer1.weight = PyroSample(
            dist.Normal(0.0, prior_scale).expand([hid_dim, in_dim]).to_event(2)
        )
        self.layer1.bias = PyroSample(dist.Normal(0.0, prior_scale).expand([hid_dim]).to_event(1))
        self.layer2.weight = PyroSample(
            dist.Normal(0.0, prior_scale).expand([out_dim, hid_dim]).to_event(2)
        )
        self.layer2.bias = PyroSample(dist.Normal(0.0, prior_scale).expand([out_dim]).to_event(1))

    def forward(self, x, y=None):
        x = x.reshape(-1, 1)
        x = self.activation(self.layer1(x))
        mu = self.layer2(x).squeeze(-1)
        sigma = pyro.sample("sigma", dist.Gamma(0.5, 1.0))
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Normal(mu, sigma * sigma), obs=y)
        return mu


def functional_model(x, y=None):
    """Weights as plain pyro.sample sites, ``x @ w.T + b`` (the forum-post BNN)."""
    d, h = x.shape[-1], 10
    w1 = pyro.sample("w1", dist.Normal(0.0, 1.0).expand([h, d]).to_event(2))
    b1 = pyro.sample("b1", dist.Normal(0.0, 1.0).expand([h]).to_event(1))
    w2 = pyro.sample("w2", dist.Normal(0.0, 1.0).expand([1, h]).to_event(2))
    b2 = pyro.sample("b2", dist.Normal(0.0, 1.0).expand([1]).to_event(1))
    hidden = torch.tanh(x @ w1.T + b1)
    mu = (hidden @ w2.T + b2).squeeze(-1)
    with pyro.plate("data", x.shape[0]):
        pyro.sample("obs", dist.Normal(mu, 0.2), obs=y)
    return mu


class PyroConvNet(PyroModule):
    """``PyroModule[nn.Conv2d]`` + max pooling + ``PyroModule[nn.Linear]``, Categorical."""

    def __init__(self, classes=3):
        super().__init__()
        self.conv = PyroModule[nn.Conv2d](1, 4, 3, padding=1)
        self.conv.weight = PyroSample(dist.Normal(0.0, 1.0).expand([4, 1, 3, 3]).to_event(4))
        self.conv.bias = PyroSample(dist.Normal(0.0, 1.0).expand([4]).to_event(1))
        self.fc = PyroModule[nn.Linear](4 * 4 * 4, classes)
        self.fc.weight = PyroSample(dist.Normal(0.0, 1.0).expand([classes, 64]).to_event(2))
        self.fc.bias = PyroSample(dist.Normal(0.0, 1.0).expand([classes]).to_event(1))

    def forward(self, x, y=None):
        h = torch.relu(self.conv(x))
        h = nn.functional.max_pool2d(h, 2).flatten(1)
        logits = self.fc(h)
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
        return logits


def bayesianized_cnn(classes=3):
    """A plain ``nn.Sequential`` CNN with ``MaxPool2d``/``Flatten``, converted."""
    net = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64, classes),
    )
    return BayesianModel(bayesianize(net), likelihood="classification")


class Classifier(PyroModule):
    """An MLP classifier with ``Categorical(logits=...)``, PyroModule[nn.Linear] layers."""

    def __init__(self, d=4, h=16, classes=3):
        super().__init__()
        self.l1 = PyroModule[nn.Linear](d, h)
        self.l1.weight = PyroSample(dist.Normal(0.0, 1.0).expand([h, d]).to_event(2))
        self.l1.bias = PyroSample(dist.Normal(0.0, 1.0).expand([h]).to_event(1))
        self.l2 = PyroModule[nn.Linear](h, classes)
        self.l2.weight = PyroSample(dist.Normal(0.0, 1.0).expand([classes, h]).to_event(2))
        self.l2.bias = PyroSample(dist.Normal(0.0, 1.0).expand([classes]).to_event(1))

    def forward(self, x, y=None):
        logits = self.l2(torch.relu(self.l1(x)))
        with pyro.plate("data", x.shape[0]):
            return pyro.sample("obs", dist.Categorical(logits=logits), obs=y)


class SubsampledRegression(PyroModule):
    """The weights are drawn first, then the likelihood sees a subsample of 16 rows:
    ``pyro.plate("data", N, subsample_size=16)`` (Pyro's SVI tutorial part II idiom)."""

    def __init__(self, d=3, h=10):
        super().__init__()
        self.l1 = PyroModule[nn.Linear](d, h)
        self.l1.weight = PyroSample(dist.Normal(0.0, 1.0).expand([h, d]).to_event(2))
        self.l1.bias = PyroSample(dist.Normal(0.0, 1.0).expand([h]).to_event(1))
        self.l2 = PyroModule[nn.Linear](h, 1)
        self.l2.weight = PyroSample(dist.Normal(0.0, 1.0).expand([1, h]).to_event(2))
        self.l2.bias = PyroSample(dist.Normal(0.0, 1.0).expand([1]).to_event(1))

    def forward(self, x, y=None):
        w1, b1, w2, b2 = self.l1.weight, self.l1.bias, self.l2.weight, self.l2.bias
        with pyro.plate("data", x.shape[0], subsample_size=16) as ind:
            h = torch.tanh(nn.functional.linear(x[ind], w1, b1))
            mu = nn.functional.linear(h, w2, b2).squeeze(-1)
            pyro.sample("obs", dist.Normal(mu, 0.3), obs=None if y is None else y[ind])
        return mu


def _regression(n, d, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    y = torch.sin(2 * x[:, 0]) + 0.1 * torch.randn(n, generator=g)
    return x, y


def _images(n, classes, seed):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, classes, (n,), generator=g)
    x = 0.5 * torch.randn(n, 1, 8, 8, generator=g)
    for k in range(classes):  # class k: a bright row k+2
        x[y == k, 0, k + 2, :] += 2.0
    return x, y


def _classes(n, d, classes, seed):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, classes, (n,), generator=g)
    centres = 2.0 * torch.randn(classes, d, generator=g)
    return centres[y] + torch.randn(n, d, generator=g), y


#: name -> (builder of a fresh model, data builder(n, seed), task)
ZOO = {
    "tutorial": (lambda: TutorialBNN(), lambda n, s: _regression(n, 1, s), "regression"),
    "functional": (lambda: functional_model, lambda n, s: _regression(n, 2, s), "regression"),
    "pyro_cnn": (lambda: PyroConvNet(), lambda n, s: _images(n, 3, s), "classification"),
    "bayesianized_cnn": (bayesianized_cnn, lambda n, s: _images(n, 3, s), "classification"),
    "classifier": (lambda: Classifier(), lambda n, s: _classes(n, 4, 3, s), "classification"),
    "subsampled": (lambda: SubsampledRegression(), lambda n, s: _regression(n, 3, s), "regression"),
}
