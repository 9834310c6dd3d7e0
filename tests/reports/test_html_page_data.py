"""The HTML page cannot be addressed by its data: a model id, prompt id or token text that
looks like a placeholder of the page (`{body}`, `{css}`, `%s`, `$x`, `${title}`) is shown
as text where it belongs and pastes nothing anywhere."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
from helpers.trace_builders import mixed_result

from gate.reports.html import render_html

PLACEHOLDERS = ["{body}", "{title}", "{css}", "{js}", "%s", "%(body)s", "$body", "${body}", "{0}", "{{body}}"]


def title_of(page: str) -> str:
    head = re.search(r"<head>(.*?)</head>", page, re.S)
    assert head is not None
    (title,) = re.findall(r"<title>(.*?)</title>", head.group(1), re.S)
    return title


@pytest.mark.parametrize("placeholder", PLACEHOLDERS)
def test_a_placeholder_in_the_data_pastes_nothing(tmp_path: Path, placeholder: str) -> None:
    result = mixed_result(tmp_path)
    clean = render_html(result)
    hostile = replace(
        result,
        model=f"org/{placeholder}",
        prompts=tuple(replace(p, id=f"{placeholder}{p.id}") for p in result.prompts),
        divergences=tuple(
            replace(d, prompt_id=f"{placeholder}{d.prompt_id}", oracle_text=placeholder) for d in result.divergences
        ),
    )
    page = render_html(hostile)
    assert title_of(page).endswith(f"org/{placeholder}"), title_of(page)
    # one page: one head, one body, one style sheet, one script; no more sections than the clean page
    for marker in ("<head>", "<body>", "<style>", "<script>", "</html>"):
        assert page.count(marker) == 1, marker
    assert page.count("<section") == clean.count("<section")
    assert len(page) < len(clean) + 200 * (len(placeholder) + 10) * (len(result.prompts) + len(result.divergences))


def test_the_page_shows_the_model_id_as_text(tmp_path: Path) -> None:
    page = render_html(replace(mixed_result(tmp_path), model="<b>{body}</b>"))
    assert "&lt;b&gt;{body}&lt;/b&gt;" in title_of(page)
    assert "<b>{body}</b>" not in page
