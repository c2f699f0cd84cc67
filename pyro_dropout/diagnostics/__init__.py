"""ArviZ layer: export variational fits, compare them, diagnose them, plot them.

Works with whichever ArviZ line is installed: ``InferenceData`` (0.23.x) or ``xarray.DataTree``
(1.x); all version-specific code is in :mod:`pyro_dropout.diagnostics._arviz_compat`.

Example:
    >>> from pyro_dropout.diagnostics import to_inference_data, compare
    >>> fits = {name: to_inference_data(model, g, x, y, 300, x_test=xt, y_test=yt)
    ...         for name, g in guides.items()}  # doctest: +SKIP
    >>> compare(fits)  # doctest: +SKIP
"""

from ._arviz_compat import ARVIZ_VERSION, IS_ARVIZ_1, LooResult, summary
from .calibration import ks_uniform, loo_pit, loo_pit_ks, prior_contraction
from .compare import compare, held_out_scores, loo
from .export import (
    add_prior,
    from_netcdf,
    guide_info,
    laplace_guide,
    to_inference_data,
    to_netcdf,
)
from .fidelity import (
    agreement,
    fidelity_scores,
    reference_interval_coverage,
    reference_noise_floor,
    sd_ratio,
    total_variation,
    wasserstein_1d,
)
from .metrics import (
    accuracy,
    brier_score,
    coverage_table,
    expected_calibration_error,
    interval_coverage,
    log_mean_exp,
    lppd,
    mean_lpd,
    pit,
    reliability_curve,
    rmse,
)
from .plots import (
    plot_calibration,
    plot_compare,
    plot_khat,
    plot_ppc_grid,
    plot_predictive_bands,
    plot_prior_functions,
)
from .reference import (
    RHAT_THRESHOLD,
    ReferenceConvergenceWarning,
    predictive_convergence,
    reference_posterior,
)
from .reliability import CompareTable, format_table
from .samples import ensemble_inference_data, samples_inference_data
from .sbc import (
    ConjugateLinearRegression,
    ExactPosteriorGuide,
    SBCResult,
    plot_sbc_ranks,
    simulation_based_calibration,
)
from .vi_diagnostic import interpret_vi_khat, vi_diagnostic, vi_khat

__all__ = [
    "ARVIZ_VERSION",
    "CompareTable",
    "ConjugateLinearRegression",
    "ExactPosteriorGuide",
    "RHAT_THRESHOLD",
    "SBCResult",
    "ReferenceConvergenceWarning",
    "IS_ARVIZ_1",
    "LooResult",
    "accuracy",
    "add_prior",
    "agreement",
    "brier_score",
    "compare",
    "coverage_table",
    "ensemble_inference_data",
    "expected_calibration_error",
    "fidelity_scores",
    "format_table",
    "from_netcdf",
    "guide_info",
    "held_out_scores",
    "interpret_vi_khat",
    "interval_coverage",
    "ks_uniform",
    "laplace_guide",
    "log_mean_exp",
    "loo",
    "loo_pit",
    "loo_pit_ks",
    "lppd",
    "mean_lpd",
    "pit",
    "plot_calibration",
    "plot_compare",
    "plot_khat",
    "plot_ppc_grid",
    "plot_predictive_bands",
    "plot_sbc_ranks",
    "plot_prior_functions",
    "predictive_convergence",
    "prior_contraction",
    "reference_posterior",
    "reference_interval_coverage",
    "reference_noise_floor",
    "reliability_curve",
    "rmse",
    "samples_inference_data",
    "sd_ratio",
    "simulation_based_calibration",
    "summary",
    "to_inference_data",
    "to_netcdf",
    "total_variation",
    "vi_diagnostic",
    "vi_khat",
    "wasserstein_1d",
]
