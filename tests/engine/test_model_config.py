"""config.json parsing, presets, RoPE frequencies and tokenizers."""

import json

import pytest
import torch

from engine.model import PRESETS, ByteTokenizer, HFTokenizer, ModelConfig, load_tokenizer
from engine.model.rope import inv_frequencies

HF_BASE = {"model_type": "llama", "vocab_size": 1000, "hidden_size": 256, "intermediate_size": 512,
           "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2,
           "max_position_embeddings": 2048, "bos_token_id": 1, "eos_token_id": [2, 3]}
SCALING = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 512}


@pytest.mark.parametrize("extra", [
    {"rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", **SCALING}},  # transformers 4.x
    {"rope_theta": 500000.0, "rope_scaling": {"type": "llama3", **SCALING}},  # older "type" key
    {"rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, **SCALING}},  # transformers 5.x
])
def test_rope_spellings_parse_alike(extra):
    cfg = ModelConfig.from_hf_dict({**HF_BASE, **extra})
    assert cfg.rope_theta == 500000.0
    assert cfg.rope_scaling == {"rope_type": "llama3", **SCALING}
    assert (cfg.head_dim, cfg.num_kv_heads, cfg.eos_token_ids, cfg.eos_token_id) == (32, 2, (2, 3), 2)


def test_defaults_and_errors():
    cfg = ModelConfig.from_hf_dict({**HF_BASE, "num_key_value_heads": None, "rope_theta": 10000.0})
    assert cfg.num_kv_heads == 8 and cfg.rope_scaling is None and not cfg.tie_word_embeddings
    with pytest.raises(ValueError, match="hidden_size"):
        ModelConfig.from_hf_dict({k: v for k, v in HF_BASE.items() if k != "hidden_size"})
    with pytest.raises(ValueError, match="yarn"):
        ModelConfig.from_hf_dict({**HF_BASE, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    with pytest.raises(ValueError, match="num_key_value_heads"):
        ModelConfig.from_hf_dict({**HF_BASE, "num_key_value_heads": 3})
    with pytest.raises(ValueError, match="model_type"):
        ModelConfig.from_hf_dict({**HF_BASE, "model_type": "gpt2"})


def test_from_pretrained_dir_errors(tmp_path):
    with pytest.raises(ValueError, match="config.json"):
        ModelConfig.from_pretrained_dir(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="invalid JSON at line 1"):
        ModelConfig.from_pretrained_dir(tmp_path)


@pytest.mark.parametrize("rope_type", ["default", "linear", "llama3"])
def test_inv_frequencies_match_transformers(rope_type):
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    params = {"rope_type": rope_type, "rope_theta": 500000.0}
    if rope_type == "linear":
        params["factor"] = 4.0
    if rope_type == "llama3":
        params.update(SCALING)
    hf_cfg = transformers.LlamaConfig(hidden_size=256, num_attention_heads=2, rope_parameters=params,
                                      max_position_embeddings=2048)
    ours = inv_frequencies(128, 500000.0, None if rope_type == "default" else params)
    if rope_type == "default":
        theirs, _ = LlamaRotaryEmbedding.compute_default_rope_parameters(hf_cfg)
    else:
        theirs, _ = ROPE_INIT_FUNCTIONS[rope_type](hf_cfg)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    if rope_type == "llama3":  # all three bands present: kept, blended and divided by the factor
        base = inv_frequencies(128, 500000.0)
        ratio = base / ours
        assert (ratio == 1).any() and (ratio == 8).any() and ((ratio > 1) & (ratio < 8)).any()


def test_presets_shapes():
    assert PRESETS["tiny"].num_params < 200_000 and PRESETS["tiny"].max_position_embeddings == 1024
    assert 1.1e9 < PRESETS["llama-1b"].num_params < 1.3e9  # Llama-3.2-1B: 1.24B
    assert PRESETS["llama3-8b"].num_params == 8_030_261_248  # Llama-3-8B's published count
    assert 50e6 < PRESETS["small"].num_params < 100e6
    t = PRESETS["tiny"]
    assert (t.hidden_size, t.num_layers, t.num_heads, t.num_kv_heads) == (64, 2, 4, 2)


@pytest.mark.parametrize("bos,eos,vocab,offset",
                         [(256, 257, 512, 0), (1, 2, 320, 3), (128000, 128001, 128256, 0)])
def test_byte_tokenizer_roundtrip(bos, eos, vocab, offset):
    tok = ByteTokenizer(bos, eos, vocab)
    ids = tok.encode("héllo ✓")
    assert ids[0] == bos and ids[1] == offset + ord("h")
    assert all(0 <= i < vocab for i in ids)
    assert tok.decode(ids + [eos]) == "héllo ✓"


def test_byte_tokenizer_needs_room():
    with pytest.raises(ValueError, match="only 200"):
        ByteTokenizer(1, 2, 200)


def test_tokenizer_json_is_used_when_present(tmp_path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 20, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.decoder = decoders.ByteLevel()
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "config.json").write_text(json.dumps(HF_BASE))
    loaded = load_tokenizer(tmp_path, bos_token_id=1, eos_token_id=2, vocab_size=1000)
    assert isinstance(loaded, HFTokenizer)
    ids = loaded.encode("the lazy fox")
    assert ids[0] == 1 and len(ids) < len("the lazy fox")  # BPE merges, BOS from the post-processor
    assert loaded.decode(ids) == "the lazy fox"
    assert isinstance(load_tokenizer(None, 256, 257, 512), ByteTokenizer)
    (tmp_path / "tokenizer.json").write_text("garbage")
    with pytest.raises(ValueError, match="tokenizer.json"):
        load_tokenizer(tmp_path, 1, 2, 1000)
