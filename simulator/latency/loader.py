"""Loading any latency model: a fitted one (a JSON path or a shipped name) or a derived one (a name
CONFIG@GPU-tpN-DTYPE[-kvDTYPE], or in a scenario or plan the mapping {config, gpu, tp, dtype, kv_dtype})."""

from __future__ import annotations

from pathlib import Path

from simulator.latency import model as fitted
from simulator.latency.catalog import KV_DTYPES, WEIGHT_DTYPES, gpu_names
from simulator.latency.derive import derive, derived_name, parse_derived_name
from simulator.latency.model import LatencyModel

# the schema of a scenario's or plan's latency_model: a name or path, or what to derive
LATENCY_MODEL_SCHEMA = {
    "if": {"type": "object"},
    "then": {
        "type": "object",
        "additionalProperties": False,
        "required": ["config", "gpu", "tp"],
        "properties": {
            "config": {"type": "string", "minLength": 1},
            "gpu": {"enum": gpu_names()},
            "tp": {"type": "integer", "minimum": 1, "maximum": 64},
            "dtype": {"enum": list(WEIGHT_DTYPES)},
            "kv_dtype": {"enum": list(KV_DTYPES)},
        },
    },
    "else": {"type": "string", "x-message": "must be a model name, a .json path or {config, gpu, tp, dtype}"},
}


def model_ref(value: str | dict) -> str:
    """The one string naming a latency model: a mapping becomes its derived name."""
    if isinstance(value, dict):
        return derived_name(
            value["config"], value["gpu"], value["tp"], value.get("dtype", "bf16"), value.get("kv_dtype")
        )
    return value


def is_derived(name: str | Path) -> bool:
    return not fitted.is_model_path(name) and parse_derived_name(str(name)) is not None


def load_latency_model(name_or_path: str | Path | dict) -> LatencyModel:
    """A latency model from a JSON path, a shipped name, a derived name or a derive mapping."""
    ref = model_ref(name_or_path) if isinstance(name_or_path, dict) else name_or_path
    if not fitted.is_model_path(ref):
        spec = parse_derived_name(str(ref))
        if spec is not None:
            return derive(**spec)
        if "@" in str(ref):
            raise ValueError(
                f"latency model {str(ref)!r}: a derived model is named CONFIG@GPU-tpN-DTYPE"
                "[-kvDTYPE], e.g. llama-3.1-70b@h200-tp4-fp8"
            )
    return fitted.load_latency_model(ref)


def derived_error_note(names: list[str]) -> str:
    """One sentence on the held-out error of the derived models among names ('' if none is derived)."""
    from simulator.latency.derive import load_efficiencies

    derived = sorted({str(n) for n in names if is_derived(n)})
    if not derived:
        return ""
    splits = {r["split"]: r["heldout_error_pct"] for r in load_efficiencies()[1].get("heldout", [])}

    def pct(split: str) -> str:
        e = splits.get(split, {})
        return "/".join(f"{e[p]['mape']:.0f}%" for p in ("decode", "prefill") if p in e) or "-"

    worst = {p: max((e[p]["mape"] for e in splits.values() if p in e), default=float("nan"))
             for p in ("decode", "prefill")}
    new_gpu, new_model = pct("GPU: fit a100-80gb, predict h100-sxm"), pct("model: predict BLOOM-176B")
    shown = ", ".join(derived[:3]) + (", ..." if len(derived) > 3 else "")
    return (f"Step times of {len(derived)} derived latency model(s) ({shown}): held-out MAPE decode/prefill "
            f"{new_gpu} for a GPU not measured (fit A100, predict H100), {new_model} for a model not "
            f"measured (BLOOM-176B), at worst {worst['decode']:.0f}%/{worst['prefill']:.0f}% over every "
            "split "
            "(slopilot models list).")
