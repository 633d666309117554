"""A pool takes the calibrated server's scheduling settings from the latency model (settings_from_model)."""

import pytest

from simulator.latency import load_latency_model
from simulator.scenario import load_scenario


def _model_file(tmp_path, settings: dict):
    m = load_latency_model("h100-llama2-70b-tp4")
    m.engine_settings = settings
    path = tmp_path / "server.model.json"
    m.save(path)
    return path


def _pool(path, **extra):
    sc = load_scenario({"seed": 0, "workload": {"trace": {"format": "csv", "path": "unused.csv"}},
                        "pools": [{"name": "p", "latency_model": str(path), "settings_from_model": True,
                                   **extra}]})
    return sc.pools[0]


RECORDED = {"max_num_seqs": 48, "max_num_batched_tokens": 1024, "max_model_len": 3072, "num_kv_blocks": 700,
            "block_size": 32, "enable_prefix_caching": False}


def test_pool_takes_the_recorded_settings(tmp_path):
    pool = _pool(_model_file(tmp_path, RECORDED))
    assert (pool.max_num_seqs, pool.max_num_batched_tokens, pool.max_model_len) == (48, 1024, 3072)
    assert (pool.kv_blocks, pool.block_size, pool.prefix_caching) == (700, 32, False)


def test_the_pools_own_fields_win(tmp_path):
    pool = _pool(_model_file(tmp_path, RECORDED), max_num_seqs=8, prefix_caching=True)
    assert pool.max_num_seqs == 8 and pool.prefix_caching is True and pool.max_num_batched_tokens == 1024


def test_model_json_round_trips_the_settings(tmp_path):
    from simulator.latency.model import LatencyModel

    assert LatencyModel.load(_model_file(tmp_path, RECORDED)).engine_settings == RECORDED


def test_unknown_settings_keep_the_defaults(tmp_path):
    pool = _pool(_model_file(tmp_path, {"max_num_seqs": 16}))
    assert pool.max_num_seqs == 16 and pool.max_num_batched_tokens == 8192  # the pool's default


def test_bad_recorded_setting_is_named(tmp_path):
    with pytest.raises(ValueError, match="settings_from_model.*max_num_seqs = 0"):
        _pool(_model_file(tmp_path, {"max_num_seqs": 0}))
