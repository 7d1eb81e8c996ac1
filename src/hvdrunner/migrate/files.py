"""``hvdrunner migrate``'s files: found, read and checked before any is written, then
written whole, keeping each file's mode and owner.

A run writes all of its files or none: a file that is not a notebook (binary, not UTF-8, a
broken ``.ipynb``) or that cannot be written (read-only) is named with the reason, and
nothing is written. A symbolic link is written through (its target changes; the link stays).

Example:
    >>> main(["/no/such/notebook.py"])
    2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import stat
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

from hvdrunner._console import say
from hvdrunner.migrate import Finding, Report, as_text, migrate_source

SUFFIXES = (".py", ".ipynb")


@dataclass
class Planned:
    """One file's migration, checked and ready to write."""

    path: str
    before: str
    report: Report


def notebooks(paths: Sequence[str]) -> list[str]:
    """The notebook files under ``paths`` (files as given; folders walked, sorted)."""
    found = []
    for path in paths:
        if os.path.isdir(path):
            for root, dirs, names in os.walk(path):
                dirs.sort()
                found += [os.path.join(root, n) for n in sorted(names) if n.endswith(SUFFIXES)]
        elif os.path.isfile(path):
            found.append(path)
        else:
            raise FileNotFoundError(f"{path}: no such file or folder")
    return found


def plan(path: str, write: bool) -> Planned:
    """``path`` migrated in memory; ``ValueError`` naming why it cannot be."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise ValueError(f"cannot be read: {exc.strerror}") from None
    if b"\0" in raw:
        raise ValueError("a binary file, not a notebook")
    try:
        before = as_text(raw)
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}): save it as "
            f"UTF-8 first"
        ) from None
    try:
        report = migrate_source(before, path)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"not a valid .ipynb (its JSON breaks at line {exc.lineno}, column {exc.colno}: "
            f"{exc.msg})"
        ) from None
    if write and report.rewritten:
        _check_writable(path)
    return Planned(path, before, report)


def _check_writable(path: str) -> None:
    target = os.path.realpath(path)
    mode = os.stat(target).st_mode
    # Root may write anything: a file nobody may write is read-only on purpose.
    if not mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH) or not os.access(target, os.W_OK):
        where = f" (the link's target {target})" if target != os.path.abspath(path) else ""
        raise ValueError(f"read-only{where}: make it writable first (chmod u+w) to rewrite it")
    if not os.access(os.path.dirname(target) or ".", os.W_OK):
        raise ValueError(f"its folder {os.path.dirname(target)} is not writable")


def write(path: str, text: str) -> None:
    """Replace the file (a link's target) whole, with its mode and owner kept."""
    target = os.path.realpath(path)
    info = os.stat(target)
    folder = os.path.dirname(target)
    with tempfile.NamedTemporaryFile("w", dir=folder, delete=False, encoding="utf-8",
                                     prefix=".migrate-", newline="") as f:  # fmt: skip
        f.write(text)
    try:
        os.chmod(f.name, stat.S_IMODE(info.st_mode))
        with contextlib.suppress(PermissionError):
            os.chown(f.name, info.st_uid, info.st_gid)
        os.replace(f.name, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(f.name)
        raise


def _where(path: str, finding: Finding) -> str:
    if finding.cell is not None:
        return f"{path}: cell {finding.cell}, line {finding.line}"
    return f"{path}:{finding.line}"


def main(argv: Sequence[str] | None = None) -> int:
    """``hvdrunner migrate PATH... [--write]``: exit 0; 1 when a file cannot be migrated
    (nothing is written then); 2 for a path that does not exist."""
    parser = argparse.ArgumentParser(prog="hvdrunner migrate",
                                     description="rewrite HorovodRunner notebooks for hvdrunner")  # fmt: skip
    parser.add_argument("paths", nargs="+", help="notebooks (.py source format, .ipynb) or folders")
    parser.add_argument(
        "--write", action="store_true", help="apply the rewrites (default: show them)"
    )
    args = parser.parse_args(argv)
    try:
        files = notebooks(args.paths)
    except FileNotFoundError as exc:
        say(f"ERROR: {exc}", err=True)
        return 2
    planned, failed = [], []
    for path in files:
        try:
            planned.append(plan(path, args.write))
        except ValueError as exc:
            failed.append(f"{path}: {exc}")
    changed = hand = hints = 0
    for p in planned:
        if p.report.rewritten:
            changed += 1
            say(p.report.diff(p.before), end="")
        for note in p.report.notes:
            say(f"{p.path}: note: {note}")
        for f in p.report.manual:
            hand += 1
            say(f"{_where(p.path, f)}: needs a hand: {f.what}: `{f.text}`\n    fix: {f.fix}")
        for f in p.report.hints:
            hints += 1
            say(f"{_where(p.path, f)}: Mosaic Streaming instead (optional; the drop-in keeps "
                f"working): {f.what}: `{f.text}`\n    streaming: {f.fix}")  # fmt: skip
    for line in failed:
        say(f"ERROR: {line}", err=True)
    if failed and args.write:
        say(f"hvdrunner migrate: nothing written: {len(failed)} file(s) above cannot be "
            f"migrated (fix or leave them out, then run again)", err=True)  # fmt: skip
        return 1
    if args.write:
        for p in planned:
            if p.report.rewritten:
                write(p.path, p.report.text)
    verb = "rewrote" if args.write else "would rewrite (dry run; --write applies)"
    say(f"hvdrunner migrate: {len(files)} notebook(s); {verb} {changed}; {hand} line(s) need a "
        f"hand; {hints} with a Mosaic Streaming equivalent"
        + (f"; {len(failed)} could not be read" if failed else ""))  # fmt: skip
    return 1 if failed else 0
