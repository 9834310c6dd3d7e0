"""A Markdown report cannot be turned against its reader: no token text, prompt id, model
name or warning becomes a live link, an image, raw HTML, a mention or an issue reference
in a job summary or a pull-request comment.

The check renders the report as CommonMark with GitHub's tables (markdown-it-py, rich's
own dependency) and then applies what GitHub adds on the page's text: URL and `www.`
autolinks, e-mail addresses, @mentions, `#123` references and `:emoji:` shortcodes.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
from helpers.trace_builders import mixed_result
from markdown_it import MarkdownIt

from gate.core.verdict.result import GateResult
from gate.reports import render
from gate.reports._common import markdown_text
from gate.text import printable

HOSTILE = [
    "https://evil.example/x",
    "see http://evil.example",
    "www.evil.example",
    "mail me at boss@evil.example",
    "@octocat please merge",
    "fixes #123",
    "see GH-42 and gh-7",
    "org/repo#9",
    "[click](https://evil.example)",
    "![img](https://evil.example/p.png)",
    "<a href='https://evil.example'>x</a>",
    "<img src=x onerror=alert(1)>",
    "<https://evil.example>",
    "[ref]: https://evil.example",
    "&lt;script&gt;",
    "**bold** _it_ ~~gone~~ `code`",
    "$x^2$ math",
    ":rocket: shortcode",
    "| a | b |",
    "# heading",
    "1. item",
    "- item",
    "> quote",
    "line\nbreak [x](y)",
    "xmpp:foo@evil.example",
]

# What GitHub links or renders on the text of a rendered page (beyond Markdown itself).
ACTIVE_TEXT = [
    re.compile(r"[a-z][a-z0-9+.-]*://", re.I),
    re.compile(r"(?<![a-z0-9])www\.", re.I),
    re.compile(r"[a-z0-9._%+-]@[a-z0-9]", re.I),
    re.compile(r"(?<![a-z0-9_])@[a-z0-9]", re.I),
    re.compile(r"#[0-9]"),
    re.compile(r"(?<![a-z0-9])gh-[0-9]", re.I),
    re.compile(r":[a-z0-9_+-]+:", re.I),
]


def rendered(markdown: str) -> str:
    return MarkdownIt("commonmark").enable("table").enable("strikethrough").render(markdown)


def page_text(html: str) -> str:
    import html as h

    return h.unescape(re.sub(r"<[^>]+>", " ", html))


def assert_inert(markdown: str, hostile: str) -> None:
    html = rendered(markdown)
    tags = set(re.findall(r"<([a-z0-9]+)", html))
    allowed = {"p", "h2", "h3", "strong", "table", "thead", "tbody", "tr", "th", "td", "blockquote", "ul", "li"}
    allowed |= {"details", "summary", "pre", "code", "br"}
    assert tags <= allowed, (hostile, tags - allowed, markdown)
    assert not re.search(r"<[a-z0-9]+[^>]*\s(href|src)=", html), (hostile, html)
    # GitHub renders `$...$` as math unless each dollar is escaped in the source.
    assert not re.search(r"(?<!\\)\$", markdown), (hostile, markdown)
    text = page_text(html)
    for pattern in ACTIVE_TEXT:
        assert not pattern.search(text), (hostile, pattern.pattern, text)
    # and the reader sees the text as it is, every character of it
    assert printable(hostile) in text.replace("\u2060", ""), (hostile, text)


@pytest.mark.parametrize("hostile", HOSTILE)
def test_markdown_text_is_inert_alone(hostile: str) -> None:
    assert_inert(markdown_text(hostile), hostile)
    assert_inert(f"| {markdown_text(hostile)} | x |\n|---|---|\n| {markdown_text(hostile)} | y |", hostile)


def hostile_result(folder: Path, text: str) -> GateResult:
    """Every field of the mixed result a trace file can fill, set to `text`."""
    result = mixed_result(folder)
    divs = tuple(
        replace(
            d,
            prompt_id=f"{text} {d.prompt_id}",
            oracle_text=text,
            candidate_text=text,
            alternatives=tuple((t, lp, text) for t, lp, _ in d.alternatives),
        )
        for d in result.divergences
    )
    prompts = tuple(replace(p, id=f"{text} {p.id}", prompt=text) for p in result.prompts)
    return replace(
        result,
        prompts=prompts,
        divergences=divs,
        model=text,
        oracle_engine=text,
        candidate_engine=text,
        warnings=(f"the headers name {text}",),
    )


@pytest.mark.parametrize("hostile", HOSTILE)
def test_markdown_report_is_inert_whatever_the_trace_says(tmp_path: Path, hostile: str) -> None:
    result = hostile_result(tmp_path, hostile)
    md = render(result, "markdown")
    assert_inert(md, hostile)


def test_the_checker_sees_live_links() -> None:
    """The probe itself: raw text would have been caught."""
    for raw in ("https://evil.example", "[x](y)", "@octocat", "<b>x</b>", "fixes #1", "a@b.example"):
        with pytest.raises(AssertionError):
            assert_inert(raw, raw)
