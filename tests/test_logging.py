"""hvdrunner's one voice: the ``hvdrunner`` logger (status lines, warnings), which users can
raise or lower like any logger."""

from __future__ import annotations

import logging

from hvdrunner._logging import get_logger
from hvdrunner.core.checkpoint import CheckpointDir


def test_status_and_warnings_use_one_logger_users_can_turn_down(tmp_path, capsys):
    log = get_logger("hvdrunner.data")
    log.info("materialized 10 rows")
    get_logger().warning("something odd")
    err = capsys.readouterr().err
    assert "[hvdrunner.data] materialized 10 rows" in err
    assert "[hvdrunner] WARNING: something odd" in err
    root = logging.getLogger("hvdrunner")
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        log.info("hidden")
        store = CheckpointDir(str(tmp_path), keep=1)
        (tmp_path / "epoch-00001").mkdir()  # corrupt: no state.json -> a warning, muted
        assert store.latest() is None
        assert capsys.readouterr().err == ""
    finally:
        root.setLevel(level)
