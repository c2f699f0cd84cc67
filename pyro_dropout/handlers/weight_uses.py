"""How a model uses its latent sites: which are consumed as the weight of a linear, matmul or
convolution operation, and how often in one run.

The guides run their model once to set up (the prototype run). Under :class:`WeightUses` that
run hands the model each latent real site as a
:class:`~pyro_dropout.handlers.guided_value.GuidedValue` owned by this messenger, which computes
every operation on the plain values (the run's results are unchanged) and records:

* ``weight_uses[name]``: how many linear, matmul or convolution operations (including the
  library's :func:`~pyro_dropout.nn.functional.bayesian_layer`) consumed the site as their
  weight or bias. A site used more than once in one run is used as drawn under
  :func:`~pyro_dropout.local_reparameterization` (the guides announce it on their draws as
  ``infer={"weight_uses": n}``, so the handler knows before the first use);
* ``as_weight``: the sites consumed as the *weight* operand (a 1-D site there is a weight
  vector, ``x @ w`` or ``w @ x``: a one-output layer, not a bias).
"""

import torch
import torch.nn.functional as F
from pyro.poutine.messenger import Messenger
from pyro.poutine.util import site_is_subsample

from ..nn.functional import LinearSpec, apply_spec
from .guided_value import SiteRecord, laid_out, plain, wrap

__all__ = ["WeightUses"]


def _is_real(support):
    while hasattr(support, "base_constraint"):
        support = support.base_constraint
    return type(support).__name__ == "_Real"


class WeightUses(Messenger):
    """Record the weight uses of one model run (see the module docs)."""

    def __init__(self, armed=True):
        super().__init__()
        self.armed = armed
        self.weight_uses = {}
        self.as_weight = set()

    def start(self):
        """Forget earlier runs and record the next one."""
        self.armed = True
        self.weight_uses = {}
        self.as_weight = set()

    def _process_message(self, msg):
        if self.armed:
            super()._process_message(msg)

    def _postprocess_message(self, msg):
        if self.armed:
            super()._postprocess_message(msg)

    def _count(self, name, as_weight):
        self.weight_uses[name] = self.weight_uses.get(name, 0) + 1
        if as_weight:
            self.as_weight.add(name)

    def _pyro_post_sample(self, msg):
        if msg["is_observed"] or site_is_subsample(msg) or msg["infer"].get("is_auxiliary"):
            return
        value, fn = plain(msg["value"]), msg["fn"]
        if not (torch.is_tensor(value) and value.is_floating_point()):
            return
        if fn.event_dim < 1 or not _is_real(fn.support):
            return
        site = SiteRecord(msg["name"], fn.event_dim, self, None, value)
        msg["value"] = wrap(value, site)

    def _pyro_bayesian_layer(self, msg):
        self._count(msg["name"], as_weight=True)
        bias_name = msg["kwargs"].get("bias_name")
        if bias_name is not None:
            self._count(bias_name, as_weight=False)
        x, weight, bias = msg["args"]
        msg["args"] = (x, laid_out(weight), laid_out(bias))

    # -- the GuidedValue owner interface ----------------------------------------------------
    def answer_linear(self, x, w, bias, transposed_layout):
        site = w._pd_site
        self._count(site.name, as_weight=True)
        if hasattr(bias, "_pd_site"):
            self._count(bias._pd_site.name, as_weight=False)
        spec = LinearSpec(transposed=transposed_layout, vector=site.event_dim == 1)
        return apply_spec(x, site.value, laid_out(bias), spec)

    def answer_conv(self, x, w, bias, ndim, stride, padding, dilation, groups):
        self._count(w._pd_site.name, as_weight=True)
        if hasattr(bias, "_pd_site"):
            self._count(bias._pd_site.name, as_weight=False)
        fn = F.conv1d if ndim == 1 else F.conv2d
        return fn(x, laid_out(w), laid_out(bias), stride, padding, dilation, groups)

    def unsupported_use(self, site, op_name):
        """Other operations are not weight uses (and are computed on the plain values)."""
