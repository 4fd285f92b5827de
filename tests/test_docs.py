"""The README and docs/: links that resolve, anchors that exist, a results table that is its runs', and
text about the software rather than about how it was made."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from scripts import results_table

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} (.+)$", re.M)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return {slug(h) for h in HEADING.findall(text)}


def links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)  # inline code shows links, it does not make them
    return [t for t in LINK.findall(text) if not re.match(r"(https?:|mailto:)", t)]


def test_the_pages_exist():
    names = {p.relative_to(ROOT).as_posix() for p in PAGES}
    for page in ("method", "studio", "benchmark", "models", "reliability", "results", "architecture"):
        assert f"docs/{page}.md" in names
    assert "CONTRIBUTING.md" in names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_and_anchor_resolves(page):
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists() or (anchor and resolved.suffix == ".md" and anchor not in anchors(resolved)):
            broken.append(target)
    assert broken == []


def test_the_readme_is_a_front_page():
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 250


def test_the_readme_results_table_is_exactly_its_runs():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    stale = "run python -m scripts.results_table --write"
    assert results_table.readme_table(readme) == results_table.table(), stale
    for row in results_table.ROWS:  # every cited run exists, with the table it links to
        assert (results_table.RESULTS / row.folder / "results.md").is_file(), row.folder


def test_the_results_page_tables_are_exactly_their_runs():
    page = results_table.RESULTS_PAGE.read_text(encoding="utf-8")
    for name, make in results_table.BLOCKS.items():
        assert results_table.block(page, name) == make(), "run python -m scripts.results_table --write"


def test_every_results_folder_is_cited_by_a_page():
    text = "".join(p.read_text(encoding="utf-8") for p in PAGES)
    folders = sorted(p.name for p in results_table.RESULTS.iterdir() if p.is_dir())
    uncited = [name for name in folders if f"results/{name}" not in text]
    assert uncited == []


#: Words about how the project was made rather than what it does.
PROCESS = re.compile(r"\bissues? #?\d|\b(this|last|next|earlier) session\b|\bhelpers?\b|\b20\d\d-\d\d-\d\d\b")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_pages_speak_of_the_software_not_of_the_work(page):
    hits = [line for line in page.read_text(encoding="utf-8").splitlines() if PROCESS.search(line)]
    assert hits == []


def test_the_readmes_python_example_runs_as_written_and_drafts(monkeypatch, capsys):
    # the snippet a newcomer copies: from the repository root, offline, the shipped memory loaded
    from recap.runtime import EMBEDDED_MODEL_V2

    if not (EMBEDDED_MODEL_V2 / "config.json").is_file():
        pytest.skip("the embedded model v2 is not in assets/models")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    code = re.search(r"## Use it from Python.*?```python\n(.*?)```", readme, re.S).group(1)
    monkeypatch.chdir(ROOT)
    exec(compile(code, "README.md", "exec"), {})
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) >= 2 and lines[0].startswith("0 '"), lines[:3]  # step 0: the prefill's token, as text
    drafted = [line for line in lines if "'persistent'" in line or "'ctx" in line]
    assert len(drafted) >= len(lines) // 2, "the example should show RECAP drafting most passes"
