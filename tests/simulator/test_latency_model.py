"""LatencyModel contract: affine decode coefficients, persistence, shipped models, monotonicity."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.latency import LatencyModel, list_named, load_latency_model
from simulator.latency.model import MODELS_DIR, PARAMS

SHIPPED = list_named()
EXPECTED = (
    [f"{d}-llama2-70b-tp{tp}" for d in ("a100", "h100") for tp in (2, 4, 8)]
    + [f"a100-opt-13b-tp{tp}" for tp in (1, 2, 4)]
    + [f"a100-opt-66b-tp{tp}" for tp in (2, 3, 4, 8)]
)


def toy(**over) -> LatencyModel:
    params = dict(
        overhead_ms=5.0,
        prefill_fixed_ms=3.0,
        prefill_seq_ms=1.0,
        decode_seq_ms=0.2,
        gemm_floor_ms=20.0,
        prefill_token_ms=0.1,
        decode_token_ms=0.05,
        prefill_attn_ms=1e-6,
        decode_kv_ms=1e-4,
        roof_p=8.0,
        prefill_knots=[1000.0],
        prefill_hinge_ms=[0.02],
        decode_knots=[16.0],
        decode_hinge_ms=[0.1],
        decode_kv_ramp_ms=[5e-5],
    )
    params.update(over)
    return LatencyModel("toy-gpu", "toy-model", "fp16", 1, params, {"source": "unit test"})


def test_shipped_models_present_and_load():
    assert set(EXPECTED) <= set(SHIPPED)
    for name in SHIPPED:
        m = load_latency_model(name)
        assert load_latency_model(str(MODELS_DIR / f"{name}.json")).params == m.params
        prov = m.provenance
        assert prov["source"] and len(prov["source_sha256"]) == 64 and prov["rows"] > 0
        assert "fit_date" in prov and prov["heldout_error_pct"]["all"]["mape"] >= 0
        assert not str(prov["source"]).startswith("/")  # no machine paths in the project


def test_shipped_model_attributes():
    m = load_latency_model("h100-llama2-70b-tp4")
    assert (m.device, m.model, m.dtype, m.tp) == ("h100-80gb", "llama2-70b", "fp16", 4)
    # decode step of Llama-2-70B on 4 H100s: ~30 ms measured by Splitwise at batch 1
    assert 25 < m.predict_ms("decode", 1, 1, 600) < 35


@pytest.mark.parametrize("given", ["nope", "nope.json", "some/dir/nope", "h100-llama2-70b-tp4.json"])
def test_unknown_latency_model_error_lists_the_shipped_ones(given):
    # a name with a '/' or a .json ending is a path (here: none exists), anything else a shipped name
    with pytest.raises(ValueError, match="no such file or shipped model") as err:
        load_latency_model(given)
    assert repr(given) in str(err.value) and all(name in str(err.value) for name in SHIPPED)


@pytest.mark.parametrize("name", ["toy", *SHIPPED])
def test_decode_coeffs_are_exactly_affine(name):
    m = toy() if name == "toy" else load_latency_model(name)
    for p_tok, p_ctx, d_seq in [(0, 0, 1), (0, 0, 37), (512, 512, 0), (256, 4096, 12), (8192, 8192, 300)]:
        a, b = m.decode_coeffs(p_tok, p_ctx, d_seq)
        for ctx in (0, d_seq, 1000 * d_seq + 7, 10**7):
            assert m.step_ms(p_tok, p_ctx, d_seq, ctx) == a + b * ctx
        assert b >= 0 and a > 0


def test_predict_ms_maps_profile_columns_to_step():
    m = toy()
    assert m.predict_ms("prefill", 4, 2048, 2048) == m.step_ms(2048, 2048, 0, 0, prefill_seqs=4)
    assert m.predict_ms("decode", 8, 8, 8000) == m.step_ms(0, 0, 8, 8000)
    # a mixed row with its split columns, and one without (1 prefill + batch-1 decodes)
    assert m.predict_ms(
        "mixed", 5, 260, 3000, prefill_tokens=256, decode_seqs=4, prefill_context=1000
    ) == pytest.approx(m.step_ms(256, 1000, 4, 2000))
    assert m.predict_ms("mixed", 5, 260, 3000) == pytest.approx(m.step_ms(256, 256 + 548, 4, 4 + 4 * 548))
    vec = m.predict_ms_array(["prefill", "decode"], [4, 8], [2048, 8], [2048, 8000])
    assert np.allclose(vec, [m.predict_ms("prefill", 4, 2048, 2048), m.predict_ms("decode", 8, 8, 8000)])
    with pytest.raises(ValueError, match="unknown phase"):
        m.predict_ms("warmup", 1, 1, 1)


def test_save_load_roundtrip(tmp_path):
    m = toy()
    m.save(tmp_path / "m.json")
    back = LatencyModel.load(tmp_path / "m.json")
    assert back.params == m.params and back.provenance == m.provenance and back.tp == 1
    assert back.step_ms(100, 300, 3, 900) == m.step_ms(100, 300, 3, 900)
    d = json.loads((tmp_path / "m.json").read_text())
    d["params"]["decode_kv_ms"] = -1
    (tmp_path / "bad.json").write_text(json.dumps(d))
    with pytest.raises(ValueError, match="out of range"):
        LatencyModel.load(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text(json.dumps({"format": "x"}))
    with pytest.raises(ValueError, match="not a slopilot latency model"):
        LatencyModel.load(tmp_path / "other.json")
    assert set(PARAMS) <= set(d["params"])


# --- monotone far outside every training range (tokens, batch, context) -----------------------


def _nondecreasing(v: np.ndarray) -> bool:
    return bool(np.all(np.diff(v) >= -1e-9 * np.abs(v[1:])))


@pytest.mark.parametrize("name", ["toy", *SHIPPED])
def test_monotone_on_a_grid_far_outside_training(name):
    m = toy() if name == "toy" else load_latency_model(name)
    lengths = np.unique(np.geomspace(1, 1_000_000, 60).astype(int))  # tokens per sequence
    batches = np.unique(np.geomspace(1, 8192, 40).astype(int))
    for b in (1, 7, 64, 4096):  # prefill: longer prompts, at a fixed batch
        n = b * lengths
        assert _nondecreasing(m.predict_ms_array("prefill", b, n, n))
    for t in (1, 100, 8192, 500_000):  # prefill: more prompts of a fixed length
        n = batches * t
        assert _nondecreasing(m.predict_ms_array("prefill", batches, n, n))
    for ctx in (1, 1000, 100_000):  # decode: more sequences, at a fixed length each
        assert _nondecreasing(m.predict_ms_array("decode", batches, batches, batches * ctx))
        # ... and more sequences sharing a fixed total context
        assert _nondecreasing(m.predict_ms_array("decode", batches, batches, np.full(len(batches), 10**7)))
    for b in (1, 64, 4096):  # decode: longer contexts
        assert _nondecreasing(m.predict_ms_array("decode", b, b, b * lengths))
    for cached in (0, 4096, 10**6):  # chunked prefill: longer chunks on a cached prefix
        assert _nondecreasing(m.step_ms_array(lengths, lengths + cached, 0, 0))


@settings(max_examples=150, deadline=None)
@given(
    p_tok=st.integers(0, 2_000_000),
    extra_ctx=st.integers(0, 10**7),
    d_seq=st.integers(0, 20_000),
    d_ctx=st.integers(0, 10**8),
    which=st.sampled_from(["p_tok", "p_ctx", "d_seq", "d_ctx"]),
    step=st.integers(1, 10**6),
    name=st.sampled_from(["toy", *SHIPPED]),
)
def test_step_ms_monotone_in_each_argument(p_tok, extra_ctx, d_seq, d_ctx, which, step, name):
    m = toy() if name == "toy" else load_latency_model(name)
    args = {"p_tok": p_tok, "p_ctx": p_tok + extra_ctx, "d_seq": d_seq, "d_ctx": d_ctx}
    base = m.step_ms(args["p_tok"], args["p_ctx"], args["d_seq"], args["d_ctx"])
    args[which] += step
    if which == "p_tok":
        args["p_ctx"] += step  # the KV after the step holds the tokens computed in it
    bigger = m.step_ms(args["p_tok"], args["p_ctx"], args["d_seq"], args["d_ctx"])
    assert bigger >= base * (1 - 1e-12)


@pytest.mark.parametrize("name", SHIPPED)
def test_extrapolation_is_linear_not_flat_or_exploding(name):
    m = load_latency_model(name)
    # doubling a batch of 512-token prompts far beyond the data roughly doubles the time
    t1, t2 = (
        m.predict_ms("prefill", 1024, 1024 * 512, 1024 * 512),
        m.predict_ms("prefill", 2048, 2048 * 512, 2048 * 512),
    )
    assert 1.8 < t2 / t1 <= 2.05
    d1, d2 = m.predict_ms("decode", 2048, 2048, 2048 * 1000), m.predict_ms("decode", 4096, 4096, 4096 * 1000)
    assert 1.5 < d2 / d1 <= 2.05
