"""The console: the one place library code writes to stdout/stderr other than the logger
(:func:`say`: a command's report, relayed rank output, a notebook's ``display``), and a
process's own console output over a block, captured and replayed without what is not news:
the lines of :mod:`hvdrunner._noise` a caller names, and progress bars.

Used where a library prints at the C level or at import (TensorFlow's absl lines, MLflow's
store migrations) and no logger setting can silence it: a Spark Python worker scoring a
model (:mod:`hvdrunner.inference`), the demo opening its MLflow store (:mod:`hvdrunner.cli`).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
import tempfile
from collections.abc import Iterator, Sequence

from hvdrunner._noise import noisy


def say(text: str, *, err: bool = False, end: str = "\n") -> None:
    """Write ``text`` to stdout (``err``: stderr) as they are now (notebooks and pytest swap
    them), flushed: output a user asked for, not a log record.

    Example:
        >>> say("OK")
        OK
    """
    stream = sys.stderr if err else sys.stdout
    stream.write(text + end)
    stream.flush()


#: A framework's progress bar line: Keras 3 ``━━━``, Keras 2 ``6/6 [===>..]``.
PROGRESS = re.compile(r"━|\d+/\d+ \[[=>.]+\]")


@contextlib.contextmanager
def replayed_without(markers: Sequence[str], progress_bars: bool = False) -> Iterator[None]:
    """Capture stdout and stderr (file descriptor 2 too: C-level writers) over the block, then
    write every line to stderr except those containing one of ``markers`` (and, with
    ``progress_bars``, progress bars). Exceptions pass through; their output is replayed.

    Example:
        >>> with replayed_without(["chatter"]):
        ...     print("chatter: dropped")
    """
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as err, contextlib.redirect_stdout(io.StringIO()) as out:
        os.dup2(err.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            err.seek(0)
            text = err.read().decode("utf-8", errors="replace") + "\n" + out.getvalue()
            shown = [
                line for line in text.splitlines()
                if line.strip() and not noisy(line, markers)
                and not (progress_bars and PROGRESS.search(line))
            ]  # fmt: skip
            if shown:
                say("\n".join(shown), err=True)
