"""JUnit XML report: one testcase per prompt, for CI test dashboards.

A prompt that is not ratified is a failure carrying its divergences; a prompt ratified only
by ties passes and notes them in system-out (under `--strict`, where the gate fails on
them, it is a failure too). Built with xml.etree, so the output is well-formed XML.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from gate.core.verdict.doctrine import Doctrine
from gate.core.verdict.result import DEFECT, Divergence, GateResult, PromptResult
from gate.reports._common import (
    CLASS_LABELS,
    by_prompt,
    class_counts,
    doctrine_line,
    drift_line,
    fmt_logprob,
    fmt_mnats,
    for_humans,
    gap_label,
    not_greedy_line,
    source_label,
    token_label,
    verdict_line,
    why,
)
from gate.reports.distribution import distribution_lines, junit_distribution_case
from gate.reports.reason import reason

# Characters XML 1.0 cannot hold even escaped (most C0 controls, lone surrogates, U+FFFE/F).
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def xml_text(text: str) -> str:
    """`text` with every character XML cannot carry written as `\\uXXXX`."""
    return _NOT_XML.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def xml_comment(text: str) -> str:
    """`text` fit for an XML comment, which cannot hold `--` (nor end with `-`)."""
    return " " + xml_text(text).replace("--", "- -").rstrip("-") + " "


def describe(d: Divergence, near_tie_mnats: Doctrine | float) -> str:
    """A few lines that let a person adjudicate one divergence from a CI log."""
    lines = [
        f"{d.prompt_id} position {d.position} ({source_label(d)}): {CLASS_LABELS.get(d.cls, d.cls)}",
        f"  oracle    {token_label(d.oracle_token, d.oracle_text)}  logprob {fmt_logprob(d.oracle_logprob)}",
        f"  candidate {token_label(d.candidate_token, d.candidate_text)}  logprob {fmt_logprob(d.candidate_logprob)}"
        + (f"  rank {d.candidate_rank}" if d.candidate_rank is not None else ""),
        f"  oracle - candidate {gap_label(d)} mnats; top-2 gap {fmt_mnats(d.top2_gap_mnats)} mnats"
        + (f"; tie-break {d.tie_break}" if d.tie_break else ""),
        f"  {why(d, near_tie_mnats)}",
    ]
    return "\n".join(lines)


def render_junit(result: GateResult) -> str:
    result = for_humans(result)
    groups = by_prompt(result)
    strict_gate = result.doctrine.strict
    failures = sum(1 for p in result.prompts if _fails(p, strict_gate))
    suites = ET.Element("testsuites", name="gate", tests=str(len(result.prompts)), failures=str(failures), errors="0")
    suite = ET.SubElement(
        suites,
        "testsuite",
        name=xml_text(f"{result.run.command if result.run is not None else 'gate compare'} {result.model}".strip()),
        tests=str(len(result.prompts)),
        failures=str(failures),
        errors="0",
        skipped="0",
    )
    # The verdict and its reason first, where a person opening the file looks.
    suites.insert(0, ET.Comment(xml_comment(reason(result))))
    props = ET.SubElement(suite, "properties")
    for key, value in (
        ("reason", reason(result)),
        ("verdict", result.verdict),
        ("exit_code", str(result.exit_code)),
        ("summary", result.summary),
        ("doctrine", doctrine_line(result)),
        ("near_tie_mnats", repr(float(result.doctrine.near_tie_mnats))),
        ("model", result.model),
        ("oracle_engine", result.oracle_engine),
        ("candidate_engine", result.candidate_engine),
        *((("drift", drift_line(result) or ""),) if result.drift is not None else ()),
        *((("not_greedy", not_greedy_line(result) or ""),) if result.not_greedy_total else ()),
        *(("warning", w) for w in result.warnings),
        *(("distribution", line) for line, _ in distribution_lines(result)[-1:]),
    ):
        ET.SubElement(props, "property", name=key, value=xml_text(value))
    classname = xml_text(f"gate.{result.model or 'model'}")
    near = result.doctrine
    for p in result.prompts:
        case = ET.SubElement(suite, "testcase", classname=classname, name=xml_text(p.id), time="0")
        divs = groups.get(p.id, [])
        details = "\n\n".join(describe(d, near) for d in divs)
        counts = f"{p.positions_matched}/{p.positions} positions matched"
        if p.unadjudicated:
            counts += f", {p.unadjudicated} unadjudicated after the first divergence"
        if not p.ratified:
            defects = [d for d in divs if d.cls == DEFECT]
            first = defects[0] if defects else divs[0]
            message = (
                f"{class_counts(divs)}; first defect at position {first.position}: "
                f"{token_label(first.oracle_token, first.oracle_text)} expected, "
                f"{token_label(first.candidate_token, first.candidate_text)} taken, {gap_label(first)} mnats"
            )
            failure = ET.SubElement(case, "failure", message=xml_text(message), type="defect")
            failure.text = xml_text(f"{counts}\n\n{details}")
        elif not p.strict:
            if strict_gate:
                message = f"not strict ({class_counts(divs)}), and the gate runs with --strict"
                failure = ET.SubElement(case, "failure", message=xml_text(message), type="not_strict")
                failure.text = xml_text(f"{counts}\n\n{details}")
            else:
                out = ET.SubElement(case, "system-out")
                out.text = xml_text(f"ratified, not strict: {class_counts(divs)}; {counts}\n\n{details}")
    junit_distribution_case(result, suites, suite, classname)
    out = ET.SubElement(suites, "system-out")
    out.text = xml_text(f"{reason(result)}\n{result.summary}\n{verdict_line(result)}")
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def _fails(p: PromptResult, strict_gate: bool) -> bool:
    return not p.ratified or (strict_gate and not p.strict)
