"""The HTML report in a real headless browser (Debian's chromium): it loads with no console
message at all (no script error, nothing blocked by its no-network policy), its script
runs, and a screenshot shows the strips in the outcome colours.

Skipped, saying why, when no chromium is installed (`apt-get install -y chromium`).
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest
from helpers.trace_builders import SEED_CANDIDATE, SEED_ORACLE, mixed_result

from gate.core.traces.reader import read_trace
from gate.core.verdict.adjudicate import compare
from gate.reports.html import render_html

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
BROWSER = next((path for name in BROWSERS if (path := shutil.which(name))), None)
pytestmark = pytest.mark.skipif(
    BROWSER is None, reason="no headless browser: install Debian's chromium (apt-get install -y chromium)"
)

# The page's outcome colours (gate/reports/html.py, :root).
COLOURS = {
    "match": (0xB7, 0xE1, 0xC1),
    "exact tie": (0x1F, 0x6F, 0xD1),
    "near tie": (0xF0, 0xA5, 0x00),
    "defect": (0xD7, 0x26, 0x3D),
    "unadjudicated": (0xD4, 0xD4, 0xD4),
}
FIGURES = [{"title": "Drift", "unit": "mnats", "values": [0, 3, 20, 189], "markers": [{"at": 125, "label": "t"}]}]


def chromium(tmp_path: Path, page: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert BROWSER is not None
    cmd = [
        BROWSER,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--disable-extensions",
        "--hide-scrollbars",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--enable-logging=stderr",
        "--v=0",
        *args,
        page.as_uri(),
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=False)


def console_messages(stderr: str) -> list[str]:
    """Console output chromium logs on stderr: `...:INFO:CONSOLE:12] "message", source: ...`."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]


def read_png(path: Path) -> np.ndarray:
    """Decode an 8-bit, non-interlaced RGB or RGBA PNG (what chromium writes) to (h, w, 3)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, []
    width = height = channels = 0
    while pos < len(data):
        (size,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + size]
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and colour in (2, 6) and interlace == 0, (depth, colour, interlace)
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat.append(body)
        pos += 12 + size
    raw = np.frombuffer(zlib.decompress(b"".join(idat)), dtype=np.uint8).reshape(height, 1 + width * channels)
    out = np.zeros((height, width * channels), dtype=np.uint8)
    prev = np.zeros(width * channels, dtype=np.int64)
    for y in range(height):
        kind, line = raw[y, 0], raw[y, 1:].astype(np.int64)
        if kind == 0:
            row = line
        elif kind == 1:  # Sub: a running sum per channel
            row = np.cumsum(line.reshape(width, channels), axis=0).reshape(-1) % 256
        elif kind == 2:  # Up
            row = (line + prev) % 256
        else:  # Average and Paeth depend on the byte just decoded: one at a time
            row = np.zeros_like(line)
            lst, up = line.tolist(), prev.tolist()
            cur = [0] * len(lst)
            for i, v in enumerate(lst):
                a = cur[i - channels] if i >= channels else 0
                b = up[i]
                if kind == 3:
                    cur[i] = (v + (a + b) // 2) % 256
                else:
                    c = up[i - channels] if i >= channels else 0
                    p = a + b - c
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                    pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                    cur[i] = (v + pred) % 256
            row = np.array(cur, dtype=np.int64)
        out[y] = row
        prev = row
    return out.reshape(height, width, channels)[:, :, :3]


def colour_pixels(image: np.ndarray, rgb: tuple[int, int, int]) -> int:
    return int((image == np.array(rgb, dtype=np.uint8)).all(axis=2).sum())


@pytest.fixture
def mixed_page(tmp_path: Path) -> Path:
    page = tmp_path / "report.html"
    page.write_text(render_html(mixed_result(tmp_path, figures=FIGURES)), encoding="utf-8")
    return page


def test_the_console_check_sees_errors(tmp_path: Path) -> None:
    """The probe itself: a page with a script error and a blocked fetch must be caught."""
    page = tmp_path / "bad.html"
    page.write_text(
        '<!doctype html><html><head><meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        'script-src \'unsafe-inline\'"></head><body><img src="https://example.invalid/x.png">'
        "<script>undefinedFunction();</script></body></html>"
    )
    run = chromium(tmp_path, page, "--dump-dom")
    messages = console_messages(run.stderr)
    assert any("undefinedFunction" in m for m in messages), run.stderr[-3000:]
    assert any("Content Security Policy" in m for m in messages), run.stderr[-3000:]


def test_page_loads_without_console_messages(tmp_path: Path, mixed_page: Path) -> None:
    run = chromium(tmp_path, mixed_page, "--dump-dom")
    assert run.returncode == 0, run.stderr[-3000:]
    assert console_messages(run.stderr) == []
    assert 'data-gate-ready="1"' in run.stdout  # the page's script ran to its end
    assert run.stdout.count('class="strip ') == 8


def test_seed_page_loads_without_console_messages(tmp_path: Path) -> None:
    page = tmp_path / "seed.html"
    page.write_text(render_html(compare(read_trace(SEED_ORACLE), read_trace(SEED_CANDIDATE))), encoding="utf-8")
    run = chromium(tmp_path, page, "--dump-dom")
    assert console_messages(run.stderr) == [] and 'data-gate-ready="1"' in run.stdout
    assert "6/7 prompts strict 16/16, 108/112 positions" in run.stdout


def test_screenshot_shows_the_strips(tmp_path: Path, mixed_page: Path) -> None:
    shot = tmp_path / "shot.png"
    # tall: the strips come after the verdict card and the divergences
    run = chromium(tmp_path, mixed_page, f"--screenshot={shot}", "--window-size=1200,4000")
    assert shot.exists(), run.stderr[-3000:]
    image = read_png(shot)
    assert image.shape[:2] == (4000, 1200)
    # Strip rows: long runs of the match colour (every strip starts with matches).
    is_match = (image == np.array(COLOURS["match"], dtype=np.uint8)).all(axis=2)
    strip_rows = np.nonzero(is_match.sum(axis=1) > 300)[0]
    assert len(strip_rows) >= 8 * 10, "fewer than eight strips of about 14 px"
    band = image[strip_rows]
    # Every outcome's colour is inside the strips, not just in the legend or the cards.
    for name, rgb in COLOURS.items():
        assert colour_pixels(band, rgb) > 50, f"no {name} cells in the strips"
