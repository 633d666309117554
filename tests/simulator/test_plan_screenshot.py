"""Issue 33, must-show 4: the guide's screenshot of a plan report is regenerated (slopilot plan on
examples/plan_small.yaml, rendered by headless Chromium) and must still match the saved picture's
size and show a page, not a blank; a missing browser is a clear error."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import matplotlib.image
import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("screenshot", ROOT / "docs" / "guide" / "screenshot.py")
screenshot = importlib.util.module_from_spec(spec)
spec.loader.exec_module(screenshot)


@pytest.mark.skipif(not any(shutil.which(b) for b in screenshot.BROWSERS),
                    reason="no Chromium: `make install` installs the Debian package chromium")
def test_the_guides_plan_screenshot_is_current(tmp_path):
    fresh = screenshot.render(tmp_path / "plan", tmp_path / "plan_report.png")
    assert screenshot.check(fresh, screenshot.IMAGE) == []
    assert fresh.shape[1] == screenshot.WIDTH and 800 < fresh.shape[0] < screenshot.TALL
    # the page, not a blank: the title's rows and the plots' rows both hold ink
    top, bottom = fresh[:200], fresh[-400:]
    assert (top < 0.5).mean() > 0.005 and (bottom < 0.9).mean() > 0.01
    saved = matplotlib.image.imread(screenshot.IMAGE)
    assert saved.shape[1] == screenshot.WIDTH


def test_a_missing_browser_is_said(monkeypatch):
    monkeypatch.setattr(screenshot.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="install the Debian package chromium"):
        screenshot.browser()
