"""The CLI as a shell user meets it: a closed pipe (`| head -1`) ends a command quietly, and the help
names the guide."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROWS = "device,model,dtype,tp,phase,batch_size,num_tokens,context_tokens\n"


# ---- a closed pipe ---------------------------------------------------------------------------------


def _read_one_line_then_close(argv: list[str]) -> tuple[int, str]:
    child = subprocess.Popen([sys.executable, "-m", "slopilot.cli", *argv], cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    child.stdout.readline()
    child.stdout.close()  # what `| head -1` does
    err = child.stderr.read().decode()
    return child.wait(), err


def test_a_closed_pipe_exits_quietly(tmp_path):
    rows = tmp_path / "rows.csv"
    rows.write_text(ROWS + "".join(f"h100-80gb,llama2-70b,fp16,4,decode,{b},{b},{b * 900}\n"
                                   for b in range(1, 30_001)))
    series = tmp_path / "series.csv"
    series.write_text("time,queue\n" + "".join(f"{15 * i},{i % 40}\n" for i in range(40_000)))
    spec = ROOT / "examples" / "replay" / "keda_queue.yaml"
    for argv in (["predict", "h100-llama2-70b-tp4", str(rows)],
                 ["replay", "--spec", str(spec), "--metrics", str(series), "--interval", "15"]):
        rc, err = _read_one_line_then_close(argv)
        assert err == "" and rc == 141, (argv[0], rc, err)


def test_guide_is_named_in_help():
    for command in ("simulate", "replay"):
        out = subprocess.run([sys.executable, "-m", "slopilot.cli", command, "--help"], cwd=ROOT,
                             capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"}).stdout
        assert "docs/guide.md" in out
