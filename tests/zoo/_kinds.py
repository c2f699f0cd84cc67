"""More kinds of user model for the zoo, each with a plain-torch twin.

Every kind is a :class:`Kind`: a builder of a fresh Pyro model ``model(x, y=None)`` (written
the way a Pyro user writes it: ``PyroModule`` with ``PyroSample`` weights, or functional
``pyro.sample`` weights), a data builder, and ``reference(params, x)``: the likelihood's
distribution computed by *plain torch* (``torch.func.functional_call`` on ``nn.GRU``,
``nn.LSTM``, ``nn.RNN``, ``nn.Embedding``, ``nn.MultiheadAttention``;
``F.scaled_dot_product_attention``; ``torch.einsum``) from one draw ``params`` of the weight
sites. The zoo's tests check the library's numbers (``Predictive``'s return value, the ArviZ
export's log-likelihood) against it, draw by draw.

``lrt_warns`` lists the sites that local reparameterisation cannot apply to (a recurrent
kernel, an embedding lookup, ``nn.MultiheadAttention``'s packed projection, a weight used at
every step of an unrolled cell): ``fit`` warns once for each, naming it.
``token_inputs``: a weight meets ``(N, L, d)`` inputs in a linear operation (attention
projections, the DeepSets encoder); per-token local reparameterisation noise is being
changed on another branch, so the zoo fits these kinds with ``local_reparameterization=False``.
"""

from dataclasses import dataclass

import pyro
import pyro.distributions as dist
import torch
import torch.nn as nn
import torch.nn.functional as F
from pyro.nn import PyroModule, PyroSample
from pyro.nn.module import to_pyro_module_
from torch.func import functional_call

from pyro_dropout import BayesianModel, bayesianize

NOISE = 0.1  # the fixed observation noise of the regression kinds


def _sample_params(module, prefix="", scale=1.0):
    """Replace every parameter of a PyroModule tree by a ``PyroSample`` with a Normal prior."""
    for name, p in list(module.named_parameters()):
        owner = module
        *path, leaf = name.split(".")
        for part in path:
            owner = getattr(owner, part)
        prior = dist.Normal(0.0, scale).expand(p.shape).to_event(p.dim())
        setattr(owner, leaf, PyroSample(prior))


def _linear(d_in, d_out, scale=1.0):
    layer = PyroModule[nn.Linear](d_in, d_out)
    _sample_params(layer, scale=scale)
    return layer


def _normal(mu, y):
    with pyro.plate("data", mu.shape[-1]):
        pyro.sample("obs", dist.Normal(mu, NOISE), obs=y)


# ----------------------------------------------------------------------------- recurrent


class RecurrentRegression(PyroModule):
    """``PyroModule[nn.GRU]`` / ``PyroModule[nn.LSTM]`` with ``PyroSample`` weights, the last
    hidden state through a ``PyroModule[nn.Linear]`` head. ``nn.RNNBase.forward`` reads its
    weights from the ``_flat_weights`` list, not by attribute: the forward refreshes the list
    from the attributes (the forum workaround), which is what draws the weights."""

    def __init__(self, cell="gru", d=2, h=6):
        super().__init__()
        rnn = {"gru": nn.GRU, "lstm": nn.LSTM}[cell]
        self.rnn = PyroModule[rnn](d, h, batch_first=True)
        _sample_params(self.rnn)
        self.head = _linear(h, 1)

    def forward(self, x, y=None):
        rnn = self.rnn
        rnn._flat_weights = [getattr(rnn, n) for n in rnn._flat_weights_names]
        out, _ = rnn(x)
        mu = self.head(out[:, -1]).squeeze(-1)
        _normal(mu, y)
        return mu


def _recurrent_reference(cell):
    def reference(params, x):
        d, h = x.shape[-1], params["head.weight"].shape[-1]
        rnn = {"gru": nn.GRU, "lstm": nn.LSTM}[cell](d, h, batch_first=True)
        weights = {k[4:]: v for k, v in params.items() if k.startswith("rnn.")}
        out, _ = functional_call(rnn, weights, (x,))
        mu = F.linear(out[:, -1], params["head.weight"], params["head.bias"]).squeeze(-1)
        return dist.Normal(mu, NOISE)

    return reference


