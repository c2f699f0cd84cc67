"""The speed benchmark is a script; this only checks that its --quick mode runs and reports."""

import json

from benchmarks import speed, step_profile


def test_quick_mode_writes_json_and_markdown(tmp_path):
    out, md = tmp_path / "speed.json", tmp_path / "speed.md"
    report = speed.main(["--quick", "--rounds", "1", "--json", str(out), "--markdown", str(md)])
    saved = json.loads(out.read_text())
    assert len(saved["code"]["commit"]) == 40  # which code produced the numbers
    assert set(saved["results"]) == {"W1", "W2"}
    assert saved["matmul_peak_gflops"] > 0
    for w in ("W1", "W2"):
        ratios = report["results"][w]["ratios"]
        expected = {
            f"{kind}/{g}"
            for kind in ("fit", "eager", "tutorial", "user-loop", "user-loop-mf")
            for g in speed.GUIDES
        }
        expected |= {"predict", "predict" + speed.PER_EXAMPLE_SUFFIX}
        assert set(ratios) == expected
        assert all(r > 0 for r in ratios.values())
        profile = report["results"][w]["profile"]
        fit_dropout = profile["fit: AutoDropout"]
        assert {"loss graph", "backward", "optimiser + SVI", "step"} == set(fit_dropout["phases"])
        assert {"guide", "model + LRT", "ELBO terms"} <= set(
            profile["eager: AutoDropout"]["phases"]
        )
        # LRT for a Gaussian family: two products per layer (mean and variance), twice the plain
        # network's matrix-product FLOPs
        assert abs(profile["fit: AutoMeanField"]["flops_vs_plain"] - 2.0) < 0.01
    text = md.read_text()
    assert 'fit\'s default step, compiled (jit="auto"), AutoDropout + LRT' in text
    assert "fit's step with jit=False (eager), AutoDropout + LRT" in text
    assert "user's SVI loop" in text and "% of peak" in text
    assert "user's SVI loop with MeanFieldELBO, AutoConcreteDropout + LRT" in text


def test_targets_are_the_issues():
    assert speed.target("fit", "AutoDropout", "W1") == 1.5
    assert speed.target("fit", "AutoConcreteDropout", "W2") == 1.1
    assert speed.target("tutorial", "AutoMeanField", "W2") == 2.0
    assert speed.target("user-loop", "AutoVariationalDropout", "W1") == 1.3
    assert speed.target("user-loop-mf", "AutoConcreteDropout", "W2") == 1.3
    assert speed.target("predict", None, "W1") == 1.0


def test_step_flops_counts_a_matmul_forward_and_backward():
    import torch

    a = torch.randn(4, 5, requires_grad=True)
    b = torch.randn(5, 3)
    flops = step_profile.step_flops(lambda: (a @ b).sum().backward())
    assert flops == 2 * 4 * 5 * 3 * 2  # forward, and the gradient with respect to a


def test_cuda_graph_rows_ratios_and_table():
    """The CUDA rows (run only on a GPU): fit's graphed step against the plain step and against
    the plain step as one CUDA graph, rendered with fit's targets."""
    med = {speed.PLAIN: 2.0, speed.PLAIN_GRAPH: 0.1, speed.USER_BASELINE: 10.0,
           "plain dropout predict loop": 20.0, "predict (AutoDropout)": 10.0,
           "predict (AutoDropout)" + speed.PER_EXAMPLE_SUFFIX: 15.0}  # fmt: skip
    for g in speed.GUIDES:
        for kind in ("fit", "eager", "tutorial"):
            med[f"{kind}: {g}"] = 3.0
        med[f"graph: {g}"] = 0.5
        med[f"user SVI loop: {g} + LRT"] = 12.0
    ratios = speed._ratios(med)
    assert ratios["graph/AutoDropout"] == 0.25
    assert ratios["graph-vs-plain-graph/AutoDropout"] == 5.0
    assert ratios["plain-graph"] == 0.05
    report = {"results": {w: {"ratios": ratios, "median_seconds": med} for w in ("W1", "W2")}}
    text = speed.markdown(report)
    assert "fit's step with cuda_graph=True, AutoConcreteDropout + LRT | 0.25× ✅ (≤ 1.5)" in text
    assert "the same against the plain step as one CUDA graph, AutoMeanField | 5.00×" in text
    assert "plain step as one CUDA graph vs plain step | 0.05× | 0.05×" in text
