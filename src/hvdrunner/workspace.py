"""The Databricks workspace as a user meets it, written once: the volume folders the bundle's
jobs write, the install cells and commands users type, and the access mode a session is in.

The bundle (``databricks.yml``), docs/install.md, the notebooks' first cells, ``doctor``'s and
``migrate``'s hints all say these; ``tests/test_workspace.py`` holds each of them to this
module and runs the bundle's jobs against a local stand-in for the workspace.

Example:
    >>> wheel_cell("ml", "team_a", "0.2.0").splitlines()[0]
    '%pip install /Volumes/ml/team_a/hvdrunner/hvdrunner-0.2.0-py3-none-any.whl'
"""

from __future__ import annotations

import os
from typing import Any

from hvdrunner._version import __version__

#: The Unity Catalog volume the bundle and the notebooks keep their files in.
VOLUME = "hvdrunner"
#: Placeholders the docs print where a user's own names go.
CATALOG, SCHEMA, RUNTIME = "<catalog>", "<schema>", "<runtime>"
BUILD_JOB = "hvdrunner_build_horovod"
#: The build job's job parameter that builds again over a published wheel.
REBUILD_PARAM = "rebuild"
RESTART = "dbutils.library.restartPython()"
#: A Python cell: it runs in the notebook's own environment, where ``%pip`` installed.
DOCTOR_CELL = "import hvdrunner.doctor\nhvdrunner.doctor.check()"


def volume_root(catalog: str = CATALOG, schema: str = SCHEMA, volume: str = VOLUME) -> str:
    """``/Volumes/<catalog>/<schema>/hvdrunner``: the volume every target shares."""
    return f"/Volumes/{catalog}/{schema}/{volume}"


def wheel_folder(
    catalog: str = CATALOG, schema: str = SCHEMA, runtime: str = RUNTIME, volume: str = VOLUME
) -> str:
    """Where the build job publishes horovod, hvdrunner and ``requirements.txt`` for one
    runtime (``spark_version``, e.g. ``18.x-gpu-ml-scala2.13``): one folder per runtime,
    shared by every user and target, so a runtime is built once."""
    return f"{volume_root(catalog, schema, volume)}/wheels/{runtime}"


def compiled_cell(catalog: str = CATALOG, schema: str = SCHEMA, runtime: str = RUNTIME) -> str:
    """The notebook cell that installs hvdrunner, a compiled horovod and the TensorFlow that
    horovod was built against (the published ``requirements.txt`` pins all three): for
    ``HVDRUNNER_ENGINE=horovod`` and unchanged ``import horovod.tensorflow`` code only."""
    return f"%pip install -r {wheel_folder(catalog, schema, runtime)}/requirements.txt\n{RESTART}"


def hvdrunner_wheel(
    catalog: str = CATALOG, schema: str = SCHEMA, version: str = __version__
) -> str:
    """hvdrunner's own wheel in the volume: all that Keras (on TensorFlow or PyTorch) and
    PyTorch need, the frameworks being the runtime's."""
    return f"{volume_root(catalog, schema)}/hvdrunner-{version}-py3-none-any.whl"


def wheel_cell(catalog: str = CATALOG, schema: str = SCHEMA, version: str = __version__) -> str:
    """The notebook cell that installs hvdrunner (nothing compiled)."""
    return f"%pip install {hvdrunner_wheel(catalog, schema, version)}\n{RESTART}"


def build_command(
    target: str = "dev", rebuild: bool = False, catalog: str = CATALOG, schema: str = SCHEMA
) -> str:
    """The CLI command that runs the build job; ``rebuild`` passes its job parameter. It names
    the volume's catalog and schema (required bundle variables), so it runs as printed in a
    new shell.

    Example:
        >>> build_command("compiled", catalog="ml", schema="team_a")
        'databricks bundle run -t compiled --var catalog=ml --var schema=team_a hvdrunner_build_horovod'
    """
    command = f"databricks bundle run -t {target} --var catalog={catalog} --var schema={schema} {BUILD_JOB}"
    return f"{command} --params {REBUILD_PARAM}=true" if rebuild else command


def compiled_hint() -> str:
    """One sentence naming the build job and the install cell of a compiled horovod, for
    errors raised where one is needed (``HVDRUNNER_ENGINE=horovod``) and missing."""
    return (
        f"build horovod once per runtime ({build_command()}), then install it in a first "
        f"cell: {compiled_cell()!r} (hvdrunner's install page), or unset HVDRUNNER_ENGINE to "
        f"train on hvdrunner's engine (nothing compiled)"
    )


