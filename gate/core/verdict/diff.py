"""What changed between two runs against the same pin: `gate diff BASE NEW` (pure).

Both runs arrive as their JSON reports (v1, parsed by the shell into plain objects):
`parse_report` checks the fields the comparison reads and names the one at fault;
`diff_reports` refuses two reports that were not judged against the same pin (the
model, the oracle's digest, the doctrine that classifies, the prompts) and otherwise
says, prompt by prompt and position by position, what NEW changed.

NEW is worse, exit 1, when it has a defect BASE did not have at that position, a prompt
BASE ratified and NEW does not, a distribution beyond the pin's floor that BASE kept
within it, or a failing verdict where BASE passed. Anything else is exit 0; a refusal is
an `InputError` (exit 2).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gate.core.verdict.result import DEFECT, FAIL, RATIFIED_PASS, STRICT_PASS
from gate.errors import InputError
from gate.text import plural

# Doctrine fields that do not change how a divergence is classed: the exit-code rule.
_DOCTRINE_IGNORED = frozenset({"strict"})

CLASS_WORDS = {"exact_tie": "exact tie", "near_tie": "near tie", "defect": "defect"}
VERDICTS = (STRICT_PASS, RATIFIED_PASS, FAIL)
TRACE_NOT_REPORT = (
    "is a gate trace (JSON Lines whose first line is a `gate_trace` header), not a JSON report: `gate diff` "
    "compares two runs' reports (`gate run --format json`); `gate compare ORACLE CANDIDATE` judges traces"
)


@dataclass(frozen=True, slots=True)
class ReportPrompt:
    id: str
    strict: bool
    ratified: bool
    first_divergence: int | None


@dataclass(frozen=True, slots=True)
class ReportDivergence:
    prompt_id: str
    position: int
    cls: str
    oracle_token: int
    candidate_token: int | None
    top2_gap_mnats: float | None

    @property
    def key(self) -> tuple[str, int]:
        return (self.prompt_id, self.position)

    def where(self) -> str:
        return f"{self.prompt_id!r} position {self.position}"


@dataclass(frozen=True, slots=True)
class ReportFigures:
    """A run's distribution figures (the report's `distribution`), and the floor's limits."""

    kl_mean_mnats: float | None
    kl_p99_mnats: float | None
    same_top_rate: float | None
    judged: bool
    beyond: bool
    beyond_figures: tuple[str, ...] = ()
    limits: Mapping[str, float] | None = None


@dataclass(frozen=True, slots=True)
class RunReport:
    """The parts of a JSON report that `gate diff` compares."""

    path: str
    model: str
    oracle_sha256: str | None
    doctrine: Mapping[str, Any]
    verdict: str
    exit_code: int
    summary: str
    prompts: tuple[ReportPrompt, ...]
    divergences: tuple[ReportDivergence, ...]
    distribution: ReportFigures | None

    @property
    def defects(self) -> tuple[ReportDivergence, ...]:
        return tuple(d for d in self.divergences if d.cls == DEFECT)

    @property
    def passed(self) -> bool:
        """The verdict passes under the report's own doctrine (what its exit code must say)."""
        return passes(self.verdict, self.doctrine.get("strict") is True)


def passes(verdict: str, strict: bool) -> bool:
    """Exit 0: a strict pass, or a ratified pass without --strict (the spec's exit codes)."""
    return verdict == STRICT_PASS or (verdict == RATIFIED_PASS and not strict)


@dataclass(frozen=True, slots=True)
class ClassChange:
    prompt_id: str
    position: int
    before: str
    after: str

    def line(self) -> str:
        return f"{self.prompt_id!r} position {self.position}: {CLASS_WORDS[self.before]} → {CLASS_WORDS[self.after]}"


