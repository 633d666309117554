"""Converters from the public Splitwise / DistServe data to profile rows."""

import json

import pytest

from simulator.latency.convert import distserve_rows, splitwise_rows
from slopilot.cli import main

SPLITWISE_HEADER = (
    "model,hardware,prompt_size,batch_size,token_size,peak_power,average_power,prompt_time,"
    "token_time,e2e_time,tensor_parallel\n"
)


def test_splitwise_rows_semantics(tmp_path):
    path = tmp_path / "perf.csv"
    path.write_text(
        SPLITWISE_HEADER
        + "llama2-70b,h100-80gb,512,4,128,1,1,195.3,29.9,4000,4\n"
        + "llama2-70b,a100-80gb,512,4,128,1,1,571.4,45.1,6000,4\n"
    )
    rows = splitwise_rows(path, device="h100-80gb")
    assert len(rows) == 2
    pre, dec = rows
    assert (pre["phase"], pre["batch_size"], pre["num_tokens"], pre["context_tokens"], pre["latency_ms"]) == (
        "prefill",
        4,
        2048,
        2048,
        195.3,
    )
    # decode: one token per sequence, context = batch x mean KV length over the generation
    assert (dec["phase"], dec["batch_size"], dec["num_tokens"], dec["context_tokens"], dec["latency_ms"]) == (
        "decode",
        4,
        4,
        4 * (512 + 64),
        29.9,
    )
    assert pre["tp"] == 4 and pre["device"] == "h100-80gb" and pre["source_row"] == 2
    with pytest.raises(ValueError, match="no rows match"):
        splitwise_rows(path, device="tpu")
    (tmp_path / "x.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="not a Splitwise"):
        splitwise_rows(tmp_path / "x.csv")


def test_distserve_rows_reproduce_the_fitted_formulas(tmp_path):
    coeffs = {
        "facebook/opt-13b": {
            "1": {
                "decoding_large_small_bs_threshold": 95,
                "prefill": [20.0, 0.1, 1e-5],
                "decoding_smallbs": [23.0, 6e-4, 0.06],
                "decoding_largebs": [20.0, 5e-4, 0.12],
            }
        }
    }
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(coeffs))
    rows = distserve_rows(path, "opt-13b", 1)
    pre = next(
        r for r in rows if r["phase"] == "prefill" and r["batch_size"] == 4 and r["prompt_tokens"] == 512
    )
    assert pre["latency_ms"] == pytest.approx(20 + 0.1 * 2048 + 1e-5 * 4 * 512**2)
    small = next(
        r for r in rows if r["phase"] == "decode" and r["batch_size"] == 64 and r["seq_context"] == 1024
    )
    assert small["latency_ms"] == pytest.approx(23 + 6e-4 * 64 * 1024 + 0.06 * 64)
    large = next(
        r for r in rows if r["phase"] == "decode" and r["batch_size"] == 128 and r["seq_context"] == 1024
    )
    assert large["latency_ms"] == pytest.approx(20 + 5e-4 * 128 * 1024 + 0.12 * 128)
    assert {r["device"] for r in rows} == {"a100-80gb"} and {r["model"] for r in rows} == {"opt-13b"}
    assert max(r["num_tokens"] for r in rows if r["phase"] == "prefill") <= 16384


def test_convert_cli_on_the_public_data(shared_data, tmp_path, capsys):
    out = tmp_path / "sw.csv"
    rc = main(
        [
            "convert",
            "splitwise",
            str(shared_data / "profiles" / "splitwise_perf_model.csv"),
            "-o",
            str(out),
            "--device",
            "h100-80gb",
            "--model",
            "llama2-70b",
            "--tp",
            "4",
        ]
    )
    assert rc == 0 and "210 rows" in capsys.readouterr().out
    from simulator.latency.profile import read_profile

    prof = read_profile(out)
    assert prof.groups() == [("h100-80gb", "llama2-70b", "fp16", 4)]
    rc = main(
        [
            "convert",
            "distserve",
            str(shared_data / "profiles" / "distserve_a100_80g_vllm.json"),
            "-o",
            str(tmp_path / "ds.csv"),
        ]
    )
    text = capsys.readouterr().out
    assert rc == 0 and "opt-66b/tp8" in text and "opt-13b/tp1" in text
    assert len(read_profile(tmp_path / "ds.csv").groups()) == 7
