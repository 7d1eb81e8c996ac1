"""One notebook cell through ``hvdrunner migrate``: its imports rewritten or reported from
Python's own parse, its installs and manual cases reported from its lines.

A cell's magic and shell lines (``%pip``, ``!pip``, a ``%sh`` cell, ``# MAGIC`` lines of
Databricks' source format) are blanked before parsing, so line numbers stay the cell's. A
rewrite replaces the module's name inside the import statement's own text: aliases,
parentheses, comments and what follows a ``;`` stay as they were. A cell that is not valid
Python is checked line by line instead, and says so.

Example:
    >>> out = migrate_cell(["from sparkdl import HorovodRunner as HR  # launcher\\n"])
    >>> out.lines[0], out.rewritten
    ('from hvdrunner import HorovodRunner as HR  # launcher\\n', [(1, 'sparkdl.HorovodRunner (absent after DBR 15.4 LTS ML)')])
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from hvdrunner.migrate import rules

_MAGIC = re.compile(r"^\s*(?:# MAGIC\s?)?[%!]")
_SH = re.compile(r"^\s*(?:# MAGIC\s*)?%sh\b")
_TEXT_CELL = re.compile(r"^\s*(?:# MAGIC\s*)?%(?:md|md-sandbox|r|scala|sql)\b")


@dataclass(frozen=True)
class Finding:
    """One line that needs a hand (``line``: 1-based in its cell, or in the file where a
    file has no cells)."""

    line: int
    text: str
    what: str
    fix: str
    cell: int | None = None


@dataclass
class CellResult:
    """A cell after migration: its lines, what was rewritten (line, why) and reported."""

    lines: list[str]
    rewritten: list[tuple[int, str]] = field(default_factory=list)
    manual: list[Finding] = field(default_factory=list)
    hints: list[Finding] = field(default_factory=list)  # petastorm -> Mosaic Streaming


def migrate_cell(lines: list[str]) -> CellResult:
    """``lines`` (with their line endings) migrated."""
    out = CellResult(list(lines))
    first = next((ln for ln in lines if ln.strip()), "")
    if _TEXT_CELL.match(first):
        return out  # markdown or another language: text, not code
    shell = bool(_SH.match(first))
    magic = [shell or bool(_MAGIC.match(ln)) for ln in lines]
    reported: set[int] = set()
    for i, line in enumerate(lines):
        if rules.INSTALL.pattern.search(line):
            _report(out, reported, i, rules.INSTALL.what, rules.INSTALL.fix)
    if not shell:
        code = "".join("\n" if m else ln for ln, m in zip(lines, magic, strict=True))
        try:
            tree = ast.parse(code)
        except (SyntaxError, ValueError) as exc:
            _line_by_line(out, reported, magic, exc)
        else:
            _imports(out, reported, tree)
    for i, line in enumerate(lines):
        if magic[i] or i in reported:
            continue
        for rule in rules.MANUAL:
            if rule.pattern.search(line):
                _report(out, reported, i, rule.what, rule.fix)
                break
    out.manual.sort(key=lambda f: f.line)
    for i, line in enumerate(lines):
        hint = next((r for r in rules.STREAMING if not magic[i] and r.pattern.search(line)), None)
        if hint is not None:
            out.hints.append(Finding(i + 1, line.strip(), hint.what, hint.fix))
    return out


def _report(out: CellResult, reported: set[int], i: int, what: str, fix: str) -> None:
    if i not in reported:
        reported.add(i)
        out.manual.append(Finding(i + 1, out.lines[i].strip(), what, fix))


def _imports(out: CellResult, reported: set[int], tree: ast.AST) -> None:
    """Every import of a watched module: rewritten in place, else reported (last first, so
    that a rewrite never moves the text of one before it)."""
    nodes = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    for node in sorted(nodes, key=lambda n: (n.lineno, n.col_offset), reverse=True):
        for module, to, why, what_fix in _plan(node):
            if to is not None and _rewrite(out, node, module, to):
                out.rewritten.append((node.lineno, why))
            elif what_fix is not None:
                _report(out, reported, node.lineno - 1, *what_fix)
    out.rewritten.sort()


def _plan(node: ast.Import | ast.ImportFrom) -> list[tuple[str, str | None, str, tuple[str, str] | None]]:  # fmt: skip
    """``(module, rewrite it to, why, (what, fix) if reported)`` for each watched module."""
    if isinstance(node, ast.ImportFrom):
        module = node.module or ""
        if node.level:
            return []
        drop = rules.FROM.get(module)
        names = {a.name for a in node.names}
        if drop is not None and (drop.names is None or names <= drop.names):
            return [(module, drop.to, drop.what, None)]
        return [(module, None, "", rules.no_drop_in(module))] if rules.reported(module) else []
    planned: list[tuple[str, str | None, str, tuple[str, str] | None]] = []
    for alias in node.names:
        if not rules.reported(alias.name):
            continue
        drop = rules.IMPORT_AS.get(alias.name) if alias.asname else None
        if drop is not None:
            planned.append((alias.name, drop.to, drop.what, None))
        else:
            planned.append((alias.name, None, "", rules.no_drop_in(alias.name)))
    return planned


def _rewrite(out: CellResult, node: ast.stmt, module: str, to: str) -> bool:
    """Replace ``module`` with ``to`` inside the statement's own text."""
    first, last = node.lineno - 1, (node.end_lineno or node.lineno) - 1
    start = _chars(out.lines[first], node.col_offset)
    end = _chars(out.lines[last], node.end_col_offset or 0)
    text = "".join(out.lines[first : last + 1])
    stop = len(text) - (len(out.lines[last]) - end)
    segment = text[start:stop]
    dotted = r"\s*\.\s*".join(map(re.escape, module.split(".")))
    lead = r"^from\s+" if isinstance(node, ast.ImportFrom) else r"(?:^import\s+|,\s*)"
    pattern = re.compile(rf"({lead}){dotted}(?=\s|\\|\(|,|$)")
    new, count = pattern.subn(lambda m: m.group(1) + to, segment, count=1)
    if not count:
        return False
    rebuilt = text[:start] + new + text[stop:]
    out.lines[first : last + 1] = rebuilt.splitlines(True)
    return True


def _chars(line: str, byte_offset: int) -> int:
    """ast's column (UTF-8 bytes) as a character index into ``line``."""
    return len(line.encode("utf-8")[:byte_offset].decode("utf-8", errors="ignore"))


def _line_by_line(out: CellResult, reported: set[int], magic: list[bool], exc: Exception) -> None:
    """A cell Python cannot parse: each line that imports sparkdl or horovod is reported."""
    why = getattr(exc, "msg", str(exc))
    for i, line in enumerate(out.lines):
        if not magic[i] and re.search(r"^\s*(?:from|import)\s+(?:sparkdl|horovod)\b", line):
            _report(out, reported, i, f"an import in a cell that is not valid Python ({why}): "
                    "checked line by line, not rewritten",
                    "fix the cell's syntax and run hvdrunner migrate again")  # fmt: skip