@dataclass(frozen=True, slots=True)
class ReportDiff:
    base: RunReport
    new: RunReport
    newly_diverging: tuple[str, ...]  # strict in BASE, not in NEW
    fixed: tuple[str, ...]  # not strict in BASE, strict in NEW
    no_longer_ratified: tuple[str, ...]
    ratified_again: tuple[str, ...]
    class_changes: tuple[ClassChange, ...]
    defects_added: tuple[ReportDivergence, ...]
    defects_removed: tuple[ReportDivergence, ...]
    notes: tuple[str, ...] = ()

    @property
    def distribution_crossed(self) -> bool:
        """NEW's distribution is beyond the pin's floor and BASE's was not."""
        b, n = self.base.distribution, self.new.distribution
        return n is not None and n.beyond and not (b is not None and b.beyond)

    @property
    def verdict_failed(self) -> bool:
        return not self.new.passed and self.base.passed

    @property
    def worse(self) -> tuple[str, ...]:
        """Each way NEW is worse than BASE, as a sentence; empty when it is not."""
        out: list[str] = []
        if self.defects_added:
            shown = ", ".join(d.where() for d in self.defects_added[:3])
            more = f" and {len(self.defects_added) - 3} more" if len(self.defects_added) > 3 else ""
            out.append(f"{plural(len(self.defects_added), 'new defect', 'new defects')}: {shown}{more}")
        if self.no_longer_ratified:
            out.append(
                f"{plural(len(self.no_longer_ratified), 'prompt', 'prompts')} no longer ratified: "
                + ", ".join(repr(p) for p in self.no_longer_ratified[:5])
                + (f" and {len(self.no_longer_ratified) - 5} more" if len(self.no_longer_ratified) > 5 else "")
            )
        if self.distribution_crossed:
            n = self.new.distribution
            assert n is not None
            figures = "; ".join(n.beyond_figures) or "see the report"
            out.append(f"the distribution crossed the pin's floor ({figures})")
        if self.verdict_failed:
            out.append(f"the verdict went from {_words(self.base.verdict)} to {_words(self.new.verdict)}")
        return tuple(out)

    @property
    def exit_code(self) -> int:
        return 1 if self.worse else 0

    @property
    def summary(self) -> str:
        """One line: what changed, and whether NEW is worse."""
        parts = [
            f"{plural(len(self.newly_diverging), 'prompt')} newly diverging",
            f"{len(self.fixed)} fixed",
            f"{plural(len(self.defects_added), 'defect')} added",
            f"{len(self.defects_removed)} removed",
            f"{plural(len(self.class_changes), 'class change', 'class changes')}",
        ]
        head = "worse" if self.worse else "not worse"
        verdicts = f"{_words(self.base.verdict)} → {_words(self.new.verdict)}"
        return f"gate diff: {head}: {', '.join(parts)} (verdict {verdicts})"

    def to_dict(self) -> dict[str, Any]:
        def figures(f: ReportFigures | None) -> dict[str, Any] | None:
            if f is None:
                return None
            return {
                "kl_mean_mnats": f.kl_mean_mnats,
                "kl_p99_mnats": f.kl_p99_mnats,
                "same_top_rate": f.same_top_rate,
                "judged": f.judged,
                "beyond": f.beyond,
            }

        def divs(ds: Sequence[ReportDivergence]) -> list[dict[str, Any]]:
            return [
                {
                    "prompt_id": d.prompt_id,
                    "position": d.position,
                    "oracle_token": d.oracle_token,
                    "candidate_token": d.candidate_token,
                    "top2_gap_mnats": d.top2_gap_mnats,
                }
                for d in ds
            ]

        return {
            "gate_diff": 1,
            "exit_code": self.exit_code,
            "worse": list(self.worse),
            "summary": self.summary,
            "model": self.new.model,
            "oracle_sha256": self.new.oracle_sha256,
            "base": {"path": self.base.path, "verdict": self.base.verdict, "summary": self.base.summary},
            "new": {"path": self.new.path, "verdict": self.new.verdict, "summary": self.new.summary},
            "newly_diverging": list(self.newly_diverging),
            "fixed": list(self.fixed),
            "no_longer_ratified": list(self.no_longer_ratified),
            "ratified_again": list(self.ratified_again),
            "class_changes": [
                {"prompt_id": c.prompt_id, "position": c.position, "before": c.before, "after": c.after}
                for c in self.class_changes
            ],
            "defects_added": divs(self.defects_added),
            "defects_removed": divs(self.defects_removed),
            "distribution": {
                "before": figures(self.base.distribution),
                "after": figures(self.new.distribution),
                "crossed_floor": self.distribution_crossed,
            },
            "notes": list(self.notes),
        }


