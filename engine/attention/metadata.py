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
    positions: torch.Tensor | None = None  # int64 [num_tokens]: each new token's position

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
    """Metadata from host lists: the new tokens of sequence s are its last query_lens[s] positions.

    A fixed number of tensor ops whatever the batch: the per-sequence work is list arithmetic only.
    """
    if not (len(block_tables) == len(seq_lens) == len(query_lens)):
        raise ValueError("block_tables, seq_lens and query_lens must have one entry per sequence")
    for table, seq_len, q_len in zip(block_tables, seq_lens, query_lens):
        if not 0 < q_len <= seq_len:
            raise ValueError(f"query length {q_len} must be in 1..seq_len ({seq_len})")
        if len(table) * block_size < seq_len:
            raise ValueError(f"block table of {len(table)} blocks cannot hold {seq_len} tokens")
    num_seqs = len(seq_lens)
    width = max((len(t) for t in block_tables), default=0)
    tables = torch.tensor([t + [0] * (width - len(t)) for t in block_tables], dtype=torch.int64)
    tables = tables.reshape(num_seqs, width)
    starts = [0]
    for q_len in query_lens:
        starts.append(starts[-1] + q_len)
    lens = torch.tensor(seq_lens, dtype=torch.int64)
    q_lens = torch.tensor(query_lens, dtype=torch.int64)
    # token i of the flat batch: its sequence, and its position (the last q_len positions of that sequence)
    seq_of = torch.repeat_interleave(torch.arange(num_seqs), q_lens)
    offset = (lens - q_lens - torch.tensor(starts[:-1], dtype=torch.int64))[seq_of]
    pos = torch.arange(starts[-1]) + offset
    slots = tables[seq_of, pos // block_size] * block_size + pos % block_size
    return AttentionMetadata(
        slot_mapping=slots.to(device),
        block_tables=tables.to(torch.int32).to(device),
        seq_lens=lens.to(torch.int32).to(device),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        max_query_len=max(query_lens, default=0),
        max_seq_len=max(seq_lens, default=0),
        seq_lens_list=list(seq_lens),
        query_lens_list=list(query_lens),
        positions=pos.to(device),
    )
