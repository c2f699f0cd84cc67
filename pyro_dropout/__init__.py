"""pyro-dropout: dropout as a first-class variational family for Pyro."""

from .distributions import BernoulliMaskedNormal, ImproperLogUniform

__version__ = "0.1.0"

__all__ = ["BernoulliMaskedNormal", "ImproperLogUniform", "__version__"]