def _words(verdict: str) -> str:
    """`strict_pass` as `strict pass`: a verdict said in words."""
    return verdict.replace("_", " ")


# --------------------------------------------------------------------------- comparing


def diff_reports(base: RunReport, new: RunReport) -> ReportDiff:
    """What NEW changed relative to BASE; an InputError when they are not runs of one pin."""
    notes = same_pin(base, new)
    b_prompts = {p.id: p for p in base.prompts}
    n_prompts = {p.id: p for p in new.prompts}
    order = [p.id for p in new.prompts]
    b_divs = {d.key: d for d in base.divergences}
    n_divs = {d.key: d for d in new.divergences}
    changes = tuple(
        ClassChange(d.prompt_id, d.position, b_divs[d.key].cls, d.cls)
        for d in new.divergences
        if d.key in b_divs and b_divs[d.key].cls != d.cls
    )
    return ReportDiff(
        base=base,
        new=new,
        newly_diverging=tuple(i for i in order if b_prompts[i].strict and not n_prompts[i].strict),
        fixed=tuple(i for i in order if not b_prompts[i].strict and n_prompts[i].strict),
        no_longer_ratified=tuple(i for i in order if b_prompts[i].ratified and not n_prompts[i].ratified),
        ratified_again=tuple(i for i in order if not b_prompts[i].ratified and n_prompts[i].ratified),
        class_changes=changes,
        defects_added=tuple(d for d in new.defects if not (d.key in b_divs and b_divs[d.key].cls == DEFECT)),
        defects_removed=tuple(d for d in base.defects if not (d.key in n_divs and n_divs[d.key].cls == DEFECT)),
        notes=notes,
    )


def same_pin(base: RunReport, new: RunReport) -> tuple[str, ...]:
    """Refuse (InputError naming the field) two reports not judged against the same pin
    with the same doctrine over the same prompts; the notes say what could not be checked."""

    def refuse(field: str, b: Any, n: Any) -> InputError:
        return InputError(
            f"{new.path}: field {field!r} is {n!r} but {base.path} has {b!r}: not runs against the same pin"
        )

    if base.model != new.model:
        raise refuse("model", base.model, new.model)
    notes: list[str] = []
    if base.oracle_sha256 and new.oracle_sha256:
        if base.oracle_sha256 != new.oracle_sha256:
            raise refuse("oracle_sha256", base.oracle_sha256, new.oracle_sha256)
    else:
        lacking = [r.path for r in (base, new) if not r.oracle_sha256]
        notes.append(
            f"{' and '.join(lacking)}: no oracle_sha256 (a report from an older gate): "
            "the pin is known the same by model, doctrine and prompts only"
        )
    for key in sorted((set(base.doctrine) | set(new.doctrine)) - _DOCTRINE_IGNORED):
        if base.doctrine.get(key) != new.doctrine.get(key):
            raise refuse(f"doctrine.{key}", base.doctrine.get(key), new.doctrine.get(key))
    b_ids = [p.id for p in base.prompts]
    n_ids = [p.id for p in new.prompts]
    if sorted(b_ids) != sorted(n_ids):
        only_b = [i for i in b_ids if i not in set(n_ids)]
        only_n = [i for i in n_ids if i not in set(b_ids)]
        raise InputError(
            f"{new.path}: field 'prompts' differs from {base.path} (only in BASE: {only_b[:5]}; "
            f"only in NEW: {only_n[:5]}): not runs over the same prompts of the pin"
        )
    if base.doctrine.get("strict") != new.doctrine.get("strict"):
        notes.append(
            f"doctrine.strict is {base.doctrine.get('strict')} in BASE and {new.doctrine.get('strict')} in NEW: "
            "the verdicts' exit codes follow different rules"
        )
    return tuple(notes)