def access_mode(spark: Any = None, env: dict[str, str] | None = None) -> str:
    """Which compute this process runs on: ``"serverless"``, ``"standard"`` (standard, formerly
    shared, access mode: a Spark Connect session on Databricks), ``"dedicated"`` (a Databricks
    cluster with a SparkContext), or ``"not databricks"``.

    Example:
        >>> access_mode(env={})
        'not databricks'
    """
    env = dict(os.environ if env is None else env)
    if env.get("IS_SERVERLESS", "").strip().upper() == "TRUE":
        return "serverless"
    if not env.get("DATABRICKS_RUNTIME_VERSION"):
        return "not databricks"
    return "standard" if spark is not None and _is_connect(spark) else "dedicated"


def _is_connect(spark: Any) -> bool:
    return type(spark).__module__.startswith("pyspark.sql.connect")


#: What works where (docs/cluster.md says the same, as a table a test holds to this).
ACCESS_MODES = {
    "dedicated": "barrier jobs on the cluster's executors: every path (Keras on TensorFlow, "
    "PyTorch, Keras on PyTorch) through the classic launch backend",
    "standard": "standard (formerly shared) access mode has no ML runtime, no GPUs and no RDD "
    "or barrier jobs: HorovodRunner cannot train here - use a dedicated (single user) cluster "
    "on a GPU ML runtime (a Databricks Connect client may drive one from elsewhere)",
    "serverless": "serverless notebooks have no ML runtime, no GPUs and no executors to launch "
    "ranks on: HorovodRunner cannot train here. Serverless GPU compute runs PyTorch under its "
    "own launcher (`@distributed`): start the engine there with `import hvdrunner.hvd_torch as "
    "hvd` (torchrun-style RANK/WORLD_SIZE/MASTER_ADDR)",
    "not databricks": "local[N], a standalone cluster or a Spark Connect server: every path",
}


def describe_access_mode(spark: Any = None, env: dict[str, str] | None = None) -> str:
    """One line: the access mode and what works there."""
    mode = access_mode(spark, env)
    return f"{mode}: {ACCESS_MODES[mode]}"


#: The ML runtimes hvdrunner's CI runs, and how (docs/stacks.md): a replica installs the
#: runtime's own package list (requirements/<runtime>/runtime.txt).
TESTED_RUNTIMES = {
    **{runtime: f"tested: CI runs a replica of its packages (STACK={runtime}) and the whole "
                "suite on it" for runtime in ("15.4", "18", "19")},
    **{runtime: f"tested: CI runs a replica of its packages (STACK={runtime}), its doctor and "
                "2-rank Keras and PyTorch jobs with MLflow" for runtime in ("16.4", "17.3")},
}  # fmt: skip
#: The oldest runtime hvdrunner supports: Databricks' own HorovodRunner covers the ones before.
OLDEST_RUNTIME = (15, 4)


def runtime_support(env: dict[str, str] | None = None) -> tuple[bool | None, str]:
    """Whether hvdrunner supports the Databricks runtime this process runs on
    (``DATABRICKS_RUNTIME_VERSION``), and how its CI proves it: True (tested), None (not on
    Databricks, or a later runtime no replica has run yet) or False (before 15.4).

    Example:
        >>> runtime_support({"DATABRICKS_RUNTIME_VERSION": "15.4"})[1]
        'Databricks Runtime 15.4: tested: CI runs a replica of its packages (STACK=15.4) and the whole suite on it'
    """
    env = dict(os.environ if env is None else env)
    version = env.get("DATABRICKS_RUNTIME_VERSION", "").strip()
    if not version:
        return None, "not databricks"
    parts = [int(p) for p in version.split(".")[:2] if p.isdigit()]
    name = f"Databricks Runtime {version}"
    if len(parts) < 2:
        return None, f"{name}: not a version hvdrunner can read"
    if tuple(parts) < OLDEST_RUNTIME:
        return False, (f"{name}: before 15.4 LTS, which hvdrunner does not support (Databricks' "
                       "own sparkdl.HorovodRunner ships there)")  # fmt: skip
    key = str(parts[0]) if parts[0] >= 18 else f"{parts[0]}.{parts[1]}"
    if key in TESTED_RUNTIMES:
        return True, f"{name}: {TESTED_RUNTIMES[key]}"
    return None, (f"{name}: supported, but no replica of it runs in hvdrunner's CI yet "
                  f"(tested: {', '.join(TESTED_RUNTIMES)}); report what fails")  # fmt: skip
