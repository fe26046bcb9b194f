"""The HTML report: one self-contained offline file with every chart, rendered in headless
Chromium with no console errors; a PNG screenshot is kept in artifacts/test-screenshots/."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.report_fixtures import build_run

REPO = Path(__file__).resolve().parents[1]
SHOTS = REPO / "artifacts" / "test-screenshots"
CHARTS = ("chart-speedup", "chart-fastp", "chart-rounds", "chart-roofline", "chart-cost")
CHROMIUM = next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="headless Chromium not installed (Debian package `chromium`; .ci/run installs it)")


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = build_run(tmp_path_factory.mktemp("html")).root
    out = root / "report.html"
    proc = subprocess.run([sys.executable, "-m", "kforge.cli", "report", str(root / "report.parquet"), "--html", str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return out


def chromium(page: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--enable-logging=stderr",
           "--v=0", "--host-resolver-rules=MAP * ~NOTFOUND", *args, page.as_uri()]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def console_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


def test_page_is_self_contained_with_every_chart(page: Path) -> None:
    text = page.read_text()
    for chart in CHARTS:
        figure = re.search(rf'<figure class="chart" id="{chart}"><svg.*?</svg>', text, re.S)
        assert figure, chart
    assert not re.search(r"<script|<link|<iframe|@import|url\((?!#)", text, re.I)  # url(#clip) is in-page
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", text, re.I)  # nothing fetched
    for word in ("Suite summary", "geomean ALL", "fast_1.5", "nondeterministic_reference",
                 "provenance chain", "kernel source", "rel err norm"):
        assert word in text, word
    assert 'href="#cell-0"' in text and 'id="cell-0"' in text


@needs_chromium
def test_chromium_renders_it_without_console_errors(page: Path) -> None:
    dom = chromium(page, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert console_lines(dom.stderr) == []
    for chart in CHARTS:
        assert re.search(rf'<figure class="chart" id="{chart}"><svg', dom.stdout), chart
    SHOTS.mkdir(parents=True, exist_ok=True)
    shot = SHOTS / "report.png"
    shot.unlink(missing_ok=True)
    proc = chromium(page, f"--screenshot={shot}", "--window-size=1300,4200")
    assert proc.returncode == 0 and shot.is_file(), proc.stderr[-2000:]
    assert console_lines(proc.stderr) == []
    import matplotlib.image

    pixels = matplotlib.image.imread(str(shot))
    ink = (pixels[..., :3].mean(axis=2) < 0.9).mean()
    assert ink > 0.03, f"screenshot {shot} is nearly blank ({ink:.1%} ink)"


@needs_chromium
def test_console_errors_would_be_caught(tmp_path: Path) -> None:
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><script>console.error('boom'); missing_function();</script></body></html>")
    assert len(console_lines(chromium(bad, "--dump-dom").stderr)) == 2
