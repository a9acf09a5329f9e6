"""flowtrace.fit and flowtrace study: fits across runs with intervals, held-out error
and refusals; the study on the simulator (no Spark)."""

from __future__ import annotations

import json
import random

import pytest

pytest.importorskip("numpy")

from flowtrace import cli  # noqa: E402
from flowtrace import fit as FIT  # noqa: E402


def law_rows(a=3.0, b=7.0, noise=2.0, seed=1):
    rng = random.Random(seed)
    return [{"flows": f, "members": m, "routers": r, "core": a * f + b + rng.gauss(0, noise)}
            for f in (50, 100, 200) for m in (1, 2, 4) for r in (20, 40)]


def test_a_linear_law_is_recovered_within_its_confidence_interval():
    f = FIT.fit(law_rows(), "core", ["flows", "members", "routers"])
    assert isinstance(f, FIT.Fit)
    assert f.n == 18 and f.df == 14
    assert f.ci["flows"][0] <= 3.0 <= f.ci["flows"][1]
    assert f.ci["const"][0] <= 7.0 <= f.ci["const"][1]
    assert f.ci["members"][0] <= 0.0 <= f.ci["members"][1]
    assert f.se["flows"] > 0 and f.loo_error is not None and f.loo_error < 0.05
    assert f.extrapolation_runs == 6 and f.extrapolation_error < 0.05
    value, lo, hi = FIT.predict(f, {"flows": 300, "members": 2, "routers": 30})
    assert lo < 3.0 * 300 + 7 < hi and lo < value < hi


def test_the_fit_refuses_with_too_few_runs():
    r = FIT.fit(law_rows()[:4], "core", ["flows", "members", "routers"])
    assert isinstance(r, FIT.Refusal)
    assert "too few runs" in r.reason and "degree(s) of freedom" in r.reason


def test_the_fit_refuses_variables_that_move_together():
    rows = [{"flows": f, "members": 3 * f, "core": f} for f in range(1, 12)]
    r = FIT.fit(rows, "core", ["flows", "members"])
    assert isinstance(r, FIT.Refusal) and "move together" in r.reason


def test_predictions_outside_the_validity_range_are_refused():
    f = FIT.fit(law_rows(), "core", ["flows", "members", "routers"])
    far = FIT.predict(f, {"flows": 100_000, "members": 2, "routers": 30})
    assert isinstance(far, FIT.Refusal) and "outside the range" in far.reason
    rows = [dict(r, routers=20) for r in law_rows()]
    g = FIT.fit(rows, "core", ["flows", "members", "routers"])
    assert g.dropped == {"routers": 20.0}
    r = FIT.predict(g, {"flows": 100, "members": 2, "routers": 2000})
    assert isinstance(r, FIT.Refusal) and "routers was 20 in every run" in r.reason


def test_power_law_exponents_are_recovered():
    rows = [{"flows": f, "members": m, "y": 2.0 * f ** 0.8 * m ** 0.3}
            for f in (10, 30, 100, 300) for m in (1, 3, 9)]
    f = FIT.fit(rows, "y", ["flows", "members"], "power")
    assert f.coef["flows"] == pytest.approx(0.8) and f.coef["members"] == pytest.approx(0.3)