# --------------------------------------------------------------------------- reading


def parse_report(raw: Any, path: str) -> RunReport:
    """A JSON report v1 (already decoded) as a `RunReport`; an InputError names the field."""

    def bad(field: str, want: str, value: Any = None) -> InputError:
        found = "missing" if value is None else f"found {type(value).__name__}"
        return InputError(f"{path}: field {field!r}: expected {want}, {found}")

    if not isinstance(raw, Mapping):
        raise InputError(f"{path}: not a gate JSON report (expected an object, found {type(raw).__name__})")
    if "gate_trace" in raw and "gate_report" not in raw:
        raise InputError(f"{path}: {TRACE_NOT_REPORT}")
    if raw.get("gate_report") != 1:
        raise InputError(
            f"{path}: field 'gate_report': expected 1 (a report of `gate run` or `gate compare --format json`), "
            f"found {raw.get('gate_report')!r}"
        )

    def get(obj: Mapping[str, Any], key: str, kind: type | tuple[type, ...], want: str, where: str) -> Any:
        value = obj.get(key)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise bad(where, want, value)
        return value

    model = get(raw, "model", str, "a model id", "model")
    doctrine = get(raw, "doctrine", Mapping, "an object", "doctrine")
    verdict = get(raw, "verdict", str, "a verdict", "verdict")
    exit_code = get(raw, "exit_code", int, "0 or 1", "exit_code")
    sha = raw.get("oracle_sha256")
    if sha is not None and not isinstance(sha, str):
        raise bad("oracle_sha256", "a hex digest", sha)
    prompts = []
    for n, p in enumerate(get(raw, "prompts", list, "a list", "prompts")):
        where = f"prompts[{n}]"
        if not isinstance(p, Mapping):
            raise bad(where, "an object", p)
        first = p.get("first_divergence")
        if first is not None and (not isinstance(first, int) or isinstance(first, bool)):
            raise bad(f"{where}.first_divergence", "an int or null", first)
        prompts.append(
            ReportPrompt(
                id=get(p, "id", str, "a prompt id", f"{where}.id"),
                strict=get(p, "strict", bool, "true or false", f"{where}.strict"),
                ratified=get(p, "ratified", bool, "true or false", f"{where}.ratified"),
                first_divergence=first,
            )
        )
    divergences = []
    for n, d in enumerate(get(raw, "divergences", list, "a list", "divergences")):
        where = f"divergences[{n}]"
        if not isinstance(d, Mapping):
            raise bad(where, "an object", d)
        cls = d.get("class")
        if cls not in CLASS_WORDS:
            raise InputError(f"{path}: field '{where}.class': expected one of {', '.join(CLASS_WORDS)}, found {cls!r}")
        cand = d.get("candidate_token")
        gap = d.get("top2_gap_mnats")
        divergences.append(
            ReportDivergence(
                prompt_id=get(d, "prompt_id", str, "a prompt id", f"{where}.prompt_id"),
                position=get(d, "position", int, "an int", f"{where}.position"),
                cls=cls,
                oracle_token=get(d, "oracle_token", int, "an int", f"{where}.oracle_token"),
                candidate_token=cand if isinstance(cand, int) and not isinstance(cand, bool) else None,
                top2_gap_mnats=float(gap) if isinstance(gap, int | float) and not isinstance(gap, bool) else None,
            )
        )
    report = RunReport(
        path=path,
        model=model,
        oracle_sha256=sha,
        doctrine=dict(doctrine),
        verdict=verdict,
        exit_code=exit_code,
        summary=str(raw.get("summary", "")),
        prompts=tuple(prompts),
        divergences=tuple(divergences),
        distribution=_figures(raw.get("distribution"), path),
    )
    check_consistent(report)
    return report


