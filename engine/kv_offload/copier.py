"""Copies KV blocks between the runner's device pool and a host pool of the same layout (torch).

One host tensor per layer and per K/V, [slots, block_size, kv_heads, head_dim], allocated lazily
by the OS (torch.empty) so a large tier costs memory only as it fills. On a CUDA device the host
pool is pinned, so the copies are DMA transfers over PCIe; on the CPU engine it is a second pool
in the same RAM, standing for host memory.
"""

from __future__ import annotations

import torch

from engine.kv_offload.tier import timed


class TensorCopier:
    def __init__(self, kv_caches: list[tuple[torch.Tensor, torch.Tensor]], num_slots: int):
        self.kv_caches = kv_caches
        k = kv_caches[0][0]
        shape = (num_slots, *k.shape[1:])
        pin = k.device.type == "cuda"
        self.host = [(torch.empty(shape, dtype=k.dtype, pin_memory=pin),
                      torch.empty(shape, dtype=k.dtype, pin_memory=pin)) for _ in kv_caches]
        self.device = k.device

    @staticmethod
    def block_bytes(kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> int:
        k = kv_caches[0][0]
        return 2 * len(kv_caches) * k[0].numel() * k.element_size()

    @torch.inference_mode()
    def store(self, blocks: list[int], slots: list[int]) -> float:
        src = torch.tensor(blocks, dtype=torch.int64, device=self.device)
        dst = torch.tensor(slots, dtype=torch.int64)

        def copy() -> None:
            for (dk, dv), (hk, hv) in zip(self.kv_caches, self.host):
                hk.index_copy_(0, dst, dk.index_select(0, src).to("cpu"))
                hv.index_copy_(0, dst, dv.index_select(0, src).to("cpu"))
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)

        return timed(copy)

    @torch.inference_mode()
    def load(self, slots: list[int], blocks: list[int]) -> float:
        src = torch.tensor(slots, dtype=torch.int64)
        dst = torch.tensor(blocks, dtype=torch.int64, device=self.device)

        def copy() -> None:
            for (dk, dv), (hk, hv) in zip(self.kv_caches, self.host):
                dk.index_copy_(0, dst, hk.index_select(0, src).to(self.device, non_blocking=True))
                dv.index_copy_(0, dst, hv.index_select(0, src).to(self.device, non_blocking=True))
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)

        return timed(copy)
