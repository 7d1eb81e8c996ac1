"""The docs cannot go stale: the site builds strictly, every code block a user would paste is
run by a named test or says why not, every repository path the docs name exists, and the
facts the docs count (notebooks, jobs, modules) match the repository."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from conftest import PART_ENV, STACKS
from helpers import scripts
from helpers.docblocks import MARKED, marked

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))
#: Stacks the runtime replicas replaced: their results files keep their names, and
#: docs/benchmarks.md says so once, naming each.
RETIRED_STACKS = {"lts": "15.4", "modern": "18", "torch": "19"}

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
    api = (tmp_path / "api" / "index.html").read_text()
    assert api.count("HorovodRunner") > 3
    # Every setting of both fits is rendered, with its default.
    import dataclasses

    from hvdrunner.core.settings import TrainingSettings
    from hvdrunner.keras.config import FitConfig as KerasConfig

    torch_fields = re.findall(
        r"^    (\w+): ", (ROOT / "src/hvdrunner/torch/config.py").read_text(), re.M
    )
    names = {f.name for c in (TrainingSettings, KerasConfig) for f in dataclasses.fields(c)}
    missing = sorted(n for n in names | set(torch_fields) if f"<code>{n}</code>" not in api
                     and f">{n}<" not in api)  # fmt: skip
    assert not missing, f"the API page does not render {missing}"


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
        assert found.group(1) is None or (
            found.group(0) in {m[0].split("\n")[0] + "\n" for m in MARKED.finditer(text)}
        ), f"{page.name}:{line}: a runs: marker needs a block id - (block-id) after the test"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_block_a_test_runs_is_extracted_by_that_test(page):
    """Named by an id and extracted by its test (helpers/docblocks.block): a test that only
    paraphrases a block - or a page whose block changed - fails here or there."""
    text = page.read_text()
    assert text.count("<!-- runs:") == len(MARKED.findall(text)), (
        f"{page.name}: every <!-- runs: tests/x.py (block-id) ... --> marker precedes a fenced "
        "block and names its id"
    )
    for block_id, (test, _, _) in marked(page.name).items() if page.parent.name == "docs" else []:
        call = f'block("{page.name}", "{block_id}")'
        assert call in (ROOT / test).read_text(), f"{test} does not run {call}"


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


def test_the_layout_names_every_module_and_package():  # submodules of packages too
    layout = (ROOT / "docs" / "architecture.md").read_text()
    src = ROOT / "src" / "hvdrunner"
    names = {p.stem for p in src.rglob("*.py") if p.stem not in ("__init__", "__main__")}
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
        files = {n.replace("<stack>", s) for n in names for s in (*RETIRED_STACKS, *STACKS)}
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


# -- claims the docs make about the code (issue 39: each contradiction found by a check) -------
def _resolves(dotted: str) -> bool | None:
    """Whether ``hvdrunner.x.y`` names something; None when its framework is not installed."""
    import importlib

    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as exc:
            if exc.name in ("torch", "tensorflow", "keras", "tf_keras", "petastorm"):
                return None  # only a framework this stack lacks leaves a name unknown
            if exc.name and exc.name.startswith("hvdrunner"):
                continue  # a shorter prefix is the module, the rest attributes
            return False
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


def _mlflow_keys() -> set[str]:
    """The ``hvdrunner.*`` strings the code uses as MLflow keys (``hvdrunner.attempt.N`` for
    a key made with a number)."""
    keys = set()
    for path in (ROOT / "src" / "hvdrunner").rglob("*.py"):
        for key, braced in re.findall(r'"(hvdrunner\.[\w.]*)(\{)?', path.read_text()):
            keys.add(key + "N" if braced else key)
    return keys


# On the TensorFlow stack and 19: each name is checked where its framework is.
@pytest.mark.keras_torch
@pytest.mark.stacks("18", "19")
@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_hvdrunner_name_the_docs_give_exists(page):
    text = page.read_text()
    names = set(re.findall(r"`(hvdrunner(?:\.[A-Za-z_]\w*)+)", text))
    names |= {f"hvdrunner.tracking.{n}" for n in re.findall(r"`tracking\.([a-z_]\w*)", text)}
    keys = _mlflow_keys()  # MLflow tags, metrics and collective names, not Python names
    missing = sorted(n for n in names if n not in keys and _resolves(n) is False)
    assert not missing, f"{page.name} names what the code does not have: {missing}"


def test_the_readme_says_which_verbosity_streams_the_ranks_output():
    for paragraph in (ROOT / "README.md").read_text().split("\n\n"):
        if "stream" in paragraph and "output" in paragraph:
            assert 'driver_log_verbosity="all"' in paragraph, paragraph


def test_the_readme_quotes_no_set_up_times_they_live_in_stacks_md():
    text = (ROOT / "README.md").read_text()
    assert not re.findall(r"\d+\s*(?:–\d+\s*)?(?:min\b|minutes)", text)
    assert "](docs/stacks.md)" in text


def test_the_readmes_one_call_fit_has_every_required_setting():
    text = " ".join((ROOT / "README.md").read_text().split())
    call = text[text.index("run(hvdrunner.keras.fit,") :].split(")`")[0]
    for required in ("build_model=", "data=", "epochs=", "batch_size=", "loss="):
        assert required in call, (required, call)


def test_speed_rows_say_the_keras_mode_they_were_measured_in():
    import json

    result = json.loads(
        (ROOT / "benchmarks/results/tf_distribute_comparison-modern.json").read_text()
    )
    mode = "tf_keras mode" if result["keras"].startswith("2.") else "Keras 3"  # tf_keras is 2.x
    rows = [
        ln for ln in (ROOT / "README.md").read_text().splitlines() if "MirroredStrategyRunner" in ln
    ]
    assert rows and all(mode in row for row in rows), (mode, rows)


def _pinned(stack: str, package: str) -> str | None:
    """The version a replica installs of ``package`` (its runtime's pin or recorded
    difference), or None where the stack pins none."""
    pins = scripts.load("runtime_pins")
    if not (ROOT / "requirements" / stack / "runtime.txt").exists():
        return None
    return pins.shipped(pins.constraints(stack)).get(package)


def test_results_measured_outside_todays_pins_are_labelled_in_the_docs():
    import json

    docs = (ROOT / "docs" / "benchmarks.md").read_text()
    said = " ".join(docs.split())
    for path in sorted((ROOT / "benchmarks" / "results").glob("*-*.json")):
        stack = path.stem.rsplit("-", 1)[-1]
        if stack in RETIRED_STACKS:  # measured on a stack a replica has since replaced
            assert f"`{stack}`" in said and "since replaced" in said, path.name
            continue
        versions = json.loads(path.read_text()).get("versions", "")
        m = re.search(r"pyarrow ([\d.]+)", versions) if isinstance(versions, str) else None
        pinned = _pinned(stack, "pyarrow")
        if m and pinned and m.group(1) != pinned:
            assert path.name in docs and f"pyarrow {m.group(1)}" in docs, path.name


def test_the_dates_beside_benchmark_tables_are_their_results_dates():
    import json

    results = ROOT / "benchmarks" / "results"
    for line, _, _, before in _tables((ROOT / "docs" / "benchmarks.md").read_text()):
        # the paragraph that names the table's results file, and what follows it: earlier
        # paragraphs since the last table belong to other measurements
        before = before[before.rfind("\n\n", 0, max(before.rfind("benchmarks/results/"), 0)) + 1 :]
        dates = set(re.findall(r"20\d\d-\d\d-\d\d", before))
        names = re.findall(r"benchmarks/results/([\w<>.-]+\.json)", before)
        files = [
            results / n.replace("<stack>", s) for n in names for s in (*RETIRED_STACKS, *STACKS)
        ]
        recorded = {json.loads(f.read_text()).get("date") for f in files if f.is_file()}
        if None in recorded:  # a results file that records no date (a model, a CI log)
            continue
        assert dates <= recorded, f"docs/benchmarks.md:{line}: {dates} vs {recorded}"


def test_pointers_to_readme_sections_name_sections_that_exist():
    headings = set(re.findall(r"^#+ (.+)$", (ROOT / "README.md").read_text(), re.MULTILINE))
    for path in [ROOT / "databricks.yml", *ROOT.glob("resources/*.yml"), *ROOT.glob("src/**/*.py"),
                 *ROOT.glob("scripts/**/*"), *DOCS]:  # fmt: skip
        if path.is_file() and "__pycache__" not in path.parts:  # the tests import scripts
            for section in re.findall(r'README, "([^"]+)"', path.read_text()):
                assert section in headings, f"{path.name} points to README section {section!r}"


def test_data_md_documents_every_argument_of_prepare():
    import inspect

    from hvdrunner.data import prepare

    text = (ROOT / "docs" / "data.md").read_text()
    missing = [
        p for p in inspect.signature(prepare).parameters if p != "df" and f"`{p}`" not in text
    ]
    assert not missing, f"docs/data.md does not document prepare's {missing}"
    assert "`dtype=None`" in text


def test_no_runtime_message_points_to_a_docs_file_an_installed_wheel_lacks():
    import ast

    found = []
    for path in (ROOT / "src" / "hvdrunner").rglob("*.py"):
        tree = ast.parse(path.read_text())
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
                      and node.body and isinstance(node.body[0], ast.Expr)
                      and isinstance(node.body[0].value, ast.Constant)}  # fmt: skip
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and id(node) not in docstrings and re.search(r"docs/[\w-]+\.md", node.value)):  # fmt: skip
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, f"messages naming docs/*.md, which the wheel does not ship: {found}"


def _table_column(stage: str) -> dict[str, int]:
    """docs/testing.md's per-module counts for ``stage`` ("—": none), "in all" as ``*``."""
    text = (ROOT / "docs" / "testing.md").read_text()
    header = next(line for line in text.splitlines() if line.startswith("| module |"))
    col = [c.strip() for c in header.strip("|").split("|")].index(stage)
    counts = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        name = (
            re.fullmatch(r"`(test_\w+\.py)`|\*\*in all\*\*", cells[0])
            if line.startswith("| ")
            else None
        )
        if name and len(cells) > col:
            number = re.match(r"\d+", cells[col])
            counts[name.group(1) or "*"] = int(number.group(0)) if number else 0
    return counts