def check_consistent(report: RunReport) -> None:
    """Refuse (InputError naming the field) a report whose fields contradict one another: a
    verdict gate does not write, an exit code its verdict does not give, a pass over a
    prompt that is not ratified (strict, for a strict pass), a defect or a distribution
    beyond the floor, a prompt ratified or strict over a defect, a divergence of no prompt.
    `gate diff` weighs what a report found; no single field can make it better than that."""
    path = report.path

    def refuse(field: str, why: str) -> InputError:
        return InputError(f"{path}: field {field!r}: {why}; the report contradicts itself")

    if report.verdict not in VERDICTS:
        raise InputError(f"{path}: field 'verdict': expected one of {', '.join(VERDICTS)}, found {report.verdict!r}")
    strict = report.doctrine.get("strict")
    if not isinstance(strict, bool):
        raise InputError(f"{path}: field 'doctrine.strict': expected true or false, found {strict!r}")
    want = 0 if report.passed else 1
    if report.exit_code != want:
        raise refuse("exit_code", f"{report.exit_code} where the verdict {report.verdict!r} gives {want}")
    prompts = {p.id: p for p in report.prompts}
    for n, d in enumerate(report.divergences):
        p = prompts.get(d.prompt_id)
        if p is None:
            raise refuse(f"divergences[{n}].prompt_id", f"{d.prompt_id!r} is not one of the report's prompts")
        if d.cls == DEFECT and (p.ratified or p.strict):
            raise refuse(f"prompts.{p.id}", f"{'strict' if p.strict else 'ratified'} over a defect ({d.where()})")
    for p in report.prompts:
        if p.strict and not p.ratified:
            raise refuse(f"prompts.{p.id}", "strict but not ratified")
    if report.verdict == FAIL:
        return
    if report.defects:
        raise refuse("divergences", f"{report.verdict!r} with a defect ({report.defects[0].where()})")
    if report.verdict == STRICT_PASS and not all(p.strict for p in report.prompts):
        raise refuse(
            "prompts",
            f"'strict_pass' with a prompt not strict ({next(p.id for p in report.prompts if not p.strict)!r})",
        )
    if not all(p.ratified for p in report.prompts):
        raise refuse(
            "prompts",
            f"{report.verdict!r} with a prompt not ratified ({next(p.id for p in report.prompts if not p.ratified)!r})",
        )
    if report.distribution is not None and report.distribution.beyond:
        raise refuse("distribution", f"{report.verdict!r} with the distribution beyond the floor")


def _figures(raw: Any, path: str) -> ReportFigures | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise InputError(f"{path}: field 'distribution': expected an object, found {type(raw).__name__}")

    def number(obj: Any, key: str) -> float | None:
        value = obj.get(key) if isinstance(obj, Mapping) else None
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None

    kl = raw.get("kl_mnats")
    limits = raw.get("limits")
    beyond = raw.get("beyond", False)
    if not isinstance(beyond, bool):
        raise InputError(f"{path}: field 'distribution.beyond': expected true or false, found {beyond!r}")
    return ReportFigures(
        kl_mean_mnats=number(kl, "mean"),
        kl_p99_mnats=number(kl, "p99"),
        same_top_rate=number(raw.get("same_top"), "rate"),
        judged=raw.get("judged") is True,
        beyond=beyond,
        beyond_figures=tuple(str(x) for x in raw.get("beyond_figures") or ()),
        limits={k: float(v) for k, v in limits.items() if isinstance(v, int | float)}
        if isinstance(limits, Mapping)
        else None,
    )
