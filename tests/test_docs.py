"""The docs cannot go stale: the site builds strictly, every code block a user would paste is
run by a named test or says why not, every repository path the docs name exists, and the
facts the docs count (notebooks, jobs, modules) match the repository."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [ROOT / "README.md", *DOCS]
FENCE = re.compile(r"^```python\n", re.M)
MARKER = re.compile(r"<!-- (?:not run: \S.*|.*\bruns: (tests/\S+\.py).*) -->\n$")
WORDS = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6}


def test_the_site_builds_strictly(tmp_path):
    # mkdocs.yml sets strict: a broken link or anchor, a page not in nav, or an API
    # reference (mkdocstrings, read from the source) that does not resolve fails the build.
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "api" / "index.html").read_text().count("HorovodRunner") > 3


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_python_block_is_run_by_a_test_or_says_why_not(page):
    text = page.read_text()
    for fence in FENCE.finditer(text):
        before = text[: fence.start()].splitlines(keepends=True)[-1:]
        line = text[: fence.start()].count("\n") + 1
        found = MARKER.match(before[0]) if before else None
        assert found, (
            f"{page.name}:{line}: a python block needs, on the line before it, "
            f"<!-- runs: tests/test_x.py ... --> or <!-- not run: why -->"
        )
        test = found.group(1)
        if test:  # the test named must exist and read this page
            source = (ROOT / test).read_text()
            assert page.name in source, f"{page.name}:{line}: {test} does not read {page.name}"


# Paths the docs name in backticks: they must exist (a glob or placeholder is skipped).
PATH = re.compile(
    r"`((?:src/hvdrunner|scripts|tests|notebooks|resources|benchmarks|patches|requirements|docs)"
    r"/[\w./-]+)`"
)


@pytest.mark.parametrize("page", [*PAGES, ROOT / "requirements.txt"], ids=lambda p: p.name)
def test_every_repository_path_the_docs_name_exists(page):
    missing = sorted({m for m in PATH.findall(page.read_text()) if not (ROOT / m).exists()})
    assert not missing, f"{page.name} names paths that do not exist: {missing}"


def test_source_pointers_to_docs_name_pages_that_exist():
    pointers = set()
    for path in (ROOT / "src" / "hvdrunner").rglob("*.py"):
        pointers |= set(re.findall(r"docs/[\w-]+\.md", path.read_text()))
    assert pointers and all((ROOT / p).is_file() for p in pointers), pointers


def test_the_counts_the_docs_state_match_the_repository():
    notebooks = sorted((ROOT / "notebooks").glob("*.py"))
    said = re.search(r"holds (\w+) Databricks source-format notebooks",
                     (ROOT / "docs" / "notebooks.md").read_text())  # fmt: skip
    assert said and WORDS[said.group(1)] == len(notebooks)
    for notebook in notebooks:
        assert f"`{notebook.stem}`" in (ROOT / "docs" / "notebooks.md").read_text()
    jobs = [
        name
        for path in (ROOT / "resources").glob("*.yml")
        for name in (yaml.safe_load(path.read_text()).get("resources", {}).get("jobs") or {})
    ]
    said = re.search(r"defines (\w+) jobs", (ROOT / "docs" / "databricks.md").read_text())
    assert said and WORDS[said.group(1)] == len(jobs)


def test_the_layout_names_every_module_and_package():
    layout = (ROOT / "docs" / "architecture.md").read_text()
    src = ROOT / "src" / "hvdrunner"
    names = {p.stem for p in src.glob("*.py") if p.stem not in ("__init__", "__main__")}
    names |= {p.name for p in src.iterdir() if (p / "__init__.py").is_file()}
    missing = sorted(n for n in names if not re.search(rf"\b{re.escape(n)}\b", layout))
    assert not missing, f"docs/architecture.md's layout omits {missing}"


def test_the_readme_is_a_front_door():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150, "README.md: reference belongs in docs/"
    linked = set(re.findall(r"\]\(docs/([\w-]+\.md)\)", text))
    assert linked == {p.name for p in DOCS} - {"index.md", "api.md"}, "every page linked once"


def _tables(text: str) -> Iterator[tuple[int, list[str], list[list[str]], str]]:
    """Each markdown table: (line, header cells, rows of cells, the text before it)."""
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        if (
            lines[i].startswith("|")
            and i + 1 < len(lines)
            and re.fullmatch(r"\|[-| ]+\|", lines[i + 1])
        ):
            end = i
            while end < len(lines) and lines[end].startswith("|"):
                end += 1
            before = i - 1
            while before > 0 and not lines[before].startswith(("|", "#")):
                before -= 1
            cells = [[c.strip() for c in row.strip("|").split("|")] for row in lines[i:end]]
            yield i + 1, cells[0], cells[2:], "\n".join(lines[before + 1 : i])
            i = end
        else:
            i += 1


def _numbers(value: object) -> list[float]:
    if isinstance(value, bool):
        return []
    if isinstance(value, (int, float)):
        return [float(value)]
    if isinstance(value, dict):
        return [n for v in value.values() for n in _numbers(v)]
    if isinstance(value, list):
        return [n for v in value for n in _numbers(v)]
    return []


NUMBER = re.compile(r"(?<![\w.])(\d{1,3}(?:,\d{3})+|\d+\.\d+|\d+)(?![\w.])")


def test_every_benchmark_figure_is_quoted_from_its_results_file():
    # docs/benchmarks.md: each table names its benchmarks/results/*.json in the text before
    # it, and every figure in it is one of that file's numbers (as rounded there, or as %
    # or ms of it); columns computed from them are declared (<!-- derived columns: ... -->).
    import json

    results = ROOT / "benchmarks" / "results"
    checked = 0
    for line, header, rows, before in _tables((ROOT / "docs" / "benchmarks.md").read_text()):
        names = re.findall(r"benchmarks/results/([\w<>.-]+\.json)", before)
        files = {n.replace("<stack>", s) for n in names for s in ("lts", "modern", "torch")}
        pool = [n for f in files if (results / f).is_file()
                for n in _numbers(json.loads((results / f).read_text()))]  # fmt: skip
        assert pool, f"docs/benchmarks.md:{line}: the table names no results file before it"
        derived = re.search(r"<!-- derived columns: ([^;>]*)", before)
        skip = {c.strip() for c in derived.group(1).split(",")} if derived else set()
        for row in rows:
            for head, cell in zip(header[1:], row[1:], strict=True):
                if head in skip or "`" in cell:
                    continue
                for m in NUMBER.findall(cell):
                    x, places = float(m.replace(",", "")), len(m.partition(".")[2])
                    found = any(abs(round(v * k, places) - x) < 1e-9 for v in pool
                                for k in (1, 100, 1000))  # fmt: skip
                    assert found, (
                        f"docs/benchmarks.md:{line}: {m} ({cell!r}) is in no {sorted(files)}"
                    )
                    checked += 1
    assert checked > 150  # the scan saw the tables


def test_petastorms_pyarrow_limit_is_stated_one_way():
    # It works only with pyarrow < 15 (it fails on 15 and cannot import from 16): pages once
    # said "< 15" in one place and "≥ 16" in another. A symptom line may name the import error.
    claims = [
        f"{page.name}: {line.strip()}"
        for page in [*PAGES, ROOT / "requirements.txt"]
        for line in page.read_text().splitlines()
        if "petastorm" in line.lower() and re.search(r"pyarrow (≥|>=) ?16", line)
        and "ModuleNotFoundError" not in line
    ]  # fmt: skip
    assert not claims, claims