def test_study_on_the_simulator(tmp_path, capsys):
    out = tmp_path / "study"
    code = cli.main(["study", "--out", str(out), "--routers", "12,24", "--flows", "10,20",
                     "--members", "1,2", "--endpoints", "0.25,1", "--lsids", "1,2",
                     "--seeds", "1", "--join-window", "4", "--settle", "3", "--repeats", "1",
                     "--predict", "routers=20,flows=15,members=2,endpoints=5",
                     "--predict", "routers=1000,flows=100000,members=4",
                     "--backbone-cores", "8,12", "--backbone-edges", "3,5",
                     "--backbone-flows", "30,60"])
    assert code == 0
    doc = json.loads((out / "study.json").read_text())
    # the backbone sweep: the same topologies with aggregation off and on, every member
    # receiving exactly its bands; inside the region the busiest table stops following the
    # end flows (its exponent on flows drops from about 1 to about 0)
    bb = doc["backbone"]
    assert len(bb["runs"]) == 32 and bb["delivery_exact"]
    assert {r["aggregate"] for r in bb["runs"]} == {False, True}
    assert bb["core_ratio"]["60"] < 0.5
    exps = {f["fit"]: f["coef"] for f in bb["fits"]
            if f["model"] == "power" and f["term"] == "flows"}
    assert exps["core_max_entries (aggregation off)"] > 0.8
    assert abs(exps["core_max_entries (aggregation on)"]) < 0.3
    runs = doc["runs"]
    assert len(runs) == 32
    # a topology per run; members and endpoints varied apart; one core per LSID
    assert len({r["topology"] for r in runs}) == 32
    assert {(r["members"], r["endpoints"]) for r in runs if r["routers"] == 24} == {
        (1, 6), (1, 24), (2, 6), (2, 24)}
    assert {(r["lsids"], r["core_routers"]) for r in runs} == {(1, 1), (2, 2)}
    # sanity: each core holds exactly the live flows of its own LSID
    assert doc["sanity"]["core_over_live_flows_min"] == 1.0
    assert doc["sanity"]["core_over_live_flows_max"] == 1.0
    assert doc["sanity"]["core_slope_covers_1"]
    # errors are cluster-robust by topology: one cluster per run
    core = [f for f in doc["fits"] if f["target"] == "core_entries" and f["term"] == "lsids"]
    assert core and all(f["df"] == 31 for f in core)
    # the repeat-study coverage check ran and is reported
    cov = doc["coverage"]
    assert cov["repeats"] == 2 and cov["pairs"] > 0 and 0 <= cov["rate"] <= 1
    assert cov["expected"] == pytest.approx(0.834, abs=0.001)
    preds = {(tuple(sorted(p["point"].items())), p["target"]): p for p in doc["predictions"]}
    near = preds[((("endpoints", 5.0), ("flows", 15.0), ("members", 2.0), ("routers", 20.0)),
                  "core_entries")]
    assert 10 < near["low"] <= near["value"] <= near["high"] < 25
    far = preds[((("flows", 100000.0), ("members", 4.0), ("routers", 1000.0)),
                 "core_entries")]
    assert "outside the range" in far["refused"]
    md = (out / "report.md").read_text()
    for text in ("Validity range", "held-out error", "Sanity check", "refused", "date: ",
                 "versions: ", "Repeat-study coverage", "cluster-robust over 32 topologies",
                 "Extrapolation, tested per term", "study_law_core_entries.png",
                 "a different quantity", "Backbone routers with and without aggregation",
                 "location-service router"):
        assert text in md, text
    far_lines = [ln for ln in capsys.readouterr().out.splitlines() if "flows=100,000" in ln]
    assert far_lines and all("refused" in ln for ln in far_lines)


def clustered_rows(rng, slope=2.0, clusters=8, per=12, shock=20.0, noise=1.0):
    """Runs that share a topology share its size and its shock: 12 runs each (the old study's
    design: the routers term is constant within a topology)."""
    rows = []
    for g in range(clusters):
        a, routers = rng.gauss(0, shock), 25.0 * (1 + g % 4)
        for _ in range(per):
            rows.append({"topology": g, "routers": routers,
                         "y": 10 + a + slope * routers + rng.gauss(0, noise)})
    return rows


def test_cluster_robust_intervals_keep_their_coverage_where_classical_ones_do_not():
    rng = random.Random(7)
    covered = {"classical": 0, "cluster": 0}
    repeats = 150
    for _ in range(repeats):
        rows = clustered_rows(rng)
        for kind, cl in (("classical", None), ("cluster", "topology")):
            f = FIT.fit(rows, "y", ["routers"], cluster=cl, holdout=False)
            lo, hi = f.ci["routers"]
            covered[kind] += lo <= 2.0 <= hi
    # runs sharing a topology fitted as independent: far too narrow (~33%); by topology: ~85%
    assert covered["classical"] / repeats < 0.6, covered
    assert covered["cluster"] / repeats > 0.8, covered  # CR1 with 8 clusters: ~85%
    f = FIT.fit(clustered_rows(rng), "y", ["routers"], cluster="topology")
    assert f.clusters == 8 and f.df == 7
    few = FIT.fit(clustered_rows(rng, clusters=3), "y", ["routers"], cluster="topology")
    assert isinstance(few, FIT.Refusal) and "too few independent clusters" in few.reason


def test_extrapolation_is_refused_per_term_where_the_held_out_runs_say_it_fails():
    # y grows like routers squared: linear in flows (extrapolates), not in routers
    rows = [{"flows": f, "routers": r, "y": 3.0 * f + 0.05 * r * r}
            for f in (50, 100, 200) for r in (10, 20, 40, 80) for _ in (1, 2)]
    f = FIT.fit(rows, "y", ["flows", "routers"])
    assert f.extrapolation["flows"][0] is not None
    assert f.extrapolation["routers"][0] > FIT.MAX_EXTRAPOLATION_ERROR
    inside = FIT.predict(f, {"flows": 300, "routers": 40})
    assert not isinstance(inside, FIT.Refusal)  # flows beyond its range: tested and fine
    out = FIT.predict(f, {"flows": 100, "routers": 120})
    assert isinstance(out, FIT.Refusal)
    assert "routers = 120 is beyond the sampled range (10 to 80)" in out.reason
    assert "extrapolating along routers missed the 6 run(s) at routers = 80" in out.reason


def test_study_console_states_a_shared_refusal_once():
    from flowtrace import study_report

    why = "routers and endpoints move together across the runs"
    result = {"sanity": {"core_over_live_flows_mean": 1.0},
              "chosen": {"core_entries": None}, "predictions": [],
              "fits": {"core_entries": [FIT.Refusal("core_entries", m, why)
                                        for m in ("linear", "power")]}}
    line = [ln for ln in study_report.console([], result).splitlines() if "no model" in ln]
    assert line and line[0].count(why) == 1
