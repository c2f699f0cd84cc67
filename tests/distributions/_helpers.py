"""Helpers shared by the probability-layer tests."""

import re

import pyro
import torch

#: Argument names that validation errors may mention.
ARG_NAMES = ("loc", "scale", "dropout_rate", "event_dim")


def first_argument_named(message):
    """The argument name (of :data:`ARG_NAMES`) that occurs first in ``message``.

    torch's constraint errors embed the distribution's repr, which lists *every* argument, so
    "the message contains the name" would be vacuous; the bad argument must be named first.
    """
    hits = []
    for name in ARG_NAMES:
        m = re.search(rf"(?<![A-Za-z_]){name}(?![A-Za-z_])", message)
        if m:
            hits.append((m.start(), name))
    return min(hits)[1] if hits else None


def seeded(seed=0):
    torch.manual_seed(seed)
    pyro.set_rng_seed(seed)
