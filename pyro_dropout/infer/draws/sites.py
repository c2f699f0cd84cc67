"""Which sites a run records: the observed site (the one sample site of the model that
the guide does not draw, or the one named), the latent sites, improper priors."""

from __future__ import annotations

from pyro.poutine.util import site_is_subsample

#: Name of the model's return value, as in ``pyro.infer.Predictive``.
RETURN_SITE = "_RETURN"


def _is_deterministic(site):
    return site["infer"].get("_deterministic", False)


def _model_sample_sites(trace):
    return [
        (name, site)
        for name, site in trace.nodes.items()
        if site["type"] == "sample" and not site_is_subsample(site)
    ]


def choose_obs_site(model_trace, guide_trace, obs_name=None):
    """The observed site: ``obs_name`` if given (it must be a sample site that the guide does
    not draw), else the one sample site of the model that the guide does not draw
    (deterministic sites aside)."""
    if obs_name is not None:
        if obs_name not in model_trace.nodes or model_trace.nodes[obs_name]["type"] != "sample":
            names = [n for n, _ in _model_sample_sites(model_trace)]
            raise ValueError(
                f"the model has no sample site {obs_name!r}; its sample sites: {names}"
            )
        if obs_name in guide_trace.nodes:
            raise ValueError(
                f"site {obs_name!r} is drawn by the guide (a latent site), not observed"
            )
        return obs_name
    candidates = [
        name
        for name, site in _model_sample_sites(model_trace)
        if not _is_deterministic(site) and name not in guide_trace.nodes
    ]
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        raise ValueError(
            "the model has no observed (likelihood) site: the guide draws every sample site; "
            "name the site to record with obs_name=... (predict: site=...)"
        )
    raise ValueError(
        f"the model has several sample sites that the guide does not draw: {candidates}; name "
        "the observed one with obs_name=... (predict: site=...)"
    )


def _is_observable(model_trace, guide_trace, name):
    site = model_trace.nodes.get(name)
    return (
        site is not None
        and site["type"] == "sample"
        and not site_is_subsample(site)
        and name not in guide_trace.nodes
    )


def is_improper(fn):
    """Whether a distribution (through its wrappers) is flagged ``improper``."""
    while fn is not None:
        if getattr(fn, "improper", False):
            return True
        fn = getattr(fn, "base_dist", None)
    return False


def _latent_names(model_trace, guide_trace):
    return [
        name
        for name, site in _model_sample_sites(model_trace)
        if not _is_deterministic(site)
        and name in guide_trace.nodes
        and not guide_trace.nodes[name]["infer"].get("is_auxiliary", False)
    ]