def unrolled_cell(x, y=None):
    """An Elman cell unrolled by hand over the sequence: every weight is used at each step."""
    d, h = x.shape[-1], 6
    w_ih = pyro.sample("w_ih", dist.Normal(0.0, 1.0).expand([h, d]).to_event(2))
    w_hh = pyro.sample("w_hh", dist.Normal(0.0, 1.0).expand([h, h]).to_event(2))
    b = pyro.sample("b", dist.Normal(0.0, 1.0).expand([h]).to_event(1))
    w_out = pyro.sample("w_out", dist.Normal(0.0, 1.0).expand([1, h]).to_event(2))
    state = x.new_zeros(x.shape[0], h)
    for t in range(x.shape[-2]):
        state = torch.tanh(x[:, t] @ w_ih.T + state @ w_hh.T + b)
    mu = (state @ w_out.T).squeeze(-1)
    _normal(mu, y)
    return mu


def _unrolled_reference(params, x):
    """``nn.RNN`` (tanh) with the same weights: ``h_t = tanh(x_t W_ih^T + h W_hh^T + b)``."""
    w_ih, w_hh = params["w_ih"], params["w_hh"]
    rnn = nn.RNN(w_ih.shape[1], w_ih.shape[0], batch_first=True)
    weights = {
        "weight_ih_l0": w_ih,
        "weight_hh_l0": w_hh,
        "bias_ih_l0": params["b"],
        "bias_hh_l0": torch.zeros_like(params["b"]),
    }
    out, _ = functional_call(rnn, weights, (x,))
    return dist.Normal((out[:, -1] @ params["w_out"].T).squeeze(-1), NOISE)


def _sequences(n, seed, d=2, length=5):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, length, d, generator=g)
    # a target with memory: a decayed sum of the first input channel
    decay = 0.6 ** torch.arange(length - 1, -1, -1.0)
    y = torch.tanh((x[..., 0] * decay).sum(-1)) + NOISE * torch.randn(n, generator=g)
    return x, y


# ----------------------------------------------------------------------------- embedding


class EmbeddingRegression(PyroModule):
    """``PyroModule[nn.Embedding]`` with a ``PyroSample`` table, mean-pooled over the tokens."""

    def __init__(self, vocab=12, d=4):
        super().__init__()
        self.embed = PyroModule[nn.Embedding](vocab, d)
        _sample_params(self.embed)
        self.head = _linear(d, 1)

    def forward(self, x, y=None):
        mu = self.head(self.embed(x).mean(-2)).squeeze(-1)
        _normal(mu, y)
        return mu


def _embedding_reference(params, x):
    table = params["embed.weight"]
    emb = functional_call(nn.Embedding(*table.shape), {"weight": table}, (x,))
    mu = F.linear(emb.mean(-2), params["head.weight"], params["head.bias"]).squeeze(-1)
    return dist.Normal(mu, NOISE)


def _tokens(n, seed, vocab=12, length=6):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, vocab, (n, length), generator=g)
    value = torch.linspace(-1.5, 1.5, vocab)  # each token carries a value; y is their mean
    return x, value[x].mean(-1) + NOISE * torch.randn(n, generator=g)


# ----------------------------------------------------------------------------- attention


class MHARegression(PyroModule):
    """``nn.MultiheadAttention`` converted with ``to_pyro_module_``, ``PyroSample`` on its
    packed ``in_proj_weight`` and on ``out_proj``; self-attention, mean-pooled, a linear head."""

    def __init__(self, d=4, heads=2):
        super().__init__()
        mha = nn.MultiheadAttention(d, heads, batch_first=True)
        to_pyro_module_(mha)
        _sample_params(mha)
        self.mha = mha
        self.head = _linear(d, 1)

    def forward(self, x, y=None):
        att, _ = self.mha(x, x, x, need_weights=False)
        mu = self.head(att.mean(-2)).squeeze(-1)
        _normal(mu, y)
        return mu


