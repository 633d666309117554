"""Our paged Llama against transformers' LlamaForCausalLM on the same saved random weights."""

import random

import pytest
import torch

from engine.core.sampling_params import SamplingParams
from engine.core.sequence import Sequence
from engine.model_runner import ModelRunner

transformers = pytest.importorskip("transformers")

BLOCK = 4
ROPE_LLAMA3 = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 256}


def save_hf_model(path, tie=False, rope=None, seed=0, max_shard_size=None):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        vocab_size=320, hidden_size=64, intermediate_size=112, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=tie,
        rope_parameters=rope or {"rope_type": "default", "rope_theta": 5000.0}, initializer_range=0.1,
        bos_token_id=1, eos_token_id=2,
    )
    model = transformers.LlamaForCausalLM(cfg).float().eval()
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(path, **kwargs)
    return model


def hf_last_logits(model, token_ids):
    with torch.no_grad():
        return model(torch.tensor([token_ids])).logits[0, -1].float()


def shuffled_tables(num_blocks, lens, seed=0):
    ids = list(range(num_blocks))
    random.Random(seed).shuffle(ids)
    tables, at = [], 0
    for n in lens:
        k = (n + BLOCK - 1) // BLOCK
        tables.append(ids[at:at + k])
        at += k
    return tables


def assert_rel_close(ours, theirs, rel=1e-4):
    err = (ours - theirs).abs().max().item()
    scale = theirs.abs().max().item()
    assert err <= rel * scale, f"max abs error {err:.3g} vs max |logit| {scale:.3g}"


@pytest.mark.parametrize("tie,rope", [(False, None), (True, None), (False, ROPE_LLAMA3), (True, ROPE_LLAMA3)],
                         ids=["untied", "tied", "llama3-rope", "tied-llama3-rope"])
def test_prefill_then_decode_matches_transformers(tmp_path, tie, rope):
    hf = save_hf_model(tmp_path, tie=tie, rope=rope)
    runner = ModelRunner(str(tmp_path), num_kv_blocks=64, block_size=BLOCK, attention_backend="torch")
    assert runner.config.tie_word_embeddings == tie
    prompt = [1] + [random.Random(1).randrange(3, 320) for _ in range(40)]
    seq = Sequence(prompt, SamplingParams(temperature=0))
    seq.block_table = shuffled_tables(64, [len(prompt) + 1])[0]
    # prefill in two chunks (chunked prefill), sampling after the second
    assert runner.execute([seq], [17]) == [None]
    seq.num_computed_tokens = 17
    prefill_logits = runner.execute_logits([seq], [len(prompt) - 17])
    assert_rel_close(prefill_logits[0], hf_last_logits(hf, prompt))
    next_token = int(prefill_logits[0].argmax())
    seq.num_computed_tokens = len(prompt)
    seq.append_token(next_token)
    decode_logits = runner.execute_logits([seq], [1])
    assert decode_logits.shape == (1, 320) and decode_logits.dtype == torch.float32
    assert_rel_close(decode_logits[0], hf_last_logits(hf, prompt + [next_token]))


def test_mixed_batch_matches_transformers(tmp_path):
    """Decodes, a fresh prefill and a prefill continuation in one flat forward pass."""
    hf = save_hf_model(tmp_path, rope=ROPE_LLAMA3, seed=3)
    runner = ModelRunner(str(tmp_path), num_kv_blocks=64, block_size=BLOCK)
    rng = random.Random(7)
    prompts = [[1] + [rng.randrange(3, 320) for _ in range(n)] for n in (9, 16, 6, 21)]
    tables = shuffled_tables(64, [len(p) + 1 for p in prompts], seed=5)
    seqs = []
    for p, t in zip(prompts, tables):
        s = Sequence(p, SamplingParams(temperature=0))
        s.block_table = t
        seqs.append(s)
    # step 1: prefill seqs 0 and 1 fully, seq 3 partly; seq 2 waits
    out = runner.execute([seqs[0], seqs[1], seqs[3]], [len(prompts[0]), len(prompts[1]), 8])
    assert out[2] is None and all(isinstance(t, int) for t in out[:2])
    for s, n, tok in ((seqs[0], len(prompts[0]), out[0]), (seqs[1], len(prompts[1]), out[1])):
        s.num_computed_tokens = n
        s.append_token(tok)
    seqs[3].num_computed_tokens = 8
    # step 2: two decodes, one fresh prefill, one prefill continuation
    counts = [1, 1, len(prompts[2]), len(prompts[3]) - 8]
    logits = runner.execute_logits(seqs, counts)
    assert logits.shape == (4, 320)
    for s, row in zip(seqs, logits):
        assert_rel_close(row, hf_last_logits(hf, s.token_ids))


def test_sharded_checkpoint_loads_same_weights(tmp_path):
    hf = save_hf_model(tmp_path, max_shard_size="100KB")
    shards = list(tmp_path.glob("model-*.safetensors"))
    assert (tmp_path / "model.safetensors.index.json").is_file() and len(shards) > 1
    runner = ModelRunner(str(tmp_path), num_kv_blocks=8, block_size=BLOCK)
    ours = runner.model.checkpoint_parameters()  # q/k/v, gate/up: rows of the fused projections
    for name, p in hf.state_dict().items():
        torch.testing.assert_close(ours[name], p, rtol=0, atol=0)
    assert len(ours) == len(hf.state_dict())


def test_single_file_checkpoint_and_missing_tensor(tmp_path):
    from safetensors.torch import load_file, save_file

    hf = save_hf_model(tmp_path, tie=True)
    assert (tmp_path / "model.safetensors").is_file()
    runner = ModelRunner(str(tmp_path), num_kv_blocks=8, block_size=BLOCK)
    torch.testing.assert_close(runner.model.lm_head.weight, hf.model.embed_tokens.weight, rtol=0, atol=0)
    tensors = load_file(tmp_path / "model.safetensors")
    del tensors["model.norm.weight"]
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="model.norm.weight"):
        ModelRunner(str(tmp_path), num_kv_blocks=8, block_size=BLOCK)


def test_directory_without_weights_is_rejected(tmp_path):
    save_hf_model(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="safetensors"):
        ModelRunner(str(tmp_path), num_kv_blocks=8, block_size=BLOCK)
