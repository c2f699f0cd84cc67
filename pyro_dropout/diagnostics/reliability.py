"""Which numbers of a comparison can be trusted: flags for PSIS-LOO, p_loo and the VI k-hat.

:func:`~pyro_dropout.diagnostics.compare` computes the flags of each fit here and stores them
in the table (column ``flags``) and in ``table.attrs["reliability"]``; the table's printed
and HTML forms (:class:`CompareTable`), the README demo and the plots mark the flagged
numbers and add one line per kind of flag saying what it means and what to use instead.

The rules:

* ``loo_k``: pointwise PSIS-LOO Pareto :math:`\\hat k` above ArviZ's ``good_k``
  (:math:`\\min(1 - 1/\\log_{10} S, 0.7)` for :math:`S` draws; Vehtari, Simpson, Gelman, Yao &
  Gabry 2024, "Pareto smoothed importance sampling", JMLR 25(72)). The share of points above
  it is reported.
* ``loo_inf``: :math:`\\hat k = \\infty` at some points (their log-likelihood is the same for
  every draw: a point mass, or predictions saturated at probability 1).
* ``p_loo``: ``p_loo`` above the number of training points :math:`N`, or above the number of
  parameters :math:`p` (the elements of the ``posterior`` group) at a fit with ``loo_k``.
  The loo package glossary (Vehtari, Gelman & Gabry; ``loo-glossary``, section "p_loo")
  states that in well-behaving cases ``p_loo < N`` and ``p_loo < p``, that ``p_loo > N`` or
  ``p_loo > p`` indicates a model with very weak predictive capability or severe
  misspecification, and reads ``p_loo > p`` together with large Pareto k as a badly
  misspecified model. ``p > N`` alone is not flagged: an exact posterior under a weak prior
  has ``p_loo`` close to ``p``, above it by Monte Carlo error half the time. ArviZ itself has
  no rule for ``p_loo``.
* ``vi_k``: VI :math:`\\hat k \\ge 0.7` (Yao, Vehtari, Simpson & Gelman 2018, "Yes, but did it
  work?"); above 1 the importance ratios have no finite mean and the value only says "beyond
  range".
* ``failed``: the fit could not be exported or scored (the reason is in column ``error``).
* ``ref_rhat``: the reference posterior's function-space R-hat is above its threshold.
"""

from __future__ import annotations

import html
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from . import _arviz_compat as compat
from . import _reader as rd
from .vi_diagnostic import KHAT_OK

__all__ = [
    "AFFECTED_COLUMNS",
    "CompareTable",
    "NOTES",
    "format_table",
    "fit_flags",
    "footnote",
    "loo_flags",
    "n_params",
    "notes",
    "vi_flags",
]

#: What each flag means and what to use instead (one line each).
NOTES: dict[str, str] = {
    "loo_k": (
        "PSIS-LOO unreliable: Pareto k-hat above good_k at the share of points given; their "
        "importance weights are too heavy-tailed for the estimate to converge (Vehtari et al. "
        "2024), so elpd_loo, se, p_loo, elpd_diff, dse, weight and loo_pit_ks may be far off. "
        "Rank by "
        "held-out scores (test_lpd: pass x_test, y_test) or against a NUTS reference instead."
    ),
    "loo_inf": (
        "k-hat = inf: those points' log-likelihood is the same for every draw (a point mass, "
        "or predictions saturated at probability 1), PSIS has no tail to fit and their LOO "
        "term is the training fit, which is optimistic. Use held-out scores instead."
    ),
    "p_loo": (
        "p_loo out of range: in well-behaving cases p_loo < N and p_loo < p (loo package "
        "glossary, Vehtari, Gelman & Gabry); above either, the model predicts left-out points "
        "poorly or the LOO estimate broke down, and p_loo is no effective number of "
        "parameters. Use held-out scores instead."
    ),
    "vi_k": (
        "VI k-hat >= 0.7: q is far from the posterior (Yao et al. 2018), its expectations and "
        "PSIS corrections are unreliable; above 1 the importance ratios have no finite mean "
        "and the value only says 'beyond range'. Judge closeness to the posterior against a "
        "NUTS reference (reference_posterior, compare(..., reference=)) and predictions by "
        "held-out scores."
    ),
    "failed": "the fit failed and its row is empty; the reason is in column 'error'.",
    "ref_rhat": (
        "the reference's chains disagree (function-space R-hat above the threshold): the ref_* "
        "fidelity scores compare against an unconverged reference; run it longer "
        "(num_warmup, num_samples) or with more chains."
    ),
}