def _mha_reference(params, x):
    mha = nn.MultiheadAttention(x.shape[-1], 2, batch_first=True)
    weights = {k[4:]: v for k, v in params.items() if k.startswith("mha.")}
    att, _ = functional_call(mha, weights, (x, x, x), {"need_weights": False})
    mu = F.linear(att.mean(-2), params["head.weight"], params["head.bias"]).squeeze(-1)
    return dist.Normal(mu, NOISE)


def attention_model(x, y=None):
    """Hand-written single-head self-attention, ``softmax(Q K^T / sqrt(d)) V``, mean-pooled."""
    d = x.shape[-1]
    wq, wk, wv = (
        pyro.sample(n, dist.Normal(0.0, 1.0).expand([d, d]).to_event(2)) for n in ("wq", "wk", "wv")
    )
    w_out = pyro.sample("w_out", dist.Normal(0.0, 1.0).expand([1, d]).to_event(2))
    q, k, v = x @ wq.mT, x @ wk.mT, x @ wv.mT  # .mT: also with leading sample dimensions
    att = torch.softmax(q @ k.transpose(-1, -2) / d**0.5, -1) @ v
    mu = (att.mean(-2) @ w_out.mT).squeeze(-1)
    _normal(mu, y)
    return mu


def _attention_reference(params, x):
    q, k, v = (F.linear(x, params[n]) for n in ("wq", "wk", "wv"))
    att = F.scaled_dot_product_attention(q, k, v)
    return dist.Normal(F.linear(att.mean(-2), params["w_out"]).squeeze(-1), NOISE)


def _token_vectors(n, seed, d=4, length=5):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, length, d, generator=g)
    # the value at the token whose first feature is largest (attention finds it)
    top = x[..., 0].argmax(-1)
    y = torch.tanh(x[torch.arange(n), top, 1]) + NOISE * torch.randn(n, generator=g)
    return x, y


