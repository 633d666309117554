"""The profile CSV's columns: one row per measured engine step (DESIGN.md's contract).

The engine's profilers write it and the simulator's latency fit reads it, so both import these.
"""

KEY_COLUMNS = ("device", "model", "dtype", "tp")  # which engine was measured
SHAPE_COLUMNS = ("batch_size", "num_tokens", "context_tokens")  # the step's shape
PROFILE_COLUMNS = KEY_COLUMNS + ("phase",) + SHAPE_COLUMNS + ("latency_ms",)  # required, in this order
PHASES = ("prefill", "decode", "mixed")  # mixed: a chunked-prefill step that also decodes
# the split of a mixed step, optional (without it the fit assumes one); our profilers write it
MIXED_COLUMNS = ("prefill_tokens", "decode_seqs", "prefill_context", "prefill_seqs", "decode_context")
