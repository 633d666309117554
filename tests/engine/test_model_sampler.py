"""Greedy, temperature, top-k and top-p sampling with per-request generators."""

import pytest
import torch

from engine.core.sampling_params import SamplingParams
from engine.sampler import filter_logits, sample


def gen(seed):
    return torch.Generator().manual_seed(seed)


def test_greedy_is_argmax():
    logits = torch.tensor([[0.1, 3.0, -1.0, 2.9], [5.0, 0.0, 0.0, 0.0]])
    assert sample(logits, [SamplingParams(temperature=0)] * 2, [None, None]) == [1, 0]


@pytest.mark.parametrize("top_k,top_p,kept", [
    (2, 1.0, [0, 1]),  # top-k keeps the two largest
    (-1, 0.5, [0]),  # 0.6 alone already covers 0.5
    (-1, 0.7, [0, 1]),  # 0.6 < 0.7, so the second token joins the nucleus
    (-1, 0.95, [0, 1, 2]),
    (3, 0.7, [0, 1]),  # both filters
    (0, 1.0, [0, 1, 2, 3]),  # 0 disables top-k
])
def test_filter_logits(top_k, top_p, kept):
    probs = torch.tensor([0.6, 0.25, 0.1, 0.05])
    out = filter_logits(probs.log(), top_k, top_p)
    assert torch.isfinite(out).nonzero().flatten().tolist() == kept


def test_samples_follow_the_filtered_distribution():
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    params = SamplingParams(temperature=1.0, top_k=3)
    g = gen(0)
    draws = torch.tensor([sample(logits[None], [params], [g])[0] for _ in range(3000)])
    freq = torch.bincount(draws, minlength=4).float() / len(draws)
    assert freq[3] == 0  # outside the top-k: never drawn
    torch.testing.assert_close(freq[:3], torch.tensor([0.5, 0.3, 0.15]) / 0.95, atol=0.03, rtol=0)


def test_low_temperature_sharpens():
    logits = torch.tensor([[1.0, 0.8, 0.0]])
    g = gen(1)
    hot = [sample(logits, [SamplingParams(temperature=5.0)], [g])[0] for _ in range(500)]
    cold = [sample(logits, [SamplingParams(temperature=0.05)], [g])[0] for _ in range(500)]
    assert cold.count(0) > 480 and hot.count(0) < 300


def test_seeded_rows_do_not_depend_on_batch_composition():
    torch.manual_seed(0)
    logits = torch.randn(3, 50)
    p = SamplingParams(temperature=1.0, top_p=0.9)
    g_alone, g_mine, g_other = gen(42), gen(42), gen(7)
    alone = [sample(logits[1:2], [p], [g_alone])[0] for _ in range(20)]
    batched = [sample(logits, [p, p, SamplingParams(temperature=0)], [g_other, g_mine, None])[1]
               for _ in range(20)]
    assert batched == alone and len(set(alone)) > 1


def test_mismatched_lengths_rejected():
    with pytest.raises(ValueError, match="params"):
        sample(torch.zeros(2, 4), [SamplingParams()], [None])


def test_mixed_batch_rows_each_sample_as_if_alone():
    # one batch of greedy, plain, top-k, top-p and both rows: each row draws what it draws alone
    torch.manual_seed(1)
    logits = torch.randn(5, 64) * 2
    params = [SamplingParams(temperature=0), SamplingParams(temperature=1.0),
              SamplingParams(temperature=0.7, top_k=5), SamplingParams(temperature=1.3, top_p=0.6),
              SamplingParams(temperature=0.9, top_k=10, top_p=0.8)]
    batch_gens = [None] + [gen(s) for s in range(1, 5)]
    alone_gens = [None] + [gen(s) for s in range(1, 5)]
    for _ in range(30):
        batched = sample(logits, params, batch_gens)
        alone = [sample(logits[i:i + 1], [params[i]], [alone_gens[i]])[0] for i in range(5)]
        assert batched == alone
        assert batched[0] == int(logits[0].argmax())
        assert batched[2] in logits[2].topk(5).indices.tolist()


def test_filter_logits_takes_one_setting_per_row():
    torch.manual_seed(2)
    logits = torch.randn(3, 32)
    top_k, top_p = torch.tensor([3, -1, 8]), torch.tensor([1.0, 0.5, 0.9], dtype=torch.float64)
    rows = filter_logits(logits, top_k, top_p)
    for i in range(3):
        assert torch.equal(rows[i], filter_logits(logits[i], int(top_k[i]), float(top_p[i])))
    assert int(torch.isfinite(rows[0]).sum()) == 3
