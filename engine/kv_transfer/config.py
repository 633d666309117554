"""--kv-transfer-config: vLLM's JSON ({"kv_connector": ..., "kv_role": ...}), checked field by field."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

ROLES = ("kv_producer", "kv_consumer", "kv_both")
# our TCP channel; vLLM's connector names are accepted too, so a launch line written for vLLM
# P/D pairs works unchanged (the wire between two of our engines is ours either way)
CONNECTORS = ("TcpConnector", "NixlConnector", "P2pNcclConnector", "MooncakeConnector")
# vLLM's NIXL producer keeps unread blocks this long (VLLM_NIXL_ABORT_REQUEST_TIMEOUT, 480 s)
DEFAULT_LEASE_TIMEOUT_S = 480.0
# an emulated transfer takes latency + bytes / bandwidth on one of these links (GB/s of 1e9 bytes, ms):
# an RDMA-class link (400 Gb/s NIC) and a TCP-class one (25 Gb/s Ethernet), our assumptions
LINKS = {"rdma": (50.0, 0.5), "tcp": (3.0, 2.0)}


@dataclass
class KVTransferConfig:
    kv_connector: str
    kv_role: str
    kv_ip: str = "127.0.0.1"  # where the producer's channel listens and what it advertises
    kv_port: int = 0  # 0: a free port, advertised in remote_port
    engine_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    lease_timeout_s: float = DEFAULT_LEASE_TIMEOUT_S
    # emulated engines only (serve --emulate): no KV moves, the pull sleeps for the modelled time
    kv_bytes_per_token: float | None = None  # the whole model's K and V for one token
    link_bandwidth_gbs: float = LINKS["rdma"][0]
    link_latency_ms: float = LINKS["rdma"][1]
    # a real producer paces its block payloads to this rate (kv_connector_extra_config.send_bandwidth_gbs:
    # a slow link over loopback); None: as fast as the socket takes them
    send_bytes_per_s: float | None = None

    def transfer_seconds(self, tokens: int) -> float:
        per_token = self.kv_bytes_per_token or 0.0
        return self.link_latency_ms / 1e3 + tokens * per_token / (self.link_bandwidth_gbs * 1e9)

    @property
    def is_producer(self) -> bool:
        return self.kv_role in ("kv_producer", "kv_both")

    @property
    def is_consumer(self) -> bool:
        return self.kv_role in ("kv_consumer", "kv_both")


def parse_kv_transfer_config(text: str | dict[str, Any]) -> KVTransferConfig:
    """The config from the flag's JSON (or a dict); ValueError naming the bad field."""
    if isinstance(text, str):
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--kv-transfer-config is not valid JSON: {exc}") from None
    else:
        raw = dict(text)
    if not isinstance(raw, dict):
        raise ValueError("--kv-transfer-config must be a JSON object")
    connector, role = raw.get("kv_connector"), raw.get("kv_role")
    if connector not in CONNECTORS:
        raise ValueError(f"--kv-transfer-config: kv_connector must be one of {', '.join(CONNECTORS)}, "
                         f"got {connector!r}")
    if role not in ROLES:
        raise ValueError(f"--kv-transfer-config: kv_role must be one of {', '.join(ROLES)}, got {role!r}")
    extra = raw.get("kv_connector_extra_config") or {}
    if not isinstance(extra, dict):
        raise ValueError("--kv-transfer-config: kv_connector_extra_config must be an object")
    port = raw.get("kv_port", 0)
    if not isinstance(port, int) or not 0 <= port < 65536:
        raise ValueError(f"--kv-transfer-config: kv_port must be an integer in 0..65535, got {port!r}")
    lease = extra.get("lease_timeout_s", DEFAULT_LEASE_TIMEOUT_S)
    if not isinstance(lease, (int, float)) or isinstance(lease, bool) or not lease > 0:
        raise ValueError("--kv-transfer-config: kv_connector_extra_config.lease_timeout_s must be a "
                         f"number > 0, got {lease!r}")
    cfg = KVTransferConfig(connector, role, str(raw.get("kv_ip", "127.0.0.1")), port,
                           lease_timeout_s=float(lease))
    _emulation(cfg, extra)
    if raw.get("engine_id"):
        cfg.engine_id = str(raw["engine_id"])
    return cfg


def _emulation(cfg: KVTransferConfig, extra: dict[str, Any]) -> None:
    """kv_bytes_per_token and the link ("rdma", "tcp" or {"bandwidth_gbs", "latency_ms"}), from the
    extra config."""
    kv = extra.get("kv_bytes_per_token")
    if kv is not None:
        if not isinstance(kv, (int, float)) or isinstance(kv, bool) or not kv > 0:
            raise ValueError("--kv-transfer-config: kv_connector_extra_config.kv_bytes_per_token must be a "
                             f"number > 0, got {kv!r}")
        cfg.kv_bytes_per_token = float(kv)
    pace = extra.get("send_bandwidth_gbs")
    if pace is not None:
        if not isinstance(pace, (int, float)) or isinstance(pace, bool) or not pace > 0:
            raise ValueError("--kv-transfer-config: kv_connector_extra_config.send_bandwidth_gbs must be a "
                             f"number > 0, got {pace!r}")
        cfg.send_bytes_per_s = float(pace) * 1e9
    link = extra.get("link", "rdma")
    if isinstance(link, str):
        if link not in LINKS:
            raise ValueError(f"--kv-transfer-config: kv_connector_extra_config.link must be one of "
                             f"{', '.join(LINKS)} or {{bandwidth_gbs, latency_ms}}, got {link!r}")
        cfg.link_bandwidth_gbs, cfg.link_latency_ms = LINKS[link]
    elif isinstance(link, dict):
        bw, lat = link.get("bandwidth_gbs"), link.get("latency_ms", 0.0)
        for name, v, low in (("bandwidth_gbs", bw, 0.0), ("latency_ms", lat, -1.0)):
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > low:
                raise ValueError(f"--kv-transfer-config: kv_connector_extra_config.link.{name} must be a "
                                 f"number {'> 0' if low == 0.0 else '>= 0'}, got {v!r}")
        cfg.link_bandwidth_gbs, cfg.link_latency_ms = float(bw), float(lat)
    else:
        raise ValueError("--kv-transfer-config: kv_connector_extra_config.link must be a name or an object")
