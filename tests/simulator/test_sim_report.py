"""What a simulated run reports: cost (a fixed fleet and one following the autoscaler), the terminal SLO
verdict and --fail-on-slo-miss, plots a planner can read, and the checked --duration override."""

import json

import pytest

from simulator.run import simulate
from simulator.scenario import load_scenario
from slopilot.cli import main


def scenario(autoscaler=None, duration=300, slo=None, **pool) -> dict:
    p = {"name": "h100", "latency_model": "h100-llama2-70b-tp4", "replicas": 1, **pool}
    if autoscaler is not None:
        p["autoscaler"] = autoscaler
    return {
        "seed": 1,
        "duration": duration,
        "workload": {"arrivals": {"piecewise": [[0, 0.5], [100, 0.5], [110, 8], [200, 8], [210, 0.5]]},
                     "prompt_tokens": 400, "output_tokens": 60},
        "pools": [p],
        "slo": slo or {"ttft": {"percentile": 90, "seconds": 2.0}},
    }


def kpa(**options) -> dict:
    spec = {"scaleTargetRef": {"name": "x"}, "minReplicas": options.pop("min", 1), "maxReplicas": 8,
            "policy": {"type": "kpa", "kpa": {"target": 4, **options}}}
    return {"spec": {"apiVersion": "slopilot.dev/v1alpha1", "kind": "InferenceAutoscaler",
                     "metadata": {"name": "k"}, "spec": spec}}


# ---- cost and the SLO verdict ----------------------------------------------------------------------


def test_cost_of_a_fixed_fleet(tmp_path):
    sc = scenario(None, duration=600, replicas=2, cost_per_hour=10.0)
    sc["currency"] = "EUR"
    sc["pools"].append({"name": "big", "latency_model": "h100-llama2-70b-tp8", "replicas": 1,
                        "cost_per_hour": 30.0})
    res = simulate(sc, tmp_path / "out", plots=False)
    s, c = res.summary, res.summary["costs"]
    run_h = s["simulated_until"] / 3600
    assert c["currency"] == "EUR"
    assert c["total"] == pytest.approx(s["cost"]) == pytest.approx((2 * 10 + 30) * run_h)
    assert c["during_workload"] == pytest.approx((2 * 10 + 30) * 600 / 3600)
    assert c["drain"] == pytest.approx(c["total"] - c["during_workload"]) and c["drain"] > 0
    assert c["drain_seconds"] == pytest.approx(s["simulated_until"] - 600)
    assert c["per_hour_at_peak"] == pytest.approx(50.0)
    assert s["pools"]["h100"]["gpus_per_replica"] == 4 and s["pools"]["big"]["gpus_per_replica"] == 8
    assert c["gpu_hours"] == pytest.approx((2 * 4 + 8) * run_h)
    tokens = s["output_tokens_per_s"] * s["duration"]
    assert c["per_million_output_tokens"] == pytest.approx(c["total"] / tokens * 1e6)
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["costs"] == c
    assert "<h2>Cost</h2>" in (tmp_path / "out" / "report.html").read_text()


def test_peak_cost_follows_the_autoscaler():
    res = simulate(scenario(kpa(), cost_per_hour=8.0), plots=False)
    pool = res.summary["pools"]["h100"]
    assert pool["peak_replicas"] >= max(e[2] for e in res.fleet.pools[0].scale_events)
    assert res.summary["costs"]["per_hour_at_peak"] == pytest.approx(8.0 * pool["peak_replicas"])


@pytest.mark.parametrize(
    "slo,missed",
    [
        ({"ttft": {"percentile": 90, "seconds": 0.001}}, ["ttft"]),
        ({"ttft": 60.0, "tpot": {"percentile": 50, "seconds": 0.0001}}, ["tpot"]),
        ({"ttft": 60.0, "e2e": 600.0}, []),
    ],
)
def test_the_terminal_verdict_and_fail_on_slo_miss(slo, missed, tmp_path, capsys):
    path = tmp_path / "sc.yaml"
    path.write_text(json.dumps(scenario(None, duration=200, slo=slo)))
    argv = ["simulate", str(path), "-o", str(tmp_path / "out"), "--no-plots"]
    assert main(argv) == 0
    plain = capsys.readouterr().out
    assert main(argv + ["--fail-on-slo-miss"]) == (1 if missed else 0)
    assert capsys.readouterr().out == plain
    assert ("requests ok" in plain) == (not missed)
    for name in slo:
        verdict = "MISSED" if name in missed else "met"
        assert any(line.startswith(f"SLO {name} p") and f"({verdict})" in line for line in plain.splitlines())
    assert "per million output tokens" in plain and "/h at the peak" in plain


