"""Files a rank asks to have removed when it ends, however it ends.

A rank leaves with ``os._exit`` (interpreter teardown hangs or prints noise with some
frameworks), and a killed rank runs nothing at all: a library's own cleanup at exit never
runs. Mosaic Streaming's shared memory (``/dev/shm``) is the case: each dataset leaves a
handful of segments and file locks per host, which pile up job after job. The rank records
them here as it makes them; the supervisor that started it removes them once it has ended
(``hvdrunner._launch.rank.supervisor``), in the rank's own folder, ``HVDRUNNER_RANK_DIR``.

A group is guarded by an owner file: it is removed only while the owner is the file the rank
recorded (or gone), never a file another job has made since under the same name.

The supervisor can be killed too: Spark kills a failed job's other tasks with SIGKILL, and
with them their supervisors, which then remove nothing - neither the rank's folder (its
pickled function and arguments) nor what the rank recorded. So a supervisor holds a lock on
its folder for as long as it lives (:func:`claim`; the kernel drops it however the process
ends), and every supervisor first removes the folders whose lock nobody holds any more, with
what their ranks recorded (:func:`sweep`).

Example:
    >>> record("/dev/shm/000003_locals", ["/dev/shm/000003_*"])  # outside a rank: nothing
    False
"""

from __future__ import annotations

import fcntl
import glob
import json
import os
import shutil
import tempfile
from collections.abc import Sequence

RANK_DIR_ENV = "HVDRUNNER_RANK_DIR"
#: How a rank's folder is named (``tempfile`` adds a random tail), in the temporary folder.
FOLDER_PREFIX = "hvdrunner-rank"
_LIST = "leftovers.jsonl"
_LOCK = "supervisor.lock"


def record(owner: str, patterns: Sequence[str]) -> bool:
    """Ask for every path matching ``patterns`` (a folder with what it holds) to be removed
    when this rank ends, as long as ``owner`` is still the file it is now. ``False`` outside a
    rank (nothing to do)."""
    folder = os.environ.get(RANK_DIR_ENV)
    if not folder or not os.path.isdir(folder):
        return False
    try:
        inode = os.stat(owner).st_ino
    except OSError:
        return False
    with open(os.path.join(folder, _LIST), "a") as f:
        f.write(json.dumps({"owner": owner, "inode": inode, "patterns": list(patterns)}) + "\n")
    return True


def remove(folder: str) -> int:
    """Remove what the rank that ran in ``folder`` recorded; the number of paths removed."""
    try:
        with open(os.path.join(folder, _LIST)) as f:
            groups = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError):
        return 0
    removed = 0
    for group in groups:
        try:
            if os.stat(group["owner"]).st_ino != group["inode"]:
                continue  # the name belongs to someone else now
        except OSError:
            pass  # the owner is gone: what is left under the group's names is leftovers
        for pattern in group["patterns"]:
            for path in glob.glob(pattern):
                try:
                    if os.path.isdir(path) and not os.path.islink(path):
                        shutil.rmtree(path)
                    else:
                        os.unlink(path)
                    removed += 1
                except OSError:
                    pass  # removed by another rank of the same host first
    return removed


def claim(folder: str) -> int:
    """Lock ``folder`` as in use for as long as this process lives or until the descriptor
    returned is closed. The lock file appears already locked (made under another name, locked,
    then renamed), so a :func:`sweep` never sees it unlocked while its owner lives."""
    staged = os.path.join(folder, _LOCK + ".new")
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new file: nobody else holds it
        os.rename(staged, os.path.join(folder, _LOCK))
    except BaseException:
        os.close(fd)
        raise
    return fd


def sweep(parent: str | None = None) -> list[str]:
    """Remove the rank folders in ``parent`` (the temporary folder) whose supervisor died
    without removing them, with what their ranks recorded; the folders removed. A folder
    without a lock file (one being made, or an older hvdrunner's) is left alone."""
    removed = []
    for folder in glob.glob(os.path.join(parent or tempfile.gettempdir(), FOLDER_PREFIX + "*")):
        try:
            fd = os.open(os.path.join(folder, _LOCK), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # its supervisor lives (or another sweep has it)
            os.close(fd)
            continue
        try:
            remove(folder)
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
        finally:
            os.close(fd)
    return removed


__all__ = ["FOLDER_PREFIX", "RANK_DIR_ENV", "claim", "record", "remove", "sweep"]
