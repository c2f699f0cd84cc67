"""``--validate-single`` (issue 40): the validation phase of a one-configuration row, run apart
from its final units, so that the row has a validation LL and compare.py can pick it. Quick
mode on yacht (splits 0 and 1, 2 epochs): a final run of ``concrete`` (fused kernels) and
``vd-hetero`` (traced), then their validation phase one split per batch."""

import copy
import json
import math
import re
import shutil

import pytest
import torch

from benchmarks import uci
from benchmarks.uci.cli import fill_validation, page_row_problems
from benchmarks.uci.compare import picks
from benchmarks.uci.protocol import _seed
from benchmarks.uci.report import markdown
from benchmarks.uci.summary import summarize
from pyro_dropout.datasets import load_uci

from ._uci import yacht_argv

pytestmark = pytest.mark.usefixtures("one_thread")

SINGLE = ("concrete", "vd-hetero")


def _argv(data_dir, out, guides=",".join(SINGLE)):
    return yacht_argv(data_dir, out, guides, "--epochs", "2")


def _snapshot(folder, pattern):
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in folder.glob(pattern)}


@pytest.fixture(scope="module")
def validated(data_dir, tmp_path_factory):
    """``(out, finals before, summary)``: the final units, then --validate-single over them."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = tmp_path_factory.mktemp("uci-vs") / "out"
        uci.main(_argv(data_dir, out))
        finals = {g: _snapshot(out / "units" / "yacht" / g, "split_*[0-9].json") for g in SINGLE}
        summary = uci.main(_argv(data_dir, out) + ["--validate-single", "--split-batch", "1"])
    finally:
        torch.set_num_threads(threads)
    return out, finals, summary


def test_the_validation_phase_is_written_beside_untouched_final_units(validated):
    out, finals, _ = validated
    for guide in SINGLE:
        unit_dir = out / "units" / "yacht" / guide
        assert _snapshot(unit_dir, "split_*[0-9].json") == finals[guide]  # not touched
        for k in (0, 1):
            final = json.loads((unit_dir / f"split_{k}.json").read_text())
            assert final["validation"] is None  # as the full run wrote it
            val = json.loads((unit_dir / f"split_{k}.val.json").read_text())
            assert val["settings"] == final["settings"]  # the row's protocol, checked
            assert (val["dataset"], val["guide"], val["split"]) == ("yacht", guide, k)
            assert (val["n_subtrain"], val["n_val"]) == (221, 56)  # 80 % of 277 rows
            (config,) = val["configs"]
            assert val["chosen_index"] == 0 and val["chosen"] == final["chosen"]
            assert math.isfinite(config["val_ll"]) and config["val_rmse"] > 0
            phase = val["phase"]
            assert phase["splits_in_batch"] == [k]  # --split-batch 1
            assert phase["seed"] == _seed("yacht", guide, "validation", k)  # as a grid guide's
            assert phase["steps"] == 2 * 2  # 2 epochs of ceil(221 / 128) minibatches
            assert phase["engine"] == ("fused" if guide == "concrete" else "traced")
            assert val["wall_s_share"] > 0 and val["versions"]["torch_threads"] == 1
            assert re.fullmatch(r"[0-9a-f]{40}", val["code"]["commit"])


def test_the_summary_gives_the_row_its_validation_ll_and_compare_picks_it(validated):
    out, _, summary = validated
    entry = summary["datasets"]["yacht"]
    for guide in SINGLE:
        row = entry["guides"][guide]
        unit_dir = out / "units" / "yacht" / guide
        per_split = [
            json.loads((unit_dir / f"split_{k}.val.json").read_text())["configs"][0]["val_ll"]
            for k in (0, 1)
        ]
        assert row["val_ll"]["per_split"] == per_split
        assert row["val_ll"]["mean"] == pytest.approx(sum(per_split) / 2)
        assert row["val_ll"]["n_val"] == [56, 56]
        assert row["val_ll"]["separate_phase_splits"] == [0, 1]
        assert "val_ll_missing_splits" not in row
        assert sum(row["separate_validation"]["commits"].values(), []) == [0, 1]
    # compare.py: with both splits of a two-split dataset, both rows qualify; the higher
    # validation LL is the pick, whatever the test LLs
    two = {**entry, "n_splits": 2}
    _, val, why = picks(two, list(SINGLE))
    assert why == {}
    assert val == max(SINGLE, key=lambda g: entry["guides"][g]["val_ll"]["mean"])
    md = markdown({"datasets": {"yacht": two}}, list(SINGLE))
    assert re.search(rf"\| {val}: [-0-9.e]+ ± [0-9.e-]+ \(validation [-0-9.e]+ §\) †", md)
    note = next(line for line in md.split("\n") if line.startswith("§ Validation LLs"))
    assert "yacht / concrete (splits 0-1); yacht / vd-hetero (splits 0-1)" in note
    versions = md.split("## Code versions")[1]
    assert re.search(r"- yacht / vd-hetero: .*; validation phase run apart", versions)


def test_resume_computes_only_the_missing_validation_units(validated, data_dir, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(validated[0], out)
    unit_dir = out / "units" / "yacht" / "vd-hetero"
    argv = _argv(data_dir, out, "vd-hetero") + ["--validate-single", "--split-batch", "1"]
    before = _snapshot(unit_dir, "*.json")
    uci.main(argv + ["--resume"])
    assert _snapshot(unit_dir, "*.json") == before  # all finished: nothing rewritten
    deleted = json.loads((unit_dir / "split_1.val.json").read_text())
    (unit_dir / "split_1.val.json").unlink()
    uci.main(argv + ["--resume"])
    after = _snapshot(unit_dir, "*.json")
    assert after.keys() == before.keys()
    assert all(after[k] == before[k] for k in after if k != "split_1.val.json")
    again = json.loads((unit_dir / "split_1.val.json").read_text())
    # the same seed, data and code: the same training, up to floating-point reordering
    assert again["phase"]["seed"] == deleted["phase"]["seed"]
    assert again["configs"][0]["val_ll"] == pytest.approx(deleted["configs"][0]["val_ll"], rel=1e-4)


@pytest.mark.parametrize("guide", ["dropout", "meanfield", "vd", "dropout-hetero", "concrete-tau"])
def test_guides_with_their_own_validation_phase_are_refused(data_dir, tmp_path, capsys, guide):
    with pytest.raises(SystemExit) as err:
        uci.main(_argv(data_dir, tmp_path / "out", guide) + ["--validate-single"])
    assert err.value.code == 2
    message = capsys.readouterr().err
    what = "a tau calibration" if guide == "concrete-tau" else "a grid of [0-9]+ configurations"
    assert re.search(rf"--validate-single: yacht / {guide} has {what}", message)
    assert "leave it out of --guides" in message
    assert not (tmp_path / "out").exists()  # refused before anything ran


def test_validate_single_with_report_only_is_refused(data_dir, tmp_path, capsys):
    with pytest.raises(SystemExit):
        uci.main(_argv(data_dir, tmp_path) + ["--validate-single", "--report-only"])
    assert "--report-only trains nothing" in capsys.readouterr().err


def test_other_settings_than_the_final_units_are_refused_before_training(
    validated, data_dir, tmp_path
):
    out = tmp_path / "out"
    shutil.copytree(validated[0], out)
    for path in (out / "units" / "yacht").glob("*/*.val.json"):
        path.unlink()
    argv = _argv(data_dir, out, "vd-hetero") + ["--validate-single", "--epochs", "3"]
    with pytest.raises(RuntimeError, match=r"other settings \(epochs: 2 -> 3\).*must share"):
        uci.main(argv)
    assert not list((out / "units" / "yacht").glob("*/*.val.json"))


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda v: v["settings"].update(epochs=3), r"settings differ .*epochs: 3 -> 2"),
        (lambda v: v["settings"].update(hidden_layers=2), r"hidden_layers: 2 -> None"),
        (lambda v: v["settings"].update(grid=[{"noise": "learned"}]), r"grid: "),
        (lambda v: v.update(split=1), r"its split is 1, the final unit's 0"),
    ],
)
def test_a_validation_unit_of_other_settings_is_refused_not_merged(
    validated, data_dir, tmp_path, edit, message
):
    out = tmp_path / "out"
    shutil.copytree(validated[0], out)
    path = out / "units" / "yacht" / "vd-hetero" / "split_0.val.json"
    record = json.loads(path.read_text())
    edit(record)
    path.write_text(json.dumps(record))
    ds = load_uci("yacht", data_dir)
    with pytest.raises(
        RuntimeError, match=r"split_0\.val\.json is not merged into its row: .*" + message
    ):
        summarize(out, [ds], ["vd-hetero"])


def test_merged_rows_take_the_validation_units_and_the_page_checks_their_commit(
    validated, data_dir, tmp_path
):
    """A committed summary written before the validation units (``val_ll`` None) gets them
    through ``fill_validation``; the page refuses validation units of an uncommitted tree."""
    out = tmp_path / "out"
    shutil.copytree(validated[0], out)
    ds = load_uci("yacht", data_dir)
    fresh = summarize(out, [ds], list(SINGLE))
    stale = copy.deepcopy(fresh)
    for row in stale["datasets"]["yacht"]["guides"].values():
        del row["separate_validation"]
        row.update(val_ll=None, val_ll_missing_splits=[0, 1])
    sources = {("yacht", g): out for g in SINGLE}
    fill_validation(stale, sources, [ds])
    assert stale == {**fresh, "created": stale["created"]}
    for path in (out / "units" / "yacht").glob("*/*.json"):  # finals clean, validation not
        record = json.loads(path.read_text())
        dirty = path.name.endswith(".val.json")
        record["code"] = {"commit": "0123456789abcdef" * 2 + "01234567", "dirty": dirty}
        path.write_text(json.dumps(record))
    problems = page_row_problems(summarize(out, [ds], list(SINGLE)), sources, [ds])
    assert problems == [
        f"yacht / {g}: validation units from 0123456+dirty (splits [0, 1])" for g in SINGLE
    ]


def test_estimate_projects_the_validation_phase_alone(data_dir, tmp_path):
    argv = _argv(data_dir, tmp_path, "vd-hetero") + ["--splits", "0"]
    rows = uci.main(argv + ["--validate-single", "--estimate"])
    (row,) = rows
    assert row["phases"]["final"] == [] and row["final_s"] == 0
    (phase,) = row["phases"]["validation"]
    assert phase["members"] == 1 and phase["splits"] == [0] and row["validation_s"] > 0
    assert "| yacht | vd-hetero | 1 | 1 | 4 |" in (tmp_path / "projection.md").read_text()
    assert "| – | 0 | – |" in (tmp_path / "projection.md").read_text()
