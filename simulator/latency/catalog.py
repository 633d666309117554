"""The shipped catalog: GPU sheets (catalog/gpus.json) and model architectures (catalog/models/*.json,
fields of the published config.json files), looked up by name; an unknown name lists the known ones."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from simulator.latency.arch import Arch, arch_from_config

CATALOG_DIR = Path(__file__).resolve().parent / "catalog"
BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "fp4": 0.5 + 1 / 16}  # fp4: one fp8 scale per 16
WEIGHT_DTYPES = ("bf16", "fp16", "fp8", "fp4")
KV_DTYPES = ("bf16", "fp16", "fp8")


@dataclass(frozen=True)
class Gpu:
    name: str
    label: str
    tflops: dict[str, float]  # dense peak per dtype
    hbm_gbs: float
    memory_gib: float
    link_gbs: float  # one direction, per GPU
    sources: dict[str, str]
    boost_mhz: float = 1410.0  # SM boost clock: small latency-bound kernels run at it

    def peak_flops(self, dtype: str) -> float:
        """Dense FLOP/s of a matmul in dtype; a dtype the GPU lacks runs weight-only at 16 bits."""
        return 1e12 * self.tflops.get(dtype, self.tflops["bf16"])

    def native(self, dtype: str) -> bool:
        return dtype in self.tflops


@lru_cache(maxsize=1)
def _gpu_table() -> dict[str, dict]:
    data = json.loads((CATALOG_DIR / "gpus.json").read_text())
    return {k: v for k, v in data.items() if not k.startswith("_")}


def gpu_names() -> list[str]:
    return sorted(_gpu_table())


def get_gpu(name: str) -> Gpu:
    d = _gpu_table().get(str(name).lower())
    if d is None:
        raise ValueError(f"unknown GPU {name!r} (known: {', '.join(gpu_names())})")
    return Gpu(
        str(name).lower(),
        d["label"],
        {k: float(v) for k, v in d["tflops"].items()},
        float(d["hbm_gbs"]),
        float(d["memory_gib"]),
        float(d["link_gbs"]),
        dict(d["sources"]),
        float(d["boost_mhz"]),
    )


def config_names() -> list[str]:
    return sorted(p.stem for p in (CATALOG_DIR / "models").glob("*.json"))


def read_config(name_or_path: str | Path) -> tuple[dict, str]:
    """(config dict, its label) from a catalog name or a config.json path."""
    text = str(name_or_path)
    if isinstance(name_or_path, Path) or "/" in text or text.endswith(".json"):
        path = Path(text)
        try:
            cfg = json.loads(path.read_text())
        except OSError as exc:
            raise ValueError(f"{path}: cannot read the config ({exc.strerror})") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON ({exc})") from None
        return cfg, path.stem if path.name != "config.json" else path.parent.name
    path = CATALOG_DIR / "models" / f"{text.lower()}.json"
    if not path.is_file():
        raise ValueError(
            f"unknown model config {text!r} (known: {', '.join(config_names())}; or give a config.json path)"
        )
    return json.loads(path.read_text()), text.lower()


def get_arch(name_or_path: str | Path) -> Arch:
    cfg, label = read_config(name_or_path)
    return arch_from_config(cfg, label)


def config_source(name: str) -> str:
    cfg, _ = read_config(name)
    return str(cfg.get("_source", ""))


def check_dtype(dtype: str, allowed: tuple[str, ...], what: str) -> str:
    d = str(dtype).lower()
    if d not in allowed:
        raise ValueError(f"unknown {what} {dtype!r} (known: {', '.join(allowed)})")
    return d
