"""`slopilot calibrate` beside a profile (never over the profile's metadata or a file that is not a
model; its own model replaced) and `slopilot predict` on rows of another model (warned)."""

import json
import shutil
from pathlib import Path

import pytest

from simulator.latency import load_latency_model
from simulator.latency.profile import metadata_path, read_metadata
from slopilot.cli import main

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "profiles" / "cpu" / "tiny.csv"


# ---- calibrate and profile metadata ---------------------------------------------------------------


def _profile_copy(tmp_path: Path, old_metadata: bool) -> Path:
    csv_path = tmp_path / "tiny-serving.csv"
    shutil.copy(PROFILE, csv_path)
    meta = {"engine": {"block_size": 16}, "from_run": {"wakeup_ms": 0.25}}
    name = csv_path.with_suffix(".json") if old_metadata else metadata_path(csv_path)
    name.write_text(json.dumps(meta))
    return csv_path


@pytest.mark.parametrize("old_metadata", [False, True])
def test_calibrate_never_overwrites_the_profile_metadata(old_metadata, tmp_path, capsys):
    csv_path = _profile_copy(tmp_path, old_metadata)
    assert metadata_path(csv_path).name == "tiny-serving.meta.json"
    # the README's command: with the older metadata name it would have overwritten it; now refused
    rc = main(["calibrate", str(csv_path), "-o", str(tmp_path / "tiny-serving.json"), "--no-plot"])
    if old_metadata:
        assert rc == 2 and "is a profile's metadata; it is kept" in capsys.readouterr().err
    else:
        assert rc == 0
    # by default the model goes beside the profile under a name of its own
    assert main(["calibrate", str(csv_path), "--no-plot"]) == 0
    model = load_latency_model(str(tmp_path / "tiny-serving.model.json"))
    assert model.model == "tiny"
    assert read_metadata(csv_path)["from_run"]["wakeup_ms"] == 0.25  # still there, still read


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"format": "other"}'])
def test_calibrate_keeps_any_file_that_is_not_a_model(content, tmp_path, capsys):
    target = tmp_path / "m.json"
    target.write_text(content)
    assert main(["calibrate", str(PROFILE), "-o", str(target), "--no-plot"]) == 2
    assert "it is kept" in capsys.readouterr().err and target.read_text() == content


def test_calibrate_replaces_its_own_model(tmp_path):
    target = tmp_path / "m.json"
    for _ in range(2):
        assert main(["calibrate", str(PROFILE), "-o", str(target), "--no-plot"]) == 0
    assert load_latency_model(str(target)).device == "cpu"


def test_read_metadata_skips_a_model_written_over_the_old_name(tmp_path):
    csv_path = tmp_path / "p.csv"
    shutil.copy(PROFILE, csv_path)
    assert read_metadata(csv_path) is None
    load_latency_model("cpu-tiny").save(csv_path.with_suffix(".json"))
    assert read_metadata(csv_path) is None


# ---- predict -----------------------------------------------------------------------------------------


ROWS = "device,model,dtype,tp,phase,batch_size,num_tokens,context_tokens\n"


@pytest.mark.parametrize(
    "row,warned",
    [
        ("h100-80gb,llama2-70b,fp16,4,decode,8,8,8000", []),
        ("h100,llama2-70b,fp16,4,decode,8,8,8000", ["device h100-80gb", "for device h100"]),
        ("h100-80gb,llama3-8b,fp16,4,decode,8,8,8000", ["model llama2-70b", "model llama3-8b"]),
        ("h100-80gb,llama2-70b,bf16,4,decode,8,8,8000", ["dtype fp16", "dtype bf16"]),
        ("h100-80gb,llama2-70b,fp16,8,decode,8,8,8000", ["tp 4", "tp 8"]),
        ("a100-80gb,opt-13b,fp16,1,prefill,1,512,512", ["device a100-80gb", "model opt-13b", "tp 1"]),
    ],
)
def test_predict_warns_when_rows_are_not_the_models(row, warned, tmp_path, capsys):
    rows = tmp_path / "rows.csv"
    rows.write_text(ROWS + row + "\n")
    assert main(["predict", "h100-llama2-70b-tp4", str(rows), "-o", str(tmp_path / "p.csv")]) == 0
    err = capsys.readouterr().err
    assert ("not calibrated" in err) == bool(warned)
    for part in warned:
        assert part in err
