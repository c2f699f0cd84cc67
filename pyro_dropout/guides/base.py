"""One base for the three weight guides: the families differ only in how a site's
distribution is built from its parameters."""

import json
import weakref
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import pyro
import pyro.distributions as dist
import torch
from pyro.distributions import constraints
from pyro.infer.autoguide import AutoGuide
from pyro.infer.autoguide.initialization import InitMessenger
from pyro.infer.autoguide.utils import deep_setattr
from pyro.nn import PyroModule, PyroParam, pyro_method
from pyro.poutine.util import site_is_subsample
from torch.distributions import Distribution, biject_to

from ..distributions.empirical_bayes import EmpiricalBayesScale
from .init import dist_dtype, init_to_fan_in
from .input_sites import InputReads
from .store_names import StoreNames, claim, owns, store_in_use

__all__ = ["AutoWeightGuide"]


def _deep_getattr(obj, name):
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


class AutoWeightGuide(AutoGuide):
    """Base class of :class:`AutoDropout`, :class:`AutoMeanField` and
    :class:`AutoVariationalDropout`.

    Why not Pyro's ``AutoNormal``: it samples an auxiliary ``<name>_unconstrained`` Normal and
    puts a ``Delta`` at the site, so ``TraceMeanField_ELBO`` cannot use an analytic KL there
    (``KL(Delta, ·)`` is a Monte-Carlo term) and a local-reparameterisation handler sees zero
    variance. These guides sample their variational distribution **at the model's site
    itself**, so the registered KLs dispatch and the handler sees the family.

    Sites with real support are handled by the family (:meth:`_init_real_site`,
    :meth:`_real_site_dist`); a site with other support (e.g. a positive noise scale with a
    LogNormal prior) gets a mean-field Normal pushed through ``biject_to(support)`` (analytic
    KL when the prior uses the same transform, e.g. LogNormal).

    Each instance owns its parameters. Pyro's param store holds them as
    ``"<name>.locs.<site>"``, ``"<name>.scales.<site>"``, ... where ``<name>`` is ``name`` or,
    by default, the class name: the same in every process, so
    ``pyro.get_param_store().save(path)`` in one and ``.load(path)`` in another restore the
    fit (see the docs page *Saving and loading*). Two live guides never share a name: while
    another guide still in use holds the default name, a new one takes ``"<Class>_1"``, ... and
    warns (and a second live guide with one explicit ``name`` raises). Parameters left in the
    store by an earlier guide that is gone (a notebook cell run twice) are replaced, not
    reused; parameters loaded into the store under the guide's name are used, and must match
    it (module ``pyro_dropout.guides.store_names``).

    :param callable model: a Pyro model, e.g. a :class:`~pyro_dropout.BayesianMLP`.
    :param callable init_loc_fn: initial posterior means per site; default
        :func:`~pyro_dropout.guides.init_to_fan_in` (random, fan-in scaled; Pyro's
        ``init_to_feasible`` would put every weight at exactly 0 and make all hidden units
        identical). Use :func:`~pyro_dropout.guides.init_to_module` to start from a trained
        deterministic network.
    :param str name: prefix of the guide's parameters in Pyro's param store (default: the
        class name). Give each guide of a session its own name when several guides of one
        class are fitted and the store is saved.
    """

    family: str | None = None

    def __init__(
        self,
        model: Callable[..., Any],
        *,
        init_loc_fn: Callable[[dict], torch.Tensor] = init_to_fan_in,
        create_plates: Callable[..., Any] | None = None,
        name: str | None = None,
    ) -> None:
        if name is not None and (not isinstance(name, str) or not name.strip(".")):
            raise ValueError(
                f"name must be a non-empty string (the prefix of the guide's parameters in "
                f"Pyro's param store), got {name!r}"
            )
        self.init_loc_fn = init_loc_fn
        self._init_device = None
        # Armed during the set-up run only: records which sites the model consumes as weights
        # of linear/matmul/conv operations, how often, and which read the model's inputs
        # (see _build_from_prototype).
        self._use_probe = InputReads(armed=False)
        model = self._use_probe(InitMessenger(_InitOnDevice(self))(model))
        super().__init__(model, create_plates=create_plates)
        # The prefix of the parameters in Pyro's param store: the same in every process, so a
        # saved store loads. Final when the guide sets up (StoreNames), where a second live
        # guide of the name is told apart (it must not start from, or move, the first's).
        self._requested_name = name
        self._pyro_name = type(self).__name__ if name is None else name
        self._store_names = None

    def _init_on_device(self, site):
        # Init functions build CPU tensors (they see only the site, and an improper prior
        # such as ImproperLogUniform holds no tensor to take a device from); the guide's
        # parameters belong where the data are, e.g. after model.to("cuda").
        value = self.init_loc_fn(site)
        if torch.is_tensor(value):
            dtype = dist_dtype(site["fn"]) if value.is_floating_point() else None
            value = value.to(device=self._init_device, dtype=dtype)
        return value

    # -- per-family hooks -------------------------------------------------------------------
    def _init_real_site(self, name, site, init_mean):
        raise NotImplementedError

    def _real_site_dist(self, name, site):
        raise NotImplementedError

    @property
    def config(self) -> dict[str, Any]:
        """JSON-serialisable settings of this guide (recorded in ArviZ exports)."""
        return {}

    # -- shared machinery -------------------------------------------------------------------
    @staticmethod
    def _prototype_hide_fn(msg):
        # Unlike Pyro's default, keep observed sites in the prototype (they are never guided)
        # so that a first call without observations can be told apart from a prior-only model.
        return msg["type"] != "sample" or site_is_subsample(msg)

    @pyro_method  # in the module's context: parameters are created in (or read from) the store
    def _setup_prototype(self, *args, **kwargs):
        names = StoreNames(self, self._requested_name) if store_in_use() else None
        self._store_names = names
        try:
            self._build_from_prototype(*args, **kwargs)
            if names is not None:
                names.check()
        except BaseException:
            # Leave no half-built guide behind: the next call starts again from scratch
            # (Pyro's AutoGuide would skip the set-up and fail with KeyError on every call).
            self._reset_prototype()
            if names is not None:
                names.restore()  # parameters loaded into the store stay there
            raise
        finally:
            self._store_names = None

    def _claim(self):
        """At each use: a guide that does not own its name in Pyro's param store (loaded with
        ``torch.load``, copied, or its name taken after the store was cleared) claims it."""
        if store_in_use() and not owns(self):
            claim(self)

    def _reset_prototype(self):
        self.prototype_trace = None
        self._weight_uses, self._vector_weights, self._input_sites = {}, set(), set()
        for group in self._PARAM_GROUPS:
            if hasattr(self, group):
                delattr(self, group)

    #: Attribute names of the PyroModules that hold per-site parameters.
    _PARAM_GROUPS: tuple[str, ...] = ("locs", "scales", "log_sigma2", "log_alphas")

    def _build_from_prototype(self, *args, **kwargs):
        tensors = [a for a in (*args, *kwargs.values()) if torch.is_tensor(a)]
        self._init_device = tensors[0].device if tensors else None
        probe = self._use_probe
        probe.start(tensors)
        try:
            super()._setup_prototype(*args, **kwargs)
        finally:
            probe.armed = False
        #: Linear/matmul/conv uses of each site in one model run (as weight or bias).
        self._weight_uses = dict(probe.weight_uses)
        #: Weight sites whose operation reads a tensor passed to the model (or a view of one):
        #: the layers that see the input features (see :mod:`.input_sites`).
        self._input_sites = set(probe.input_sites)
        #: 1-D sites the model uses as the weight of a product (``x @ w``, ``w @ x``,
        #: ``F.linear(x, w)``): weight vectors, which a family treats as a one-output layer.
        self._vector_weights = {
            name
            for name, site in self.prototype_trace.iter_stochastic_nodes()
            if name in probe.as_weight and len(site["fn"].event_shape) == 1
        }
        self._event_dims = {}
        self._real = {}
        #: Sites of a learned prior scale: {name: its EmpiricalBayesScale prior}.
        self._eb_scales = {}
        observed = any(
            s["is_observed"] for s in self.prototype_trace.nodes.values() if s["type"] == "sample"
        )
        for name, site in self.prototype_trace.iter_stochastic_nodes():
            for frame in site["cond_indep_stack"]:
                if not frame.vectorized:
                    continue
                if not observed:
                    raise NotImplementedError(
                        f"{type(self).__name__}: latent site {name!r} lies inside plate "
                        f"{frame.name!r} and the model observed nothing: if {name!r} is the "
                        "likelihood site, the guide was first called without the observations; "
                        "call it (or fit) with (x, y)."
                    )
                if frame.full_size is not None and frame.full_size != frame.size:
                    raise NotImplementedError(
                        f"{type(self).__name__}: latent site {name!r} is sampled inside the "
                        f"subsampled plate {frame.name!r}, which makes it a local latent "
                        f"variable (one value per row); these guides handle global latents "
                        f"such as weights. Sample the weights outside the plate: e.g. read "
                        f"the PyroSample attributes (or call pyro.sample for {name!r}) before "
                        f"entering pyro.plate({frame.name!r}, ...), or use this library's "
                        "layers (BayesianLinear, bayesianize), which draw their weights outside "
                        "subsampled plates."
                    )
            self._event_dims[name] = site["fn"].event_dim
            eb = _empirical_bayes(site["fn"])
            if eb is not None:
                self._eb_scales[name] = eb
                self._real[name] = False
                continue
            init_mean = site["value"].detach()
            support = site["fn"].support
            real = _is_real(support)
            self._real[name] = real
            if real:
                self._init_real_site(name, site, init_mean)
            else:
                unconstrained = biject_to(support).inv(init_mean).detach()
                self._set(
                    "locs",
                    name,
                    PyroParam(unconstrained, constraints.real, unconstrained.dim()),
                )
                self._set(
                    "scales",
                    name,
                    PyroParam(
                        torch.full_like(unconstrained, 0.01),
                        constraints.softplus_positive,
                        unconstrained.dim(),
                    ),
                )

    def _set(self, group, name, value):
        if self._store_names is not None:
            self._store_names.shapes[f"{self._pyro_name}.{group}.{name}"] = value[0].shape
        if not hasattr(self, group):
            setattr(self, group, PyroModule())
        deep_setattr(getattr(self, group), name, value)

    def _get(self, group, name):
        return _deep_getattr(getattr(self, group), name)

    def _site_dist(self, name, site):
        if name in self._eb_scales:
            return self._eb_dist(name)
        if self._real[name]:
            return self._real_site_dist(name, site)
        base = dist.Normal(self._get("locs", name), self._get("scales", name))
        transform = biject_to(site["fn"].support)
        return dist.TransformedDistribution(base, [transform]).to_event(self._event_dims[name])

    def _eb_dist(self, name):
        """A learned prior scale: a ``Delta`` at the minimiser of the weights' KL,
        ``s = sqrt(mean over the group of E_q[w²])`` (``E_q[w²] = Var + mean²`` of the weight
        site's family), from this guide's own parameters. Not detached: the gradient is then
        that of the ELBO profiled over ``s`` (the extra term is zero where the KL is analytic,
        its derivative in ``s`` vanishing at the minimiser)."""
        eb = self._eb_scales[name]
        weight = self.prototype_trace.nodes[eb.weight_site]
        q = self._site_dist(eb.weight_site, weight)
        second = q.variance + q.mean**2
        second = second.mean(dim=eb.reduce_dims, keepdim=True)
        # the group's shape: drop the averaged dims
        keep = [d for d in range(-second.dim(), 0) if d not in eb.reduce_dims]
        lead = second.shape[: second.dim() - len(weight["fn"].event_shape)]
        group = tuple(second.shape[d] for d in keep if d >= -len(weight["fn"].event_shape))
        scale = second.reshape(lead + group).clamp_min(torch.finfo(second.dtype).tiny).sqrt()
        return dist.Delta(scale, event_dim=len(eb.event_shape))

    @pyro_method  # reads the parameters from Pyro's param store, as forward does
    def get_distributions(self) -> dict[str, Distribution]:
        """The variational distribution of every latent site, as emitted at the site."""
        self._claim()
        return {
            name: self._site_dist(name, site)
            for name, site in self.prototype_trace.iter_stochastic_nodes()
        }

    def forward(self, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:
        """Sample every latent site from its variational distribution; returns ``{name: value}``."""
        if self.prototype_trace is None:
            self._setup_prototype(*args, **kwargs)
        else:
            self._claim()
        plates = self._create_plates(*args, **kwargs)
        result = {}
        for name, site in self.prototype_trace.iter_stochastic_nodes():
            with ExitStack() as stack:
                for frame in site["cond_indep_stack"]:
                    if frame.vectorized:
                        stack.enter_context(plates[frame.name])
                fn = self._site_dist(name, site)
                result[name] = pyro.sample(name, fn, infer=self._infer(name))
        return result

    def _infer(self, name):
        """The site's ``infer`` dict: a site the model uses more than once per run is announced
        to :func:`~pyro_dropout.local_reparameterization`, which then uses it as drawn from its
        first use on (per-example noise at each use would be a different model)."""
        uses = getattr(self, "_weight_uses", {}).get(name, 0)
        return {"weight_uses": uses} if uses > 1 else {}

    @torch.no_grad()
    @pyro_method  # reads the parameters from Pyro's param store, as forward does
    def median(self, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:
        """Posterior means of the weights (``E_q[w]``; for dropout, ``(1-p) M``: the weights of
        standard dropout's "weight averaging" at test time)."""
        return {name: self._mean(name, site) for name, site in self._sites(*args, **kwargs)}

    def _mean(self, name, site):
        d = self._site_dist(name, site)
        if self._real[name] or name in self._eb_scales:
            return d.mean.detach().clone()
        return biject_to(site["fn"].support)(self._get("locs", name)).detach().clone()

    def _sites(self, *args, **kwargs):
        if self.prototype_trace is None:
            if not args and not kwargs:
                raise RuntimeError(
                    f"{type(self).__name__} has not seen the model yet: fit it, pass the "
                    "training data (x, y), or call the guide once with them first"
                )
            self._setup_prototype(*args, **kwargs)
        else:
            self._claim()
        return list(self.prototype_trace.iter_stochastic_nodes())

    def describe(self) -> dict[str, str | None]:
        """``{"family": ..., "config": ...}`` with ``config`` as a JSON string."""
        return {"family": self.family, "config": json.dumps(self.config, sort_keys=True)}


class _InitOnDevice:
    """``guide._init_on_device`` through a weak reference. The guide holds its model, and the
    model this init function: a bound method there would make a reference cycle, which keeps a
    guide that nothing else references alive until the cycle collector runs, and a live guide
    keeps its name in Pyro's param store from the next one (store_names)."""

    def __init__(self, guide):
        self.guide = weakref.ref(guide)

    def __call__(self, site):
        return self.guide()._init_on_device(site)


def _empirical_bayes(fn):
    while isinstance(fn, dist.Independent) or type(fn).__name__ == "ExpandedDistribution":
        fn = fn.base_dist
    return fn if isinstance(fn, EmpiricalBayesScale) else None


def _is_real(support):
    while isinstance(support, constraints.independent):
        support = support.base_constraint
    return support is constraints.real or type(support) is type(constraints.real)
