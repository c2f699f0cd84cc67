"""Which weight sites read the model's inputs: the first layer of an MLP, a CNN's first
convolution, ``x @ w`` on the data.

MC dropout on those sites drops *input features*. On a network with one input that is
dropping the input itself: a fraction ``p`` of the draws predict as if ``x = 0`` (issue 39:
predictive SD 0.40 against 0.26 for mean field on the one-input tutorial model, and a
heteroscedastic scale head that must cover every target from ``x = 0``). So
:class:`~pyro_dropout.AutoDropout` keeps them unless asked (``input_dropout_rate``).
"""

import torch

from ..handlers.guided_value import plain
from ..handlers.weight_uses import WeightUses

__all__ = ["InputReads"]


def _storage(t):
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError, AttributeError):  # no storage (e.g. a subclass)
        return None


class InputReads(WeightUses):
    """:class:`~pyro_dropout.handlers.weight_uses.WeightUses` that also records, in
    ``input_sites``, the weight sites whose operation's data operand is one of the tensors
    passed to the model (or a view of one: the same storage, e.g. ``x.reshape(...)``). A
    tensor computed from an input (``x.float()``, ``torch.cat``, a feature map) is not an
    input."""

    def __init__(self, armed=True):
        super().__init__(armed=armed)
        self.input_sites = set()
        self._inputs = ()

    def start(self, inputs=()):
        """Forget earlier runs and record the next one, whose model inputs are ``inputs``."""
        super().start()
        self.input_sites = set()
        self._inputs = tuple(t for t in inputs if torch.is_tensor(t))

    def _note(self, x, name):
        x = plain(x)
        if not torch.is_tensor(x):
            return
        ptr = _storage(x)
        for t in self._inputs:
            if x is t or (ptr is not None and ptr != 0 and ptr == _storage(t)):
                self.input_sites.add(name)
                return

    def _pyro_bayesian_layer(self, msg):
        self._note(msg["args"][0], msg["name"])
        super()._pyro_bayesian_layer(msg)

    def answer_linear(self, x, w, bias, transposed_layout):
        self._note(x, w._pd_site.name)
        return super().answer_linear(x, w, bias, transposed_layout)

    def answer_conv(self, x, w, bias, ndim, stride, padding, dilation, groups):
        self._note(x, w._pd_site.name)
        return super().answer_conv(x, w, bias, ndim, stride, padding, dilation, groups)
