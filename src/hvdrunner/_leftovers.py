"""Files a rank asks to have removed when it ends, however it ends.

A rank leaves with ``os._exit`` (interpreter teardown hangs or prints noise with some
frameworks), and a killed rank runs nothing at all: a library's own cleanup at exit never
runs. Mosaic Streaming's shared memory (``/dev/shm``) is the case: each dataset leaves a
handful of segments and file locks per host, which pile up job after job. The rank records
them here as it makes them; the supervisor that started it removes them once it has ended
(``hvdrunner._launch.rank.supervisor``), in the rank's own folder, ``HVDRUNNER_RANK_DIR``.

A group is guarded by an owner file: it is removed only while the owner is the file the rank
recorded (or gone), never a file another job has made since under the same name.

Example:
    >>> record("/dev/shm/000003_locals", ["/dev/shm/000003_*"])  # outside a rank: nothing
    False
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Sequence

RANK_DIR_ENV = "HVDRUNNER_RANK_DIR"
_LIST = "leftovers.jsonl"


def record(owner: str, patterns: Sequence[str]) -> bool:
    """Ask for every path matching ``patterns`` to be removed when this rank ends, as long as
    ``owner`` is still the file it is now. ``False`` outside a rank (nothing to do)."""
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
                    os.unlink(path)
                    removed += 1
                except OSError:
                    pass  # removed by another rank of the same host first
    return removed


__all__ = ["RANK_DIR_ENV", "record", "remove"]