# Each stage checks its own column (tf_keras mode: the keras_mode tests of `make test-tf-keras`).
@pytest.mark.keras_torch
@pytest.mark.keras_mode
@pytest.mark.stacks("18", "15.4", "19", "gpu", "16.4", "17.3")
def test_testing_md_counts_the_tests_this_stage_runs():
    from conftest import selected_stack

    stack = selected_stack()
    if stack is None:
        pytest.skip("not a stage of `make test`: STACK selects one (docs/testing.md)")
    tf_keras = os.environ.get("TF_USE_LEGACY_KERAS") == "1"
    found: dict[str, int] = {}
    for test in _stage_tests(None, *(["-m", "keras_mode"] if tf_keras else [])):
        module = test.split("::")[0].rsplit("/", 1)[-1]
        found[module] = found.get(module, 0) + 1
    found["*"] = sum(found.values())
    said = {k: v for k, v in _table_column("tf_keras mode" if tf_keras else stack).items() if v}
    assert found == said, f"docs/testing.md's {stack} column: {said}; collected: {found}"


def _stage_tests(part: str | None, *args: str) -> list[str]:
    """The test ids this stage (STACK) collects: whole (``part`` None, whichever part this
    run is), or the part of it CI runs in a lane of its own (tests/conftest.py, PART_ENV)."""
    env = {k: v for k, v in os.environ.items() if k != PART_ENV}
    if part:
        env[PART_ENV] = part
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [line for line in proc.stdout.splitlines() if "::" in line]


