"""bfloat16 models on the CPU: float32-upcast matmuls where bf16 is not native, checked against float32."""

import pytest
import torch
import torch.nn.functional as F

from engine.core.sequence import Sequence
from engine.model import bf16
from engine.model.bf16 import Linear, native_bf16_matmul, set_upcast, upcast_wanted
from engine.model_runner import ModelRunner
from tests.engine.engine_helpers import mixed_prompts, save_random_llama

BLOCK = 16


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    # unit-scale weights, so that errors are not hidden under tiny logits
    return save_random_llama(tmp_path_factory.mktemp("llama_bf16"), initializer_range=0.1)


def logits(runner: ModelRunner, prompts: list[list[int]]) -> torch.Tensor:
    seqs, block = [], 0
    for p in prompts:
        s = Sequence(p)
        n = -(-len(p) // BLOCK)
        s.block_table = list(range(block, block + n))
        block += n
        seqs.append(s)
    return runner.execute_logits(seqs, [len(p) for p in prompts])


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.float() - ref).abs().max() / ref.abs().max()).item()


def test_upcast_linear_is_a_bf16_matmul_with_float32_accumulation():
    torch.manual_seed(0)
    lin = Linear(96, 40, bias=True).to(torch.bfloat16)
    x = torch.randn(7, 96).bfloat16()
    lin.upcast = True
    out = lin(x)
    assert out.dtype == torch.bfloat16
    expected = F.linear(x.float(), lin.weight.float(), lin.bias.float()).bfloat16()
    assert torch.equal(out, expected)
    lin.upcast = False
    assert rel_err(lin(x), expected.float()) < 2e-2  # torch's own bf16 path, however it computes


@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_bf16_model_matches_float32(model_dir, backend):
    """Native and upcast bf16 logits against float32, within bf16's precision, and next tokens agree."""
    prompts = mixed_prompts(6, seed=3, lengths=(1, 9, 40, 70, 120, 33))
    kw = dict(num_kv_blocks=64, block_size=BLOCK, attention_backend=backend)
    ref = logits(ModelRunner(str(model_dir), dtype="float32", **kw), prompts)
    got_by_mode = {}
    for mode in ("native", "upcast"):
        runner = ModelRunner(str(model_dir), dtype="bfloat16", **kw)
        set_upcast(runner.model, mode == "upcast")
        got = got_by_mode[mode] = logits(runner, prompts)
        assert got.dtype == torch.float32 and torch.isfinite(got).all()
        err = rel_err(got, ref)
        assert err < 3e-2, f"{mode}: rel err {err}"
        top_agree = (got.argmax(-1) == ref.argmax(-1)).float().mean().item()
        assert top_agree >= 5 / 6, f"{mode}: greedy tokens agree on {top_agree:.0%} of prompts"
    # both are bf16 products with float32 sums (identical where oneDNN has AMX)
    assert rel_err(got_by_mode["upcast"], got_by_mode["native"]) < 1e-2


def test_build_picks_upcast_only_for_bf16_on_cpus_without_it(model_dir, monkeypatch):
    monkeypatch.setattr(bf16, "native_bf16_matmul", lambda: False)
    r = ModelRunner(str(model_dir), num_kv_blocks=8, dtype="bfloat16")
    assert all(m.upcast for m in r.model.modules() if isinstance(m, Linear))
    assert sum(isinstance(m, Linear) for m in r.model.modules()) == 2 * 4 + 1  # qkv, o, gate_up, down
    r = ModelRunner(str(model_dir), num_kv_blocks=8, dtype="float32")
    assert not any(m.upcast for m in r.model.modules() if isinstance(m, Linear))
    monkeypatch.setattr(bf16, "native_bf16_matmul", lambda: True)
    r = ModelRunner(str(model_dir), num_kv_blocks=8, dtype="bfloat16")
    assert not any(m.upcast for m in r.model.modules() if isinstance(m, Linear))


def test_mode_rules(monkeypatch):
    cpu = torch.device("cpu")
    assert not upcast_wanted("upcast", torch.float32, cpu)  # float32 never upcasts
    assert upcast_wanted("upcast", torch.bfloat16, cpu)
    assert not upcast_wanted("native", torch.bfloat16, cpu)
    with pytest.raises(ValueError, match="auto"):
        upcast_wanted("fast", torch.bfloat16, cpu)
    # oneDNN capped below its bf16 kernels: treated as emulated whatever the CPU has
    native_bf16_matmul.cache_clear()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    try:
        assert not native_bf16_matmul()
    finally:
        native_bf16_matmul.cache_clear()
    monkeypatch.setattr(bf16, "cpu_flags", lambda: {"avx2", "fma"})
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    try:
        assert not native_bf16_matmul() or bf16.platform.machine().lower() in ("aarch64", "arm64")
    finally:
        native_bf16_matmul.cache_clear()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_linear_pads_small_inputs_without_changing_rows(dtype):
    """1-3 rows run as 4 (oneDNN's kernels for fewer rows are slower, see bf16.packed_linear): each
    row comes out as it does in a 4-row call with other rows beside it, and as F.linear computes it."""
    if not bf16.packing_available(dtype, torch.device("cpu")):
        pytest.skip("no oneDNN packed linear here")
    torch.manual_seed(0)
    weight, bias = torch.randn(40, 96).to(dtype), torch.randn(40).to(dtype)
    packed = torch.ops.mkldnn._reorder_linear_weight(weight, 32)
    x = torch.randn(4, 96).to(dtype)
    four = bf16.packed_linear(x, packed, bias)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for rows in (1, 2, 3):
        out = bf16.packed_linear(x[:rows], packed, bias)
        assert out.shape == (rows, 40) and out.is_contiguous()
        assert torch.equal(out, four[:rows])
        assert rel_err(out, F.linear(x[:rows].float(), weight.float(), bias.float())) < tol
