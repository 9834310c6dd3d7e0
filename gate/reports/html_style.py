"""The HTML report's look (`html.py`'s page): its CSS, its script, the page head with the
content policy that lets it load nothing, and the CSS class of each outcome and class."""

from __future__ import annotations

from gate.core.verdict.result import (
    DEFECT,
    EXACT_TIE,
    NEAR_TIE,
    OUTCOME_DEFECT,
    OUTCOME_EXACT_TIE,
    OUTCOME_MATCH,
    OUTCOME_NEAR_TIE,
    OUTCOME_UNADJUDICATED,
)

# Full cards for the first divergences; one table row for each of the rest.
MAX_CARDS = 60
OUTCOME_CSS = {
    OUTCOME_MATCH: "o-match",
    OUTCOME_EXACT_TIE: "o-exact",
    OUTCOME_NEAR_TIE: "o-near",
    OUTCOME_DEFECT: "o-defect",
    OUTCOME_UNADJUDICATED: "o-unadj",
}
CLASS_CSS = {EXACT_TIE: "o-exact", NEAR_TIE: "o-near", DEFECT: "o-defect"}

CSS = """
:root{--match:#b7e1c1;--exact:#1f6fd1;--near:#f0a500;--defect:#d7263d;--unadj:#d4d4d4;--ink:#1d2433;--mute:#5f6b7a}
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--ink);margin:0 auto;
  max-width:1200px;padding:16px 24px;background:#fafbfc}
h1{margin:0;font-size:26px}h2{margin:28px 0 8px;font-size:19px}h3{margin:0 0 8px;font-size:15px}
code{font:12.5px ui-monospace,SFMono-Regular,Menlo,monospace}
.verdict{padding:16px 20px;border-radius:8px;color:#fff;overflow-wrap:anywhere}
.v-strict_pass{background:#14663a}.v-ratified_pass{background:#1b5cae}.v-fail{background:#a61b1b}
.verdict h1{font-size:30px;letter-spacing:.02em}
.verdict .reason{margin:8px 0 6px;font-size:17px;font-weight:600;line-height:1.4}
.verdict .summary{margin:0 0 10px;font:14px ui-monospace,Menlo,monospace}
.tallies{display:flex;flex-wrap:wrap;gap:8px}
.tally{background:#fff;color:var(--ink);border-radius:6px;padding:4px 10px}
.tally b{font-size:17px}.tally small{color:#3f4a5a;font-size:13px}
.warn{background:#fff4d6;border:1px solid #e0b84a;color:#4a3700;border-radius:6px;padding:8px 12px}
.alarm{background:#fde8e8;border:1px solid #d7263d;color:#6b0f0f;border-radius:6px;padding:8px 12px;font-weight:600}
#distribution .dverdict{font-weight:700;font-size:15px}
#distribution .loud{color:#a61b1b}
#distribution pre{background:#fff;border:1px solid #e1e4e8;border-radius:6px;padding:8px 12px;overflow-x:auto;
  font:12.5px ui-monospace,Menlo,monospace;color:var(--ink)}
details#details{margin:24px 0;background:#fff;border:1px solid #e1e4e8;border-radius:6px;padding:8px 12px}
details#details summary{cursor:pointer;font-weight:600}
details#details p{color:#3f4a5a;font-size:13px;overflow-wrap:anywhere}
.swatch{display:inline-block;width:12px;height:12px;border-radius:2px;margin-right:6px;vertical-align:-1px}
.tally .swatch:not([class*="o-"]){display:none}
.o-match{fill:var(--match);background:var(--match)}.o-exact{fill:var(--exact);background:var(--exact);stroke:var(--exact)}
.o-near{fill:var(--near);background:var(--near);stroke:var(--near)}
.o-defect{fill:var(--defect);background:var(--defect);stroke:var(--defect)}
.o-unadj{fill:var(--unadj);background:var(--unadj)}
.legend{display:flex;gap:16px;margin:6px 0}.legend i{display:inline-block;width:14px;height:14px;
  border-radius:2px;margin-right:5px;vertical-align:-2px}
.filter{display:block;margin:6px 0 10px;color:var(--mute)}
.strips{background:#fff;border:1px solid #e1e4e8;border-radius:6px;padding:8px 10px}
.strip{display:grid;grid-template-columns:120px 1fr 220px;align-items:center;gap:10px;height:20px}
.pid{font:12px ui-monospace,Menlo,monospace;overflow:hidden;text-overflow:ellipsis;white-space:nowrap}
.cells{width:100%;height:14px;display:block;background:#f3f4f6}
.cells rect.div{stroke-width:3px;vector-effect:non-scaling-stroke}
.count{font-size:12px;color:var(--mute);white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
.s-failed .pid{color:var(--defect);font-weight:700}
body.only-diverged .strip[data-strict="1"]{display:none}
.figs{display:flex;flex-wrap:wrap;gap:18px}figure{margin:0;background:#fff;border:1px solid #e1e4e8;
  border-radius:6px;padding:8px}
.hist .t{font-weight:600;font-size:13px}.hist .n{font-size:11px;text-anchor:middle}
.hist .l{font-size:10px;text-anchor:middle;fill:var(--mute)}.hist .u{font-size:11px;fill:var(--mute)}
.hist .axis{stroke:#999}.hist .marker{stroke:#333;stroke-dasharray:4 3}.hist .m{font-size:10px}
.hist rect.bar{fill:#7a8ca3}.hist rect{stroke:none}
.note{color:var(--mute);font-size:12px;margin:4px 0}
article.div{background:#fff;border:1px solid #e1e4e8;border-left:6px solid;border-radius:6px;padding:10px 14px;
  margin:10px 0;scroll-margin-top:12px}
article.o-exact{border-left-color:var(--exact)}article.o-near{border-left-color:var(--near)}
article.o-defect{border-left-color:var(--defect)}article:target{box-shadow:0 0 0 3px #ffd54a}
.badge{display:inline-block;color:#fff;border-radius:4px;padding:0 7px;font-size:12px;font-weight:700;
  text-transform:uppercase;letter-spacing:.03em}
.kv th{text-align:left;color:var(--mute);font-weight:500;padding:2px 14px 2px 0;vertical-align:top;white-space:nowrap}
.kv td{padding:2px 0}.prompt{white-space:pre-wrap;font:12.5px ui-monospace,Menlo,monospace}
.alts{border-collapse:collapse;margin-top:2px}.alts td,.alts th{padding:1px 10px 1px 0;font-size:12.5px;text-align:left}
.alts .is-o{font-weight:700}.alts .is-c td{color:#fff}
.alts .is-c.o-near td,.badge.o-near{color:var(--ink)}
.rest{border-collapse:collapse;background:#fff;width:100%}.rest td,.rest th{border-bottom:1px solid #eee;
  padding:3px 8px;text-align:left;font-size:12.5px}
footer{margin:30px 0 10px;color:var(--mute);font-size:12px}
"""

JS = """
(function () {
  var box = document.getElementById("only-diverged");
  if (box) {
    box.addEventListener("change", function () {
      document.body.classList.toggle("only-diverged", box.checked);
    });
  }
  document.documentElement.setAttribute("data-gate-ready", "1");
})();
"""

PAGE_HEAD = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; \
script-src 'unsafe-inline'; img-src data:">
"""