def _attention_teacher(n, seed, d=4, length=5):
    """Targets from the hand-written attention network itself at fixed weights (a teacher),
    so that a small fit can learn them."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, length, d, generator=g)
    t = torch.Generator().manual_seed(7)
    teacher = {k: torch.randn(d, d, generator=t) for k in ("wq", "wk", "wv")}
    teacher["w_out"] = 0.3 * torch.randn(1, d, generator=t)
    mu = _attention_reference(teacher, x).mean
    return x, mu + NOISE * torch.randn(n, generator=g)


# ----------------------------------------------------------------------------- DeepSets


def deep_sets(x, y=None):
    """DeepSets (Zaheer et al. 2017): ``rho(sum_i phi(x_i))`` over sets ``x`` of shape
    ``(N, S, d)``; ``phi`` a tanh layer on each element, ``rho`` a tanh layer and a readout."""
    d, h = x.shape[-1], 8
    w_phi = pyro.sample("phi.weight", dist.Normal(0.0, 1.0).expand([h, d]).to_event(2))
    b_phi = pyro.sample("phi.bias", dist.Normal(0.0, 1.0).expand([h]).to_event(1))
    w_rho = pyro.sample("rho.weight", dist.Normal(0.0, 1.0).expand([1, h]).to_event(2))
    b_rho = pyro.sample("rho.bias", dist.Normal(0.0, 1.0).expand([1]).to_event(1))
    pooled = torch.tanh(F.linear(x, w_phi, b_phi)).sum(-2)
    mu = F.linear(pooled, w_rho, b_rho).squeeze(-1)
    _normal(mu, y)
    return mu


def _deep_sets_reference(params, x):
    phi = torch.tanh(torch.einsum("nsd,hd->nsh", x, params["phi.weight"]) + params["phi.bias"])
    mu = torch.einsum("nh,oh->no", phi.sum(1), params["rho.weight"]) + params["rho.bias"]
    return dist.Normal(mu.squeeze(-1), NOISE)


def _sets(n, seed, d=2, size=4):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, size, d, generator=g)
    # permutation invariant and additive over the elements. (A sum of products x_i0 * x_i1
    # was fitted to an RMSE of 0.45 by MC dropout against 0.25 by plain torch: dropout noise
    # breaks the cancellations a tanh layer needs for a product; a property of the family.)
    f = torch.tanh((torch.sin(2 * x[..., 0]) + 0.5 * x[..., 1]).sum(-1) / 2)
    return x, f + NOISE * torch.randn(n, generator=g)


# ----------------------------------------------------------------------------- LayerNorm


def layer_norm_model():
    """A plain ``nn.Sequential`` with ``nn.LayerNorm``, ``bayesianize``d: the LayerNorm's
    affine parameters stay point estimates (``deterministic=(nn.LayerNorm,)``)."""
    net = nn.Sequential(nn.Linear(3, 12), nn.LayerNorm(12), nn.Tanh(), nn.Linear(12, 1))
    return BayesianModel(
        bayesianize(net, deterministic=(nn.LayerNorm,)), likelihood="regression", tau=NOISE**-2
    )


def _layer_norm_reference(model):
    def reference(params, x):
        ln = model.net[1]  # the point-estimated affine parameters, as fitted
        h = F.linear(x, params["net.0.weight"], params["net.0.bias"])
        h = torch.tanh(F.layer_norm(h, (12,), ln.weight.detach(), ln.bias.detach()))
        mu = F.linear(h, params["net.3.weight"], params["net.3.bias"])
        return dist.Normal(mu, NOISE).to_event(1)

    return reference


def _first_column(x, y):
    return x, y[:, 0]


# --------------------------------------------------- multi-output, Poisson, 10 classes


class MLP(PyroModule):
    """``PyroModule[nn.Linear]`` MLP with one of three likelihoods: ``"multi"`` (3 real
    outputs, ``Normal(...).to_event(1)``), ``"poisson"`` (log rate) or ``"categorical"``
    (10 classes, ``Categorical(logits=...)``)."""

    OUT = {"multi": 3, "poisson": 1, "categorical": 10}

    def __init__(self, likelihood, d=3, h=12):
        super().__init__()
        self.likelihood = likelihood
        self.l1 = _linear(d, h)
        self.l2 = _linear(h, self.OUT[likelihood])

    def forward(self, x, y=None):
        f = self.l2(torch.tanh(self.l1(x)))
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", _mlp_likelihood(self.likelihood, f), obs=y)
        return f


def _mlp_likelihood(likelihood, f):
    if likelihood == "multi":
        return dist.Normal(f, NOISE).to_event(1)
    if likelihood == "poisson":
        return dist.Poisson(f.squeeze(-1).exp())
    return dist.Categorical(logits=f)


def _mlp_reference(likelihood):
    def reference(params, x):
        h = torch.tanh(x @ params["l1.weight"].T + params["l1.bias"])
        return _mlp_likelihood(likelihood, h @ params["l2.weight"].T + params["l2.bias"])

    return reference


def _mlp_data(likelihood):
    def data(n, seed):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(n, 3, generator=g)
        if likelihood == "multi":
            # no product of inputs (see _sets): three smooth functions of the inputs
            f = torch.stack(
                [torch.sin(x[:, 0]), torch.tanh(x[:, 1] - x[:, 2]), torch.tanh(x.sum(-1))], -1
            )
            return x, f + NOISE * torch.randn(n, 3, generator=g)
        if likelihood == "poisson":
            return x, torch.poisson(torch.exp(1.0 + 0.8 * torch.sin(2 * x[:, 0])), generator=g)
        centres = 2.5 * torch.randn(10, 3, generator=torch.Generator().manual_seed(10))
        y = torch.randint(0, 10, (n,), generator=g)
        return centres[y] + 0.7 * torch.randn(n, 3, generator=g), y

    return data


# ----------------------------------------------------------------------------- AutoGuideList


class LearnedNoiseMLP(PyroModule):
    """A regression MLP with a learned noise scale ``sigma``, drawn after the weights: the zoo
    guides it with ``AutoGuideList([guide(block(model, hide=["sigma"])),
    AutoNormal(block(model, expose=["sigma"]))])``, in the model's site order."""

    def __init__(self, d=3, h=12):
        super().__init__()
        self.l1 = _linear(d, h)
        self.l2 = _linear(h, 1)

    def forward(self, x, y=None):
        mu = self.l2(torch.tanh(self.l1(x))).squeeze(-1)
        sigma = pyro.sample("sigma", dist.LogNormal(-1.0, 1.0))
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Normal(mu, sigma), obs=y)
        return mu


