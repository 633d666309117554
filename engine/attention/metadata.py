"""What one forward pass tells the attention backend about its mixed batch."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    """Flattened, unpadded batch of prefill chunks and decodes.

    Query token j (0-based within its sequence's chunk of q_len tokens) of sequence s sits at position
    seq_lens[s] - q_len + j and attends causally to KV positions 0..that position. A decode is q_len == 1.
    """

    slot_mapping: torch.Tensor  # int64 [num_tokens]: block_id * block_size + offset, per new token
    block_tables: torch.Tensor  # int32 [num_seqs, max_blocks_per_seq], padded with 0 (never read)
    seq_lens: torch.Tensor  # int32 [num_seqs]: KV length after this step
    query_start_loc: torch.Tensor  # int32 [num_seqs + 1]: offsets of each sequence's new tokens
    max_query_len: int
    max_seq_len: int
    seq_lens_list: list[int]  # host copies, for backends that loop on the CPU
    query_lens_list: list[int]

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_list)

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens_list)


def build_metadata(
    block_tables: list[list[int]],
    seq_lens: list[int],
    query_lens: list[int],
    block_size: int,
    device: torch.device | str = "cpu",
) -> AttentionMetadata:
    """Metadata from host lists: the new tokens of sequence s are its last query_lens[s] positions."""
    if not (len(block_tables) == len(seq_lens) == len(query_lens)):
        raise ValueError("block_tables, seq_lens and query_lens must have one entry per sequence")
    slots = []
    for table, seq_len, q_len in zip(block_tables, seq_lens, query_lens):
        if not 0 < q_len <= seq_len:
            raise ValueError(f"query length {q_len} must be in 1..seq_len ({seq_len})")
        if len(table) * block_size < seq_len:
            raise ValueError(f"block table of {len(table)} blocks cannot hold {seq_len} tokens")
        pos = torch.arange(seq_len - q_len, seq_len)
        blocks = torch.tensor(table, dtype=torch.int64)[pos // block_size]
        slots.append(blocks * block_size + pos % block_size)
    width = max((len(t) for t in block_tables), default=0)
    padded = [list(t) + [0] * (width - len(t)) for t in block_tables]
    starts = [0]
    for q_len in query_lens:
        starts.append(starts[-1] + q_len)
    return AttentionMetadata(
        slot_mapping=(torch.cat(slots) if slots else torch.zeros(0, dtype=torch.int64)).to(device),
        block_tables=torch.tensor(padded, dtype=torch.int32, device=device).reshape(len(padded), width),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        max_query_len=max(query_lens, default=0),
        max_seq_len=max(seq_lens, default=0),
        seq_lens_list=list(seq_lens),
        query_lens_list=list(query_lens),
    )
