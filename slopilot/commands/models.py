"""slopilot models: the latency models it ships (fitted) and can derive (a model config x a GPU sheet)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HELP = "list, show and derive latency models (fitted on measurements, or from a model config and a GPU sheet)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    sub.add_parser("list", help="every shipped fitted model, config and GPU, with source and held-out error")
    s = sub.add_parser("show", help="one model's JSON (a shipped name, a path, or CONFIG@GPU-tpN-DTYPE)")
    s.add_argument("name")
    d = sub.add_parser("derive", help="derive a latency model from a model config and a GPU sheet")
    d.add_argument(
        "--config", required=True, help="a shipped config name (see `models list`) or a config.json"
    )
    d.add_argument("--gpu", required=True, help="a GPU sheet name (see `models list`)")
    d.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (default 1)")
    d.add_argument("--dtype", default="bf16", help="weight dtype: bf16, fp16, fp8, fp4 (default bf16)")
    d.add_argument("--kv-dtype", default=None, help="KV-cache dtype: bf16, fp16, fp8 (default: 16-bit)")
    d.add_argument("--block-size", type=int, default=16)
    d.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    d.add_argument("-o", "--output", type=Path, help="write the model JSON here")


def _pct(table: dict | None, phase: str) -> str:
    e = (table or {}).get(phase)
    return f"{e['mape']:.1f}%" if e else "-"


def _list() -> int:
    from simulator.latency import list_named, load_latency_model
    from simulator.latency.catalog import config_names, config_source, get_gpu, gpu_names
    from simulator.latency.derive import load_efficiencies

    print(
        "Fitted models (shipped; step times measured on real hardware; held-out MAPE of a random 20% of rows)"
    )
    print(
        f"  {'name':<24} {'device':<10} {'model':<12} {'dtype':<5} {'tp':>2}  {'decode':>7} {'prefill':>7}"
        "  source"
    )
    for name in list_named():
        m = load_latency_model(name)
        held = m.provenance.get("heldout_error_pct")
        print(
            f"  {name:<24} {m.device:<10} {m.model:<12} {m.dtype:<5} {m.tp:>2}  {_pct(held, 'decode'):>7} "
            f"{_pct(held, 'prefill'):>7}  {m.provenance.get('source', '')}"
        )
    _, prov = load_efficiencies()
    print(
        "\nDerived models: any config x GPU x TP x dtype, named CONFIG@GPU-tpN-DTYPE[-kvDTYPE] "
        "(e.g. llama-3.1-70b@h200-tp4-fp8)"
    )
    print("  efficiencies fitted on: " + ", ".join(prov.get("groups", [])))
    print(f"  {'held-out split':<40} {'decode':>7} {'prefill':>7}  (MAPE; plain roofline decode / prefill)")
    for row in prov.get("heldout", []):
        e, r = row["heldout_error_pct"], row["plain_roofline_error_pct"]
        print(
            f"  {row['split']:<40} {_pct(e, 'decode'):>7} {_pct(e, 'prefill'):>7}  "
            f"({_pct(r, 'decode')} / {_pct(r, 'prefill')})"
        )
    print("\nModel configs (architecture fields of the published config.json)")
    for name in config_names():
        print(f"  {name:<18} {config_source(name)}")
    print("\nGPU sheets (dense peak TFLOP/s, HBM, memory, TP link one way; sources in the catalog)")
    for name in gpu_names():
        g = get_gpu(name)
        peaks = " ".join(f"{k} {v:g}" for k, v in g.tflops.items() if k != "fp16")
        print(
            f"  {name:<10} {g.label:<30} {peaks:<34} {g.hbm_gbs:>5g} GB/s {g.memory_gib:>6g} GiB "
            f"link {g.link_gbs:g} GB/s"
        )
    return 0


def _show(name: str) -> int:
    from simulator.latency import load_latency_model

    print(json.dumps(load_latency_model(name).to_dict(), indent=2))
    return 0


def _derive(args: argparse.Namespace) -> int:
    from simulator.latency.derive import derive, derived_name

    model = derive(
        args.config,
        args.gpu,
        args.tp,
        args.dtype,
        args.kv_dtype,
        block_size=args.block_size,
        utilization=args.gpu_memory_utilization,
    )
    d = model.provenance["derived"]
    mem = d["memory"]
    print(
        f"{derived_name(d['config'], d['gpu'], d['tp'], d['dtype'], d['kv_dtype'])}: per GPU "
        f"{mem['weights_gib']:.1f} GiB weights, {mem['kv_cache_gib']:.1f} GiB KV cache = "
        f"{mem['num_kv_blocks']} blocks of {mem['block_size']} ({mem['kv_tokens']} tokens)"
    )
    for note in d["notes"]:
        print(f"note: {note}")
    for label, shape in (
        ("decode 1 seq, 1k context", (0, 0, 1, 1024)),
        ("decode 64 seqs, 1k context each", (0, 0, 64, 65536)),
        ("prefill 2,048 tokens", (2048, 2048, 0, 0)),
    ):
        print(f"  {label:<34} {model.step_ms(*shape):8.1f} ms")
    if args.output:
        model.save(args.output)
        print(f"wrote {args.output}")
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        if args.action == "list":
            return _list()
        if args.action == "show":
            return _show(args.name)
        return _derive(args)
    except ValueError as exc:
        print(f"slopilot models {args.action}: {exc}", file=sys.stderr)
        return 2
