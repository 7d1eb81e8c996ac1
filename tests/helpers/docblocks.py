"""The code blocks the docs promise a test runs, extracted by id: a page marks a block with
``<!-- runs: tests/test_x.py (block-id): what the test does -->`` on the line before it, and
that test runs ``block("page.md", "block-id")`` - the page's own text, not a paraphrase
(tests/test_docs.py holds every marker to a test that extracts it so)."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"
#: A marked block: the test, its id, the block's language and text (indented in a list item).
MARKED = re.compile(
    r"<!-- runs: (tests/\S+\.py) \(([\w-]+)\)[^>]*-->\n([ ]*)```(\w*)\n(.*?)\n[ ]*```", re.S
)


def marked(page: str) -> dict[str, tuple[str, str, str]]:
    """Every marked block of ``docs/<page>``: id -> (test, language, code)."""
    text = (DOCS / page).read_text()
    return {m[2]: (m[1], m[4], textwrap.dedent(f"{m[3]}{m[5]}").strip() + "\n")
            for m in MARKED.finditer(text)}  # fmt: skip


def block(page: str, block_id: str) -> str:
    """The code of the block ``block_id`` of ``docs/<page>``, as a user would paste it."""
    found = marked(page).get(block_id)
    assert found, f"docs/{page} has no block marked ({block_id})"
    return found[2]


def run_with_last_line(code: str, page: str) -> tuple[str, object]:
    """Run a block's ``code`` as a module ``docs_example`` would: everything but its last line
    executed, the last line evaluated; ``(last line, its value)``."""
    body, last = code.rstrip().rsplit("\n", 1)
    namespace: dict[str, object] = {"__name__": "docs_example"}
    exec(compile(body, f"docs/{page}", "exec"), namespace)  # noqa: S102 - the doc under test
    return last, eval(compile(last, f"docs/{page}", "eval"), namespace)  # noqa: S307


def run_as_notebook(code: str, page: str, **names: object) -> dict[str, object]:
    """Run a block as a notebook cell runs it (module ``__main__``, the notebook's globals in
    ``names``: ``spark``, the frames...); its namespace after the run. A Petastorm-style block
    sets the converter's parent cache folder on the session: unset again whatever happens."""
    namespace: dict[str, object] = {"__name__": "__main__", **names}
    try:
        exec(compile(code, str(DOCS / page), "exec"), namespace)  # noqa: S102 - the page's own code
    finally:
        spark = names.get("spark")
        if spark is not None:
            spark.conf.unset("petastorm.spark.converter.parentCacheDirUrl")  # type: ignore[attr-defined]
    return namespace