# .ci/run runs the stages of 15.4 and 19 in two parts (tests/conftest.py); together they are
# the stage.
@pytest.mark.torch
@pytest.mark.stacks("15.4", "19")
@pytest.mark.background  # no time bound: it runs in the part it checks
def test_the_two_parts_ci_runs_of_a_stage_are_the_whole_stage():
    whole = _stage_tests(None)
    background, foreground = _stage_tests("background"), _stage_tests("foreground")
    assert background and foreground
    assert not set(background) & set(foreground)
    assert sorted(background + foreground) == sorted(whole)


def test_the_tests_jvms_map_sparks_class_archive_as_testing_md_says(spark):
    """docs/testing.md: a stage of 25 tests or more makes the archive, and the JVMs its tests
    start map it (the session's own here). A JVM that ignored it would say nothing."""
    options = os.environ.get("SPARK_SUBMIT_OPTS", "")
    found = re.search(r"-XX:SharedArchiveFile=(\S+)", options)
    if found is None:
        assert not os.environ.get("CI"), f"CI's stage 18 runs its JVMs without it: {options!r}"
        pytest.skip("fewer than 25 tests run here, or JVM options set by hand: no archive")
    jvm = spark.sparkContext._gateway.proc.pid  # spark-submit execs java in this process
    maps = Path(f"/proc/{jvm}/maps").read_text()
    assert found.group(1) in maps, f"the session's JVM does not map {found.group(1)}"