#: Columns whose numbers each flag makes unreliable (marked with ``!`` when printed).
AFFECTED_COLUMNS: dict[str, tuple[str, ...]] = {
    "loo_k": ("elpd_loo", "se", "p_loo", "elpd_diff", "dse", "weight", "loo_max_k", "loo_pit_ks"),
    "loo_inf": ("elpd_loo", "se", "p_loo", "elpd_diff", "dse", "weight", "loo_max_k", "loo_pit_ks"),
    "p_loo": ("p_loo",),
    "vi_k": ("vi_khat",),
    "failed": (),
    "ref_rhat": ("ref_rhat",),
}

Flag = tuple[str, str]  # (code, short text for the row)


def _share(count: int, total: int) -> str:
    """``count / total`` as a percentage with as many decimals as it takes to show neither
    0% for a non-zero count nor 100% for less than all (``_share(1, 200) == "0.5%"``).

    Example:
        >>> _share(1, 200), _share(38, 100), _share(1999, 2000), _share(0, 5), _share(1, 3)
        ('0.5%', '38%', '99.95%', '0%', '33%')
    """
    if total <= 0:
        return "n/a"
    pct = 100.0 * count / total
    for decimals in range(0, 7):
        text = f"{pct:.{decimals}f}"
        if (float(text) > 0 or count == 0) and (float(text) < 100 or count == total):
            return f"{text}%"
    return f"{pct:.7g}%"


def loo_flags(
    pareto_k: np.ndarray, good_k: float, p_loo: float, n_params: int | None = None
) -> list[Flag]:
    """Flags of one fit's PSIS-LOO: ``loo_k`` (share of points above ``good_k``), ``loo_inf``
    and ``p_loo`` (above the number of points or of parameters ``n_params``).

    Example:
        >>> loo_flags(np.array([0.1, 0.9, np.inf, 0.2]), 0.7, p_loo=3.5, n_params=3)
        [('loo_k', 'k>0.70 at 2 of 4 (50%)'), ('loo_inf', 'k=inf at 1/4'), ('p_loo', 'p_loo>p=3')]
    """
    k = np.asarray(pareto_k, dtype=float).ravel()
    n = k.size
    out: list[Flag] = []
    n_high = int(np.sum(k > good_k))
    if n_high:
        out.append(("loo_k", f"k>{good_k:.2f} at {n_high} of {n} ({_share(n_high, n)})"))
    n_inf = int(np.sum(np.isinf(k)))
    if n_inf:
        out.append(("loo_inf", f"k=inf at {n_inf}/{n}"))
    if np.isfinite(p_loo) and p_loo > n:
        out.append(("p_loo", f"p_loo>N={n}"))
    elif n_high and n_params is not None and np.isfinite(p_loo) and p_loo > n_params:
        # the glossary's reading "when Pareto k is large"; with all k small, p_loo ~ p is
        # what an exact posterior under a weak prior gives, up to Monte Carlo error
        out.append(("p_loo", f"p_loo>p={n_params}"))
    return out


def vi_flags(khat: float, point_mass: bool = False) -> list[Flag]:
    """Flag of one fit's VI k-hat: ``vi_k`` at or above 0.7 (NaN and ``-inf`` are not flagged:
    undefined, and exact).

    Example:
        >>> vi_flags(21.3)
        [('vi_k', 'VI k=21.3 beyond range')]
    """
    if point_mass:
        return [("vi_k", "VI k=inf (point mass)")]
    if np.isnan(khat) or khat < KHAT_OK:
        return []
    if khat > 1:
        return [("vi_k", f"VI k={khat:.3g} beyond range")]
    return [("vi_k", f"VI k={khat:.2f}>=0.7")]


def n_params(data: Any) -> int | None:
    """Elements per draw of an export's ``posterior`` group (None without one)."""
    if not compat.has_group(data, "posterior"):
        return None
    post = compat.get_group(data, "posterior")
    return int(sum(int(np.prod(v.shape[2:], dtype=int)) for v in post.data_vars.values()))


