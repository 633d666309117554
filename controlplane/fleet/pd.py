"""FLEET.yaml's `pd:` block: a prefill pool and a decode pool of `slopilot serve` engines with KV
transfer between them, the router in P/D mode in front (vLLM's kv_transfer_params protocol).

    name: pd-local
    emulate: llama-3.1-70b@h100-sxm-tp4-bf16   # or model: (real weights); both pools serve it
    engine: {max_num_seqs: 64}         # flags both pools get
    router: true                       # optional: the decode picker's config (the router runs anyway)
    pd:
      threshold: 256                   # prompts with more uncached tokens than this get a prefill hop
      kv_connector: TcpConnector       # default; vLLM's connector names are accepted too
      kv_connector_extra_config: {link: rdma}   # both roles' (link, lease_timeout_s, kv_bytes_per_token)
      prefill:                         # a pool: replicas, min_replicas, max_replicas, engine, autoscaler
        replicas: 1
        max_replicas: 2
        autoscaler: prefill_scaler.yaml
      decode:
        replicas: 3
        engine: {max_num_seqs: 128}    # over the top-level engine flags
    load: ...                          # sent to the router

Each pool is a FleetConfig of its own, named `<name>-prefill` and `<name>-decode` (its replicas'
`fleet` label in Prometheus, so a pool's autoscaler queries select it: `{fleet="pd-local-prefill"}`),
started with `--kv-transfer-config` of role kv_producer or kv_consumer. A pool's autoscaler is
optional: without one it stays at its `replicas`. The top level takes no replicas, min_replicas,
max_replicas or autoscaler beside `pd:` (each pool has its own).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from autoscaler.yamlfile import Document
from controlplane.fleet.fields import RESERVED, FleetConfig, PDFleet, autoscaler_of, check_engine_keys, sizing
from routing.config import load_router_config

ROLES = {"prefill": "kv_producer", "decode": "kv_consumer"}
PER_POOL = ("replicas", "min_replicas", "max_replicas", "autoscaler")  # not at the top level beside pd
PD_RESERVED = {"kv_transfer_config"}  # a P/D fleet sets each pool's role itself


def with_pd_pools(top: FleetConfig, doc: Document, base: Path, engine_flags: set[str] | None) -> FleetConfig:
    """`top` (the fleet's shared fields read) made a P/D fleet: its `pd` holds the two pools' configs;
    errors name file, line and field as load_fleet_config's do."""
    d, pd = doc.data, doc.data["pd"]
    for key in PER_POOL:
        if key in d:
            raise doc.error((key,), "belongs in pd.prefill and pd.decode in a P/D fleet (one per pool)")
    kv = {"kv_connector": pd.get("kv_connector", "TcpConnector")}
    if "kv_connector_extra_config" in pd:
        kv["kv_connector_extra_config"] = pd["kv_connector_extra_config"]
    pools = {}
    for pool, role in ROLES.items():
        where = ("pd", pool)
        check_engine_keys(doc, (*where, "engine"), engine_flags, RESERVED | PD_RESERVED)
        spec, spec_path = autoscaler_of(doc, base, where)
        replicas, min_r, max_r = sizing(doc, where, spec)
        engine = {**top.engine, **pd[pool].get("engine", {}),
                  "kv_transfer_config": json.dumps({**kv, "kv_role": role})}
        pools[pool] = replace(top, name=f"{top.name}-{pool}", engine=engine, replicas=replicas,
                              min_replicas=min_r, max_replicas=max_r, autoscaler=spec,
                              autoscaler_path=spec_path, load=None, router=None)
    p, dec = pools["prefill"], pools["decode"]
    top.replicas = p.replicas + dec.replicas
    top.min_replicas, top.max_replicas = p.min_replicas + dec.min_replicas, p.max_replicas + dec.max_replicas
    top.router = top.router or load_router_config(None)  # the P/D profile lives in the router
    top.pd = PDFleet(int(pd.get("threshold", 0)), p, dec)
    return top
