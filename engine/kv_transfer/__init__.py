"""KV transfer between engines for disaggregated prefill and decode, speaking vLLM's protocol.

A producer (kv_role kv_producer or kv_both) answers a request carrying
`kv_transfer_params: {"do_remote_decode": true}` with the parameters a consumer needs to read the
prompt's KV blocks (`do_remote_prefill`, `remote_engine_id`, `remote_block_ids`, `remote_host`,
`remote_port`, ...), and keeps those blocks referenced under a lease. A consumer given those
parameters reads the blocks over the engines' own channel (TCP here), writes them into its own
blocks, registers them in its prefix cache and decodes from there.
"""

from engine.kv_transfer.config import KVTransferConfig, parse_kv_transfer_config

__all__ = ["KVTransferConfig", "parse_kv_transfer_config"]
