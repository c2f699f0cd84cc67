"""Issue 40's comparison rule: per dataset, our validation-picked row against the best published
Bayesian-network test LL, any depth, any splits (the test-picked row shown beside it).

*Reference*: the highest LL per point among every Bayesian-network entry held in
:mod:`benchmarks.uci_published`: Gal & Ghahramani 2016's MC dropout, VI and PBP (one hidden
layer) and MC dropout with two hidden layers, the 2018 MC dropout anchor, and each
``BEST_PUBLISHED`` entry that is a Bayesian network (DVI / dDVI / MCVI, Concrete dropout) or
its ``fallback``. Deep Ensembles and Deep Evidential Regression are not Bayesian networks and
are left out. Entries on other (or unstated) splits and unverified ones count: each only
raises the bar, and the page tags it.

*Our side*: the validation pick is the row (any depth) with the highest mean over splits of
the validation LL of its chosen configuration (:func:`~benchmarks.uci.summary.
unit_validation_ll`). Every guide is validated on the same rows (the last 20 % of each
training split, file order) and scored in the same unit (mean log-density per point, original
scale), so the rows compare; a row without validation numbers, or over fewer splits, is
named, never ranked by its test LL instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..uci_published import BEST_PUBLISHED, PUBLISHED, PUBLISHED_TWO_LAYER

#: The Bayesian-network columns of ``PUBLISHED`` (all on these splits, read in their tables);
#: ``deep_ensembles`` is left out: an ensemble of point-estimate networks is not Bayesian.
BAYESIAN_COLUMNS = {
    "mc_dropout_2018": "MC dropout 2018 anchor (Gal, DropoutUncertaintyExps)",
    "vi": "VI (Graves 2011), Gal & Ghahramani 2016 Table 1",
    "pbp": "PBP (Hernández-Lobato & Adams 2015), Gal & Ghahramani 2016 Table 1",
    "dropout_2016": "MC dropout, Gal & Ghahramani 2016 Table 1",
}
TWO_LAYER_LABEL = "MC dropout, 2 hidden layers, Gal & Ghahramani 2016 (per-split files)"


@dataclass(frozen=True)
class Entry:
    """One published Bayesian-network test LL: ``same_splits`` True (the PBP / Gal splits),
    False (other splits) or None (not stated); ``verified``: read in the paper or its files."""

    ll: float
    se: float | None
    label: str
    verified: bool
    same_splits: bool | None

    def tags(self):
        splits = {True: "same splits", False: "other splits", None: "splits not stated"}
        return f"{'verified' if self.verified else 'unverified'}, {splits[self.same_splits]}"


def bayesian_entries(name):
    """Every published Bayesian-network LL of a dataset. A value cited again elsewhere (a
    ``fallback`` or ``bayesian`` tuple equal to a column's LL) keeps its primary source."""
    out = [
        Entry(*PUBLISHED[name][c]["ll"], label, True, True)
        for c, label in BAYESIAN_COLUMNS.items()
        if c in PUBLISHED.get(name, {})
    ]
    if name in PUBLISHED_TWO_LAYER:
        out.append(Entry(*PUBLISHED_TWO_LAYER[name]["ll"], TWO_LAYER_LABEL, True, True))
    best = BEST_PUBLISHED.get(name)
    if best is not None:
        if best.bayesian is None:  # the entry itself is a Bayesian network
            out.append(Entry(best.ll, best.se, best.source, best.verified, best.same_splits))
        # fallback: read in its paper; bayesian: a secondary copy of a table (unverified)
        for extra, verified in ((best.fallback, True), (best.bayesian, False)):
            if extra is not None and all(e.ll != extra[0] for e in out):
                out.append(Entry(extra[0], extra[1], extra[2], verified, None))
    return out


def reference(name):
    """The highest LL of :func:`bayesian_entries` (ties: a verified, same-splits one), or None."""
    entries = bayesian_entries(name)
    if not entries:
        return None
    return max(entries, key=lambda e: (e.ll, e.verified, e.same_splits is True))


def not_validated(entry, guide, agg):
    """Why a row cannot be picked on validation (``None`` where it can)."""
    if "val_ll" not in agg:
        return (
            "its summary predates validation LLs (re-summarise its folder: `--report-only --out`)"
        )
    if agg["val_ll"] is None:
        missing = agg.get("val_ll_missing_splits", [])
        if len(missing) == agg["n_splits_done"]:
            return "no validation phase (one configuration; `--validate-single` runs it)"
        return f"no validation LL on {len(missing)} of its splits"
    if sorted(agg["splits"]) != list(range(entry["n_splits"])):
        return f"{agg['n_splits_done']}/{entry['n_splits']} splits"
    return None


def picks(entry, guides):
    """``(test pick, validation pick or None, {guide: why not validated})`` of a dataset's
    rows: the best mean test LL, and the best mean validation LL among the rows that have it.
    ValueError when those rows were validated on different numbers of rows (not comparable)."""
    got = {g: entry["guides"][g] for g in guides if g in entry["guides"]}
    test = max(got, key=lambda g: got[g]["ll"]["mean"])
    why = {g: not_validated(entry, g, a) for g, a in got.items()}
    ok = [g for g in got if why[g] is None]
    if len({tuple(got[g]["val_ll"]["n_val"]) for g in ok}) > 1:
        raise ValueError(
            f"rows {ok} were validated on different numbers of rows per split: re-run them on "
            "one protocol before comparing their validation LLs"
        )
    val = max(ok, key=lambda g: got[g]["val_ll"]["mean"]) if ok else None
    return test, val, {g: w for g, w in why.items() if w is not None}
