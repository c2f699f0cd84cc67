"""The guided value type, from where the handlers have always exported it.

:class:`GuidedValue` is the model-side value of a guided weight site; the layers of
:mod:`pyro_dropout.nn` unwrap it and the messengers of this package create it, so it lives
below both, in :mod:`pyro_dropout.nn.guided_value` (see ``docs/architecture.md``). This module
keeps the old import path.
"""

from ..nn.guided_value import GuidedValue, SiteRecord, laid_out, plain, wrap

__all__ = ["GuidedValue", "SiteRecord", "laid_out", "plain", "wrap"]
