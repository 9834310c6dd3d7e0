"""The HTML verdict card read in a real headless browser (Debian's chromium) at 1280 px: its
text (the verdict, the reason, the counts) has a WCAG contrast ratio of at least 4.5
against what is painted behind it, and nothing overflows horizontally, on a failing run
(the Q4_1 kind) and on the seed example.

A probe script is added to a copy of the page (the report itself is not changed) and
writes its measurements into the DOM that chromium dumps. Skipped, saying why, when no
chromium is installed (`apt-get install -y chromium`).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers.failing_run import failing_result
from helpers.trace_builders import SEED_CANDIDATE, SEED_ORACLE

from gate.core.traces.reader import read_trace
from gate.core.verdict.adjudicate import compare
from gate.core.verdict.result import GateResult
from gate.reports.html import render_html

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
BROWSER = next((path for name in BROWSERS if (path := shutil.which(name))), None)
pytestmark = pytest.mark.skipif(
    BROWSER is None, reason="no headless browser: install Debian's chromium (apt-get install -y chromium)"
)
WIDTH = 1280

# Contrast of every text node's element in the card against the first opaque background
# behind it (WCAG 2 relative luminance), and the page's and the card's horizontal overflow.
PROBE = """
<script>
(function () {
  function rgb(s) { var m = s.match(/[\\d.]+/g) || []; return m.map(Number); }
  function lum(c) {
    var v = c.slice(0, 3).map(function (x) {
      x /= 255;
      return x <= 0.03928 ? x / 12.92 : Math.pow((x + 0.055) / 1.055, 2.4);
    });
    return 0.2126 * v[0] + 0.7152 * v[1] + 0.0722 * v[2];
  }
  function background(el) {
    for (var e = el; e; e = e.parentElement) {
      var c = rgb(getComputedStyle(e).backgroundColor);
      if (c.length >= 3 && (c.length < 4 || c[3] > 0.99)) return c;
    }
    return [255, 255, 255];
  }
  var card = document.getElementById("verdict");
  var out = {texts: [], pageOverflow: document.documentElement.scrollWidth - window.innerWidth,
             cardOverflow: card.scrollWidth - card.clientWidth, innerWidth: window.innerWidth};
  var walker = document.createTreeWalker(card, NodeFilter.SHOW_TEXT);
  for (var n = walker.nextNode(); n; n = walker.nextNode()) {
    if (!n.nodeValue.trim()) continue;
    var el = n.parentElement, fg = rgb(getComputedStyle(el).color), bg = background(el);
    var a = lum(fg), b = lum(bg), ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
    out.texts.push({text: n.nodeValue.trim().slice(0, 60), ratio: ratio});
  }
  var pre = document.createElement("pre");
  pre.id = "probe";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>
"""


def measure(tmp_path: Path, result: GateResult) -> dict[str, object]:
    assert BROWSER is not None
    page = tmp_path / "report.html"
    page.write_text(render_html(result).replace("</body>", PROBE + "</body>"), encoding="utf-8")
    run = subprocess.run(
        [
            BROWSER,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--hide-scrollbars",
            f"--user-data-dir={tmp_path / 'profile'}",
            f"--window-size={WIDTH},900",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    found = re.search(r'<pre id="probe">(.*?)</pre>', run.stdout, re.S)
    assert found is not None, run.stderr[-3000:]
    import html

    data: dict[str, object] = json.loads(html.unescape(found.group(1)))
    return data


@pytest.fixture(scope="module")
def failing(tmp_path_factory: pytest.TempPathFactory) -> GateResult:
    return failing_result(tmp_path_factory.mktemp("failing"))


def check(data: dict[str, object]) -> None:
    assert data["innerWidth"] == WIDTH
    assert data["pageOverflow"] == 0 and data["cardOverflow"] == 0, data
    texts = data["texts"]
    assert isinstance(texts, list) and texts
    low = [t for t in texts if t["ratio"] < 4.5]
    assert not low, low


def test_the_failing_card_is_legible_and_fits(tmp_path: Path, failing: GateResult) -> None:
    data = measure(tmp_path, failing)
    check(data)
    said = " ".join(t["text"] for t in data["texts"])  # type: ignore[union-attr]
    assert said.startswith("FAIL 4 defects in 4 prompts of 41")


def test_the_seed_card_is_legible_and_fits(tmp_path: Path) -> None:
    check(measure(tmp_path, compare(read_trace(SEED_ORACLE), read_trace(SEED_CANDIDATE))))


def test_the_probe_sees_grey_on_red_and_an_overflow(tmp_path: Path, failing: GateResult) -> None:
    """The probe itself: the old card's grey note on red, and a wide block, are caught."""
    page = render_html(failing)
    bad = page.replace(
        '<div class="tallies">',
        '<p style="color:#5f6b7a">grey note</p><pre style="width:3000px">x</pre><div class="tallies">',
    )
    target = tmp_path / "bad"
    target.mkdir()
    html_path = target / "report.html"
    html_path.write_text(bad.replace("</body>", PROBE + "</body>"), encoding="utf-8")
    assert BROWSER is not None
    run = subprocess.run(
        [
            BROWSER,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            f"--user-data-dir={target / 'profile'}",
            f"--window-size={WIDTH},900",
            "--dump-dom",
            html_path.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    import html

    found = re.search(r'<pre id="probe">(.*?)</pre>', run.stdout, re.S)
    assert found is not None
    data = json.loads(html.unescape(found.group(1)))
    with pytest.raises(AssertionError):
        check(data)
    assert any(t["ratio"] < 4.5 for t in data["texts"]) and data["cardOverflow"] > 0
