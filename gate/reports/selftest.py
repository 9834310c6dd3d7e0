"""Renderers for `gate selftest`: pure functions of a `SelfTestResult` (JSON text, rich)."""

from __future__ import annotations

import io

import orjson
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from gate.core.calibration.selftest import CAUGHT, MISSED, SelfTestResult
from gate.text import plural

_STATUS_STYLE = {CAUGHT: "green", MISSED: "bold red"}


def render_selftest_json(result: SelfTestResult) -> str:
    return orjson.dumps(result.to_dict(), option=orjson.OPT_INDENT_2).decode("utf-8") + "\n"


def selftest_renderable(result: SelfTestResult) -> RenderableType:
    head = Text()
    head.append("Self-test by mutation ", style="bold")
    head.append(f"of the gate on {result.model}, engine {result.engine}\n")
    head.append(
        f"{plural(result.prompts, 'prompt')}, {plural(result.positions, 'reference position')} "
        f"({result.reference_exact_ties} exact top-2 ties in the unmutated engine's own logprobs); "
        f"doctrine {_doctrine(result)}\n"
    )
    head.append(f"unmutated engine against the pin: {result.baseline_against_pin.verdict}: ")
    head.append(result.baseline_against_pin.summary)

    table = Table(show_edge=False, title="Each mutant against the unmutated engine's reference", title_justify="left")
    table.add_column("mutant")
    table.add_column("changed", justify="right")
    table.add_column("status")
    table.add_column("classes")
    table.add_column("expected")
    table.add_column("met")
    table.add_column("against the pin")
    for m in result.mutants:
        changed = f"{m.changed_positions} pos / {m.changed_prompts} prompts"
        table.add_row(
            m.name,
            changed,
            Text(m.status, style=_STATUS_STYLE.get(m.status, "yellow")),
            m.classes,
            m.expect.replace("_", " "),
            Text("yes" if m.met else "NO", style="green" if m.met else "bold red"),
            m.against_pin.verdict,
        )

    notes = Text()
    for m in result.mutants:
        notes.append(f"{m.name}", style="bold")
        notes.append(f": {m.description}. {m.why}.")
        if m.against_reference.max_gap_ulps is not None:
            notes.append(f" Largest gap {m.against_reference.max_gap_ulps:.2f} grid steps.")
        notes.append(f" Against the pin: {m.against_pin.summary}. ({m.seconds:.1f}s)\n")
    verdict = Text(result.summary, style="bold green" if result.ok else "bold red")
    return Group(head, table, notes, verdict)


def _doctrine(result: SelfTestResult) -> str:
    d = result.doctrine
    out = f"--near-tie-mnats {d.near_tie_mnats:g}"
    if d.near_tie_ulps is not None:
        out += f" --near-tie-ulps {d.near_tie_ulps:g}"
    if d.evidence is not None:
        e = d.evidence
        out += (
            f", evidence rule (oracle gap <= {e.oracle_ulps:g}, own margin <= {e.candidate_ulps:g}, "
            f"run drift <= {e.drift_ulps:g} grid steps)"
        )
    return out + (f" — {d.source}" if d.source else "")


def print_selftest(result: SelfTestResult, console: Console) -> None:
    console.print(selftest_renderable(result))


def render_selftest_text(result: SelfTestResult, width: int = 120) -> str:
    buf = io.StringIO()
    Console(file=buf, width=width, color_system=None, highlight=False, soft_wrap=False).print(
        selftest_renderable(result)
    )
    return buf.getvalue()
