"""Plates: the draw plate that vectorises a run, the model's own plates (their nesting and
the batch they give a site), a subsampled plate visited in full in passes of its subsample
size, and the layout of a vectorised chunk's values."""

from __future__ import annotations

import torch
from pyro.poutine.messenger import Messenger
from pyro.poutine.util import site_is_subsample

_DRAW_PLATE = "_pyro_dropout_draws"


class NotVectorizable(RuntimeError):
    """The model does not broadcast over a leading sample dimension. ``reason``: what went
    wrong, without the advice (for a caller that falls back and warns)."""

    def __init__(self, message, reason=None):
        super().__init__(message)
        self.reason = message if reason is None else reason


class VectorizationWarning(UserWarning):
    """A run drew one draw per pass because a vectorised pass raised (the model does not
    broadcast over a leading draw dimension) or gave other results than one draw alone."""


class SubsampleIndices(Messenger):
    """Set the indices of subsampled plates, ``{plate name: LongTensor}``.

    Pyro draws a subsampled plate's indices at a sample site named after the plate; setting its
    value here (outside ``poutine.replay``, so it wins over a replayed guide) chooses the rows.
    """

    def __init__(self, indices):
        super().__init__()
        self.indices = indices

    def _pyro_sample(self, msg):
        if site_is_subsample(msg) and msg["name"] in self.indices:
            msg["value"] = self.indices[msg["name"]]


def _plate_nesting(traces):
    dims = [
        -frame.dim
        for tr in traces
        for site in tr.nodes.values()
        if site["type"] == "sample"
        for frame in site["cond_indep_stack"]
        if frame.vectorized and frame.dim is not None and frame.name != _DRAW_PLATE
    ]
    return max(dims, default=0)


def _subsampled_plates(trace):
    """``{name: (size, subsample_size)}`` of the plates that see a strict subsample."""
    out = {}
    for name, site in trace.nodes.items():
        if site["type"] == "sample" and site_is_subsample(site):
            fn = site["fn"]
            if fn.subsample_size is not None and fn.subsample_size < fn.size:
                out[name] = (int(fn.size), int(fn.subsample_size))
    return out


def _site_plate_batch(site):
    """The batch a site gets from its own plates (not the draw plate), e.g. ``(M, 1)``."""
    frames = [f for f in site["cond_indep_stack"] if f.vectorized and f.name != _DRAW_PLATE]
    if not frames:
        return ()
    shape = [1] * max(-f.dim for f in frames)
    for f in frames:
        shape[f.dim] = f.size
    return tuple(shape)


def _to_draws(t, c, nesting, batch, tail):
    """``t`` of a vectorised chunk, laid out ``(c, *pad, *batch, *tail)`` with the draw plate
    at ``-(nesting + 1)`` of the batch, as ``(c, *batch, *tail)``; raises
    :class:`NotVectorizable` when it does not fit. Returns ``(tensor, varies)``: whether ``t``
    really has the draw dimension."""
    pad = nesting - len(batch)
    target = (c,) + (1,) * pad + tuple(batch)
    lead = t.dim() - len(tail)
    if lead > len(target) or tuple(t.shape[lead:]) != tuple(tail):
        raise NotVectorizable(f"a value of shape {tuple(t.shape)} does not fit {target + tail}")
    full = (1,) * (len(target) - lead) + tuple(t.shape[:lead])
    try:
        t = t.expand(target + tuple(tail))
    except RuntimeError as e:
        raise NotVectorizable(str(e)) from None
    return t.reshape((c,) + tuple(batch) + tuple(tail)), full[0] == c


class _Data:
    """One data set of a run and what the first draw taught about it."""

    def __init__(self, args, kwargs):
        self.args, self.kwargs = args, kwargs
        self.device = _device(args, kwargs)
        self.plates = {}  # subsampled plates: {name: (size, subsample_size)}
        self.obs = None  # (cls, reinterpreted, batch, {param: tail}) or "samples"
        self.shapes = {}  # site -> per-draw shape of a recorded value
        self.event = None  # the observed site's event shape
        self.family = None  # the observed site's distribution class name

    def row_chunks(self):
        """``[(indices, {plate: idx}, keep)]``: every row in passes of the subsample size."""
        if not self.plates:
            return [(None, {}, None)]
        if len(self.plates) > 1:
            raise ValueError(
                f"the model subsamples several plates {sorted(self.plates)}; prediction over all "
                "rows supports one subsampled plate"
            )
        ((name, (size, b)),) = self.plates.items()
        idx = torch.arange(size, device=self.device)
        out = []
        for start in range(0, size, b):
            part = idx[start : start + b]
            keep = part.numel()
            if keep < b:
                part = torch.cat([part, idx[: b - keep]])
            out.append((part, {name: part}, keep))
        return out


def _device(args, kwargs):
    for a in (*args, *kwargs.values()):
        if torch.is_tensor(a):
            return a.device
    return torch.device("cpu")


def _join_rows(pieces, d, name=None):
    """Join the row passes of a subsampled plate (rows = first dim after the draws), dropping
    the completion of the last pass; a value without a row dim is taken from the first pass."""
    keep0, first = pieces[0]
    if keep0 is None:
        return first
    b = next(iter(d.plates.values()))[1]

    def join(parts):
        if parts[0].dim() < 2 or parts[0].shape[1] != b:
            return parts[0]  # not one value per row
        return torch.cat([t[:, :k] for k, t in zip([k for k, _ in pieces], parts, strict=True)], 1)

    if isinstance(first, dict):
        return {k: join([p[k] for _, p in pieces]) for k in first}
    return join([p for _, p in pieces])
