"""What every benchmark records next to its figures: the stack, the machine, the date."""

from __future__ import annotations

import os
import platform
import time


def stack() -> str:
    """``lts`` (TF 2.15 / Keras 2) or ``modern`` (TF >= 2.16 / Keras 3), as the Makefile names them."""
    if os.environ.get("STACK") in ("lts", "modern"):
        return os.environ["STACK"]
    from hvdrunner._versions import major_minor, tensorflow

    return "lts" if major_minor(tensorflow() or "0") < (2, 16) else "modern"


def context() -> dict:
    import pyarrow
    import tensorflow as tf

    return {
        "stack": stack(),
        "versions": f"Python {platform.python_version()}, TF {tf.__version__}, pyarrow {pyarrow.__version__}",
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"{os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') >> 30} GiB",
        "date": time.strftime("%Y-%m-%d"),
    }
