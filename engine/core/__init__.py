"""Torch-free engine core: sequences, KV block manager, scheduler."""
