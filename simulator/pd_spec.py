"""The `pd` section of a scenario: a disaggregated (prefill/decode) service over two of its pools.

    pools:
      - {name: prefill, latency_model: ..., replicas: 1}
      - {name: decode, latency_model: ..., replicas: 3}
    pd:
      prefill_pool: prefill
      decode_pool: decode
      threshold: 256                  # disaggregate when the prompt's uncached tokens exceed this
      link: {bandwidth_gbs: 50, latency_ms: 1}
      kv_bytes_per_token: 327680      # optional for a derived latency model (its architecture knows)
      loads: all_but_last             # or full_blocks: what of the prompt the decode side loads

Both pools are ordinary pools (their own latency model, TP, replicas, provisioning delay, autoscaler,
metrics); this section only says how the router joins them (simulator.pd). The KV bytes a token
moves are all layers' K and V over all KV heads: layers x 2 x kv_heads x head_dim x KV dtype bytes,
which a derived model records per GPU at its TP.

`loads` is the connector's: `all_but_last` (vLLM's NixlConnector and the live engines here) loads every
prompt token's KV but the last, which the decode side recomputes for its logits; `full_blocks`
(vLLM's ExampleConnector, keyed by whole blocks) loads the whole blocks below the prompt's last
token but one, (prompt - 2) // block x block tokens, and the decode side recomputes the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoscaler.yamlfile import Document

LOADS = ("all_but_last", "full_blocks")
_POS = {"type": "number", "exclusiveMinimum": 0}
_NONNEG = {"type": "number", "minimum": 0}

PD_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["prefill_pool", "decode_pool", "link"],
    "properties": {
        "prefill_pool": {"type": "string", "minLength": 1},
        "decode_pool": {"type": "string", "minLength": 1},
        "threshold": {"type": "integer", "minimum": 0, "maximum": 10_000_000},
        "kv_bytes_per_token": {**_POS, "maximum": 1e9},
        "loads": {"enum": list(LOADS)},
        "link": {
            "type": "object",
            "additionalProperties": False,
            "required": ["bandwidth_gbs"],
            "properties": {
                "bandwidth_gbs": {**_POS, "maximum": 1e5},  # GB/s (1e9 bytes) a transfer gets
                "latency_ms": {**_NONNEG, "maximum": 60_000},
            },
        },
    },
}


@dataclass(frozen=True)
class PDSpec:
    prefill_pool: int  # index into Scenario.pools
    decode_pool: int
    threshold: int  # uncached prompt tokens above which the request is disaggregated
    kv_bytes_per_token: float  # the whole model's KV for one token (all TP ranks)
    bandwidth_bytes_s: float
    latency_s: float
    loads: str = LOADS[0]

    def moves(self, prompt: int, hit: int, block_size: int) -> tuple[int, int]:
        """(tokens whose KV moves, prompt tokens computed when it has) for a prompt whose first `hit`
        tokens the decode replica has cached; the decode side computes the rest of the prompt."""
        if self.loads == "full_blocks":
            done = max(max(prompt - 2, 0) // block_size * block_size, hit)
            return done - hit, done
        return prompt - hit, prompt - 1

    def transfer_seconds(self, tokens: int) -> float:
        """One request's KV move: the link's latency plus its bytes over the bandwidth."""
        return self.latency_s + tokens * self.kv_bytes_per_token / self.bandwidth_bytes_s


def model_kv_bytes_per_token(model) -> float | None:
    """The KV bytes per token of a derived latency model (per GPU x TP), None for a fitted one."""
    mem = ((getattr(model, "provenance", None) or {}).get("derived") or {}).get("memory") or {}
    per_gpu = mem.get("kv_bytes_per_token_per_gpu")
    return float(per_gpu) * int(model.tp or 1) if per_gpu else None


def pd_config(doc: Document, pools: list) -> PDSpec:
    """The checked `pd` section (already schema-validated): pool names resolved, KV bytes found."""
    from simulator.latency import load_latency_model
    from simulator.latency.loader import is_derived

    d = doc.data
    names = [p.name for p in pools]
    idx = {}
    for key in ("prefill_pool", "decode_pool"):
        if d[key] not in names:
            raise doc.error((key,), f"no pool named {d[key]!r} (pools: {', '.join(names)})")
        idx[key] = names.index(d[key])
    if idx["prefill_pool"] == idx["decode_pool"]:
        raise doc.error(("decode_pool",), "must name a different pool than prefill_pool")
    for key in idx.values():
        if pools[key].failure is not None:
            raise doc.error((), f"pool {pools[key].name!r}: failure injection is not modelled for P/D pools")
    kv = d.get("kv_bytes_per_token")
    if kv is None:
        for key in ("prefill_pool", "decode_pool"):  # the same model on both sides: either knows
            lm = pools[idx[key]].latency_model
            kv = model_kv_bytes_per_token(load_latency_model(lm)) if is_derived(lm) else None
            if kv:
                break
    if not kv:
        raise doc.error(("kv_bytes_per_token",), "is required: neither pool's latency model is a derived "
                        "one whose architecture gives the KV bytes per token")
    link = d["link"]
    return PDSpec(idx["prefill_pool"], idx["decode_pool"], int(d.get("threshold", 0)), float(kv),
                  float(link["bandwidth_gbs"]) * 1e9, float(link.get("latency_ms", 0.0)) / 1000,
                  d.get("loads", LOADS[0]))
