"""Rebuild the shipped models in simulator/latency/models/ from the public measurements.

    .venv/bin/python -m simulator.latency.ship [--data ../shared/data] [--profiles profiles/cpu]

Each model is fitted on all rows of its source; its provenance records the source file and its
sha256, the converter, and the held-out error of the same fit on a random 20% split and on the
extrapolation split (train on batch <= 16 and prompt <= 2048, test on the rest).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from pathlib import Path

from simulator.latency.convert import DISTSERVE_COLUMNS, SPLITWISE_COLUMNS, distserve_rows, splitwise_rows
from simulator.latency.fit import calibrate, errors, fit, holdout_mask
from simulator.latency.model import MODELS_DIR, LatencyModel
from simulator.latency.profile import Profile, parse_rows, read_profile

EXTRAPOLATE = "batch_size > 16 or prompt_tokens > 2048"
SPLITWISE = [(dev, short, tp) for dev, short in (("a100-80gb", "a100"), ("h100-80gb", "h100"))
             for tp in (2, 4, 8)]
DISTSERVE = [("opt-13b", (1, 2, 4)), ("opt-66b", (2, 3, 4, 8))]


def _profile(rows: list[dict], columns: list[str], name: str) -> Profile:
    return parse_rows([{k: str(v) for k, v in r.items()} for r in rows], columns, name)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build(prof: Profile, source: Path, label: str, converter: str, extrapolate: str | None) -> LatencyModel:
    model, _, _ = calibrate(prof, frac=0.2, seed=0, refit_all=True)
    prov = model.provenance
    prov["source"] = label  # relative: no machine paths in the project
    prov["source_sha256"] = _sha256(source)
    if converter:
        prov["converter"] = converter
    if extrapolate:
        mask = holdout_mask(prof, extrapolate)
        heldout = errors(fit(prof.subset(~mask)), prof.subset(mask))
        prov["extrapolation_holdout"] = {"where": extrapolate, "heldout_error_pct": heldout}
    prov["train_error_pct"] = errors(model, prof)  # of the shipped (all-rows) fit
    return model


def main(argv: list[str] | None = None) -> int:
    root = Path(__file__).resolve().parents[2]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=Path(os.environ.get("SLOPILOT_SHARED_DATA",
                                                                     root.parent / "shared" / "data")))
    ap.add_argument("--profiles", type=Path, default=root / "profiles" / "cpu",
                    help="our own profile CSVs: one model per (device, model, dtype, tp) found")
    ap.add_argument("--out", type=Path, default=MODELS_DIR)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    sw = args.data / "profiles" / "splitwise_perf_model.csv"
    for dev, short, tp in SPLITWISE:
        rows = splitwise_rows(sw, dev, "llama2-70b", tp)
        prof = _profile(rows, SPLITWISE_COLUMNS, f"splitwise {dev} tp{tp}")
        m = build(prof, sw, "../shared/data/profiles/" + sw.name,
                  "slopilot convert splitwise (simulator/latency/convert.py)", EXTRAPOLATE)
        _save(m, args.out / f"{short}-llama2-70b-tp{tp}.json")

    ds = args.data / "profiles" / "distserve_a100_80g_vllm.json"
    for model, tps in DISTSERVE:
        for tp in tps:
            prof = _profile(distserve_rows(ds, model, tp), DISTSERVE_COLUMNS, f"distserve {model} tp{tp}")
            m = build(prof, ds, "../shared/data/profiles/" + ds.name, "slopilot convert distserve "
                      "(fitted formulas evaluated on a grid, simulator/latency/convert.py)", None)
            _save(m, args.out / f"a100-{model}-tp{tp}.json")

    for csv_path in sorted(args.profiles.glob("*.csv")) if args.profiles.is_dir() else []:
        prof = read_profile(csv_path)
        for device, model, dtype, tp in prof.groups():
            sel = prof.subset(_group_mask(prof, device, model, dtype, tp))
            label = str(csv_path.resolve().relative_to(root)) if csv_path.resolve().is_relative_to(root) \
                else csv_path.name
            m = build(sel, csv_path, label, "", None)
            name = f"{device}-{model.split('/')[-1]}" + (f"-tp{tp}" if tp > 1 else "")  # e.g. cpu-tiny
            _save(m, args.out / f"{name}.json".lower())
    return 0


def _group_mask(prof: Profile, device: str, model: str, dtype: str, tp: int):
    import numpy as np

    t = prof.text
    return (np.array(t["device"]) == device) & (np.array(t["model"]) == model) \
        & (np.array(t["dtype"]) == dtype) & (prof.num["tp"] == tp)


def _save(m: LatencyModel, path: Path) -> None:
    m.save(path)
    def fmt(table: dict) -> str:
        return " ".join(f"{ph} {e['mape']:5.2f}%" for ph, e in table.items() if ph != "all")

    x = m.provenance.get("extrapolation_holdout", {}).get("heldout_error_pct")
    print(f"{path.name:<26} held-out MAPE {fmt(m.provenance['heldout_error_pct'])}"
          + (f"   extrapolated {fmt(x)}" if x else ""))


if __name__ == "__main__":
    sys.exit(main())