# ---- plots ---------------------------------------------------------------------------------------------


def test_plots_a_planner_can_read(tmp_path, monkeypatch):
    import simulator.plots as plots

    figures = {}
    save = plots._save

    def keep(fig, out, name):
        figures[name] = fig
        return save(fig, out, name)

    monkeypatch.setattr(plots, "_save", keep)
    sc = scenario(kpa(), slo={"ttft": {"percentile": 90, "seconds": 2.0}, "tpot": 0.05})
    simulate(sc, tmp_path / "out", plots=True)
    assert set(figures) == {"replicas_vs_load.png", "latency_over_time.png", "latency_cdfs.png",
                            "queue_and_kv.png"}
    assert all((tmp_path / "out" / name).stat().st_size > 1000 for name in figures)

    ax = figures["replicas_vs_load.png"].axes[0]
    assert all(float(t).is_integer() for t in ax.get_yticks())  # whole replicas
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["h100 ready", "h100 desired", "arrivals/s"]  # the twin axis' line too

    ttft_ax, tpot_ax = figures["latency_over_time.png"].axes
    assert "SLO ttft p90 <= 2 s" in [t.get_text() for t in ttft_ax.get_legend().get_texts()]
    assert "SLO tpot p90 <= 0.05 s" in [t.get_text() for t in tpot_ax.get_legend().get_texts()]

    cdf_ttft, cdf_tpot, cdf_e2e = figures["latency_cdfs.png"].axes
    assert any(list(line.get_xdata()) == [2.0, 2.0] for line in cdf_ttft.get_lines())  # SLO seconds
    assert any(list(line.get_ydata()) == [0.9, 0.9] for line in cdf_ttft.get_lines())  # its percentile
    assert any(list(line.get_xdata()) == [0.05, 0.05] for line in cdf_tpot.get_lines())
    assert cdf_e2e.get_legend() is not None

    top, bottom = figures["queue_and_kv.png"].axes
    assert [t.get_text() for t in top.get_legend().get_texts()] == ["h100 waiting", "h100 running"]
    assert all(float(t).is_integer() for t in top.get_yticks())
    assert [t.get_text() for t in bottom.get_legend().get_texts()] == ["h100 mean KV-cache usage"]
    assert bottom.get_ylim() == (0, 100)


def test_duration_override_is_checked(tmp_path, capsys):
    path = tmp_path / "sc.yaml"
    path.write_text(json.dumps(scenario(None)))
    for value in ("1e12", "0", "-5", "nan"):
        assert main(["simulate", str(path), "-o", str(tmp_path / "o"), f"--duration={value}"]) == 2
        assert "in place of the file's): must be a number > 0 and <= 2592000 s" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
    assert load_scenario(scenario(None), duration=60).duration == 60


def test_latency_over_time_shows_requests_that_never_finished(tmp_path, monkeypatch):
    # one replica (16 sequences) at 8 req/s from minute 2 on, no drain: the late arrivals never finish,
    # and the plot of finished requests only used to look empty after the overload began
    import numpy as np

    import simulator.plots as plots

    figures = {}
    save = plots._save
    monkeypatch.setattr(plots, "_save", lambda fig, out, name: save(figures.setdefault(name, fig), out, name))
    sc = scenario(duration=600, max_num_seqs=16)
    sc["workload"]["arrivals"] = {"piecewise": [[0, 0.5], [110, 0.5], [120, 8]]}
    sc["workload"]["output_tokens"] = 300
    sc["drain"] = {"enabled": False}
    simulate(sc, tmp_path / "out", plots=True)
    ttft_ax, tpot_ax, share_ax = figures["latency_over_time.png"].axes
    p90 = next(line for line in ttft_ax.get_lines() if line.get_label() == "p90")
    minutes, values = np.asarray(p90.get_xdata()), np.asarray(p90.get_ydata())
    assert minutes.max() == 9  # every arrival minute, the last included
    assert values[-1] > 10 * values[0]  # the backlog shows as a rising line
    assert ttft_ax.get_ylabel() == "TTFT (s)"
    assert "o: at least (unserved at their wait)" in [t.get_text() for t in ttft_ax.get_legend().get_texts()]
    share = np.asarray(share_ax.get_lines()[0].get_ydata())
    assert share[0] == 0 and share[-1] > 50  # most of the last minute's arrivals never had a first token
    assert tpot_ax.get_xlim() == ttft_ax.get_xlim()
