"""Mistakes in a fleet file are errors naming file, line and field, never tracebacks (issue: `emulate:
h100-llama2-70b` gave 23 lines ending in the model list; `max_num_sqes: 16` under engine gave
"argument MODEL: not allowed with argument --emulate", not naming the key)."""

from __future__ import annotations

from pathlib import Path

from slopilot.cli import main

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fleet_local.yaml"


def fleet_up(tmp_path, capsys, old: str, new: str) -> str:
    text = EXAMPLE.read_text()
    assert old in text
    (tmp_path / "fleet.yaml").write_text(text.replace(old, new))
    assert main(["fleet", "up", str(tmp_path / "fleet.yaml"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and not (tmp_path / "out").exists()  # refused before anything starts
    return err.strip()


def test_an_unknown_latency_model_names_the_field_and_lists_the_models(tmp_path, capsys):
    err = fleet_up(tmp_path, capsys, "emulate: h100-llama2-70b-tp4 ", "emulate: h100-llama2-70b ")
    assert err.startswith(f"slopilot fleet: error: {tmp_path / 'fleet.yaml'}:4: emulate: latency model "
                          "'h100-llama2-70b': no such file or shipped model")
    assert "h100-llama2-70b-tp4, h100-llama2-70b-tp8" in err


def test_a_misspelled_engine_flag_is_named_with_a_did_you_mean(tmp_path, capsys):
    err = fleet_up(tmp_path, capsys, "  max_num_seqs: 32", "  max_num_sqes: 32")
    assert err.startswith(f"slopilot fleet: error: {tmp_path / 'fleet.yaml'}:6: engine.max_num_sqes: is not "
                          "a `slopilot serve` flag (did you mean max_num_seqs?); allowed: ")
    assert "max_num_batched_tokens" in err and "help" not in err.split("allowed: ")[1].split(", ")


def test_an_unknown_top_level_key_lists_the_allowed_ones(tmp_path, capsys):
    err = fleet_up(tmp_path, capsys, "\nmax_replicas: 4", "\nmax_replica: 4")
    assert err == (f"slopilot fleet: error: {tmp_path / 'fleet.yaml'}:9: max_replica: unknown field "
                   "(allowed: autoscaler, batch_engine_priority, drain_timeout, emulate, engine, load, "
                   "max_replicas, min_replicas, model, name, pd, replicas, router, scrape_interval, "
                   "start_timeout)")
