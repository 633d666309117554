"""The guide's picture of a plan report: `slopilot plan` on examples/plan_small.yaml, its report.html
rendered by headless Chromium, the white space below the page cropped.

    .venv/bin/python docs/guide/screenshot.py            # rewrites docs/img/plan_report.png
    .venv/bin/python docs/guide/screenshot.py --check    # renders it anew; exit 1 when it differs in
                                                         # size by more than 10% or is blank (tests run it)

Chromium comes from the Debian package `chromium` (`make install` installs it).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

PLAN = ROOT / "examples" / "plan_small.yaml"
IMAGE = ROOT / "docs" / "img" / "plan_report.png"
WIDTH, TALL = 1280, 3000  # the window: as wide as a laptop screen, taller than any report
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def browser() -> str:
    """The path of a Chromium-family browser; a clear error when none is installed."""
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    raise RuntimeError(f"no headless browser found (tried {', '.join(BROWSERS)}): install the Debian "
                       f"package chromium (make install does)")


def screenshot(html: Path, png: Path, width: int = WIDTH, tall: int = TALL) -> np.ndarray:
    """Renders html to png at `width` pixels, crops the blank rows below the content; the pixels."""
    import matplotlib.image

    png.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as profile:  # a fresh profile: no state from another run
        cmd = [browser(), "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               f"--user-data-dir={profile}", f"--window-size={width},{tall}", f"--screenshot={png}",
               html.resolve().as_uri()]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if done.returncode != 0 or not png.exists():
        raise RuntimeError(f"{cmd[0]} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    img = matplotlib.image.imread(png)[:, :, :3]
    inked = np.flatnonzero((img < 0.97).any(axis=(1, 2)))
    if len(inked) == 0:
        raise RuntimeError(f"{png}: the page rendered blank")
    img = img[: min(len(img), inked[-1] + 40)]
    matplotlib.image.imsave(png, img)
    return img


def render(out_dir: Path, png: Path) -> np.ndarray:
    """Runs the small plan into out_dir and screenshots its report."""
    from slopilot.cli import main

    if main(["plan", str(PLAN), "--out", str(out_dir), "--workers", "1", "--no-progress"]) != 0:
        raise RuntimeError(f"slopilot plan {PLAN} failed")
    return screenshot(out_dir / "report.html", png)


def check(fresh: np.ndarray, saved: Path) -> list[str]:
    """Why the saved picture no longer shows what a fresh render shows (empty when it does)."""
    import matplotlib.image

    if not saved.exists():
        return [f"{saved} is missing: run docs/guide/screenshot.py"]
    old = matplotlib.image.imread(saved)
    problems = []
    if old.shape[1] != fresh.shape[1] or abs(old.shape[0] - fresh.shape[0]) > 0.1 * fresh.shape[0]:
        problems.append(f"{saved}: {old.shape[1]}x{old.shape[0]} px, a fresh render is "
                        f"{fresh.shape[1]}x{fresh.shape[0]}: run docs/guide/screenshot.py")
    if fresh.std() < 0.05:
        problems.append("the fresh render is nearly blank")
    return problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="render anew and compare with the saved picture")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        png = Path(tmp) / "plan_report.png" if args.check else IMAGE
        fresh = render(Path(tmp) / "plan", png)
        if args.check:
            problems = check(fresh, IMAGE)
            for line in problems:
                print(line, file=sys.stderr)
            return 1 if problems else 0
    print(f"wrote {IMAGE.relative_to(ROOT)} ({fresh.shape[1]}x{fresh.shape[0]} px)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