def fit_flags(data: Any) -> list[Flag]:
    """:func:`loo_flags` and :func:`vi_flags` of one exported fit."""
    from .vi_diagnostic import vi_diagnostic

    # compat.loo, as compare.loo does: compare imports this module (no loop back up)
    lr, vi = compat.loo(data, var_name=rd.obs_name(data)), vi_diagnostic(data)
    return [
        *loo_flags(lr.pareto_k, lr.good_k, lr.p, n_params(data)),
        *vi_flags(vi["khat"], vi["point_mass"]),
    ]


def footnote(flags: Mapping[str, Sequence[Flag]], width: int = 110) -> str:
    """The notes of ``{row: flags}`` wrapped to ``width`` columns, for a figure."""
    table = pd.DataFrame(index=list(flags))
    table.attrs["reliability"] = {k: list(v) for k, v in flags.items()}
    return "\n".join(textwrap.fill(line, width) for line in notes(table))


def _row_flags(table: pd.DataFrame) -> dict[str, list[Flag]]:
    flags = table.attrs.get("reliability", {}) or {}
    return {row: list(flags.get(row, [])) for row in table.index if flags.get(row)}


def notes(table: pd.DataFrame) -> list[str]:
    """One line per kind of flag among the table's rows (the rows and their short flags,
    then :data:`NOTES`), plus the reference's line when the table has one.

    Example:
        >>> print("\\n".join(notes(compare(fits))))  # doctest: +SKIP
    """
    by_code: dict[str, list[str]] = {}
    for row, flags in _row_flags(table).items():
        for code, short in flags:
            by_code.setdefault(code, []).append(f"{row} ({short})")
    out = [f"! {'; '.join(rows)}: {NOTES[code]}" for code, rows in by_code.items()]
    errors = table.attrs.get("errors", {}) or {}
    out += [f"  {row} failed: {errors[row]}" for row in table.index if row in errors]
    ref = table.attrs.get("reference_note")
    if ref:
        out.append(f"reference: {ref}")
    return out


def _fmt(v: Any, digits: int) -> str:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (float, np.floating)):
        return "" if v is None or (isinstance(v, float) and np.isnan(v)) else str(v)
    if np.isnan(v):
        return "NaN"
    if np.isinf(v):
        return "inf" if v > 0 else "-inf"
    return f"{v:.{digits}f}"


def format_table(table: pd.DataFrame, columns: Sequence[str] | None = None, digits: int = 3) -> str:
    """The table as text, flagged numbers marked ``!``, with the lines of :func:`notes` below.

    Example:
        >>> print(format_table(compare(fits), ["elpd_loo", "p_loo", "vi_khat"]))
        ...  # doctest: +SKIP
    """
    cols = [c for c in (columns if columns is not None else table.columns) if c in table]
    shown = pd.DataFrame(index=table.index)
    flags = _row_flags(table)
    for c in cols:
        marked = {
            row
            for row, fl in flags.items()
            for code, _ in fl
            if c in AFFECTED_COLUMNS.get(code, ())
        }
        col = table[c]
        if pd.api.types.is_float_dtype(col) or marked:
            shown[c] = [
                _fmt(v, digits) + ("!" if row in marked else (" " if marked else ""))
                for row, v in col.items()
            ]
        else:
            shown[c] = col
    with pd.option_context("display.width", 200, "display.max_columns", 50):
        text = shown.to_string()
    lines = notes(table)
    return text + ("\n" + "\n".join(lines) if lines else "")


class CompareTable(pd.DataFrame):
    """The :func:`~pyro_dropout.diagnostics.compare` table: a :class:`pandas.DataFrame` whose
    printed and HTML forms mark unreliable numbers with ``!`` and explain each flag below the
    table (:func:`format_table`). Selections and sorts keep this behaviour.
    """

    @property
    def _constructor(self):
        return CompareTable

    def __repr__(self) -> str:
        if not self.attrs.get("reliability") and not self.attrs.get("reference_note"):
            return super().__repr__()
        return format_table(self)

    def _repr_html_(self) -> str | None:
        base = super()._repr_html_()
        lines = notes(self)
        if base is None or not lines:
            return base
        items = "".join(f"<li>{html.escape(line.lstrip('! '))}</li>" for line in lines)
        return base + f'<ul class="pyro-dropout-flags" style="color:#a33">{items}</ul>'


def as_compare_table(table: pd.DataFrame, attrs: Mapping[str, Any]) -> CompareTable:
    """Wrap ``table`` as a :class:`CompareTable` carrying ``attrs``."""
    out = CompareTable(table)
    out.attrs.update(dict(table.attrs))
    out.attrs.update(dict(attrs))
    return out