def _learned_noise_reference(params, x):
    h = torch.tanh(F.linear(x, params["l1.weight"], params["l1.bias"]))
    mu = F.linear(h, params["l2.weight"], params["l2.bias"]).squeeze(-1)
    return dist.Normal(mu, params["sigma"])


# ----------------------------------------------------------------------------- the table


@dataclass
class Kind:
    build: object  # () -> model
    data: object  # (n, seed) -> (x, y)
    reference: object  # model -> ((params, x) -> torch distribution of the observed site)
    task: str = "regression"
    lrt_warns: tuple = ()  # weight sites that local reparameterisation cannot apply to
    token_inputs: bool = False  # a weight meets (N, L, d) inputs: fitted without LRT here
    guide_list: bool = False  # guide the weights by an AutoGuideList (with AutoNormal)
    #: weight draws broadcast through the model (``Predictive(parallel=True)`` under
    #: ``weight_draws``): "exact", "raises" (the model's own code does not broadcast; one draw
    #: per pass, with one ``VectorizationWarning`` per call of ``predict`` and the export) or
    #: "wrong" (wrong numbers from a vectorised pass: the check catches them and warns; the
    #: zoo draws these one per pass); see test_kinds.py's last tests
    parallel: str = "exact"


def _fixed(reference):
    return lambda model: reference


KINDS = {
    "gru": Kind(
        lambda: RecurrentRegression("gru"),
        _sequences,
        _fixed(_recurrent_reference("gru")),
        lrt_warns=("rnn.weight_ih_l0", "rnn.weight_hh_l0"),
        parallel="raises",
    ),
    "lstm": Kind(
        lambda: RecurrentRegression("lstm"),
        _sequences,
        _fixed(_recurrent_reference("lstm")),
        lrt_warns=("rnn.weight_ih_l0", "rnn.weight_hh_l0"),
        parallel="wrong",
    ),
    "unrolled_cell": Kind(
        lambda: unrolled_cell,
        _sequences,
        _fixed(_unrolled_reference),
        lrt_warns=("w_ih", "w_hh"),
    ),
    "embedding": Kind(
        lambda: EmbeddingRegression(),
        _tokens,
        _fixed(_embedding_reference),
        lrt_warns=("embed.weight",),
        parallel="raises",
    ),
    "multihead_attention": Kind(
        lambda: MHARegression(),
        _token_vectors,
        _fixed(_mha_reference),
        lrt_warns=("mha.in_proj_weight", "mha.out_proj.weight"),
        parallel="raises",
    ),
    "attention": Kind(
        lambda: attention_model,
        _attention_teacher,
        _fixed(_attention_reference),
        token_inputs=True,
    ),
    "deep_sets": Kind(
        lambda: deep_sets,
        _sets,
        _fixed(_deep_sets_reference),
        token_inputs=True,
    ),
    "layer_norm": Kind(
        layer_norm_model,
        lambda n, s: _first_column(*_mlp_data("multi")(n, s)),
        _layer_norm_reference,
    ),
    "multi_output": Kind(lambda: MLP("multi"), _mlp_data("multi"), _fixed(_mlp_reference("multi"))),
    "poisson": Kind(
        lambda: MLP("poisson"), _mlp_data("poisson"), _fixed(_mlp_reference("poisson")), "count"
    ),
    "categorical10": Kind(
        lambda: MLP("categorical"),
        _mlp_data("categorical"),
        _fixed(_mlp_reference("categorical")),
        "classification",
    ),
    "guide_list": Kind(
        lambda: LearnedNoiseMLP(),
        lambda n, s: _first_column(*_mlp_data("multi")(n, s)),
        _fixed(_learned_noise_reference),
        guide_list=True,
    ),
}
