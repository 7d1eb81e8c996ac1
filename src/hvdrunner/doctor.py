"""``hvdrunner doctor``: what a user needs to know before training, as a checklist.

Build facts come from horovod's own checks (extension files and the loaded library's
``gloo_built()`` / ``mpi_built()`` / ``nccl_built()``), never from ``horovodrun
--check-build``'s banner, which reports PyTorch even when no torch extension was built.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import shutil
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Check:
    """One checklist line. ``ok=None`` is information only; ``required`` failures exit 1."""

    name: str
    ok: bool | None
    detail: str
    fix: str = ""
    required: bool = True


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _extension_file(subdir: str, base: str) -> bool:
    import horovod
    from horovod.common.util import get_ext_suffix

    path = os.path.join(os.path.dirname(horovod.__file__), subdir, base + get_ext_suffix())
    return os.path.exists(path)


def collect_build_info() -> dict[str, Any]:
    """Ask horovod what it was built with (each check loads the library in a subprocess)."""
    info: dict[str, Any] = {"horovod": _version("horovod")}
    if info["horovod"] is None:
        return info
    from horovod.common import util

    info["tensorflow_ext"] = _extension_file("tensorflow", "mpi_lib")
    info["torch_ext"] = _extension_file("torch", "mpi_lib_v2")
    info["gloo"] = bool(util.gloo_built())
    info["mpi"] = bool(util.mpi_built())
    info["nccl"] = bool(util.nccl_built())
    return info


def evaluate_build(info: dict[str, Any]) -> list[Check]:
    """Turn build facts into checks. Pure: tests feed it fake build info."""
    fix_build = (
        "rebuild horovod: rm -rf .venv && make test (or HOROVOD_WITH_TENSORFLOW=1 "
        "HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 pip install --no-build-isolation "
        "--no-cache-dir horovod==0.28.1 with TensorFlow installed first)"
    )
    if not info.get("horovod"):
        return [Check("horovod", False, "not installed", fix_build)]
    checks = [
        Check("horovod", True, info["horovod"]),
        Check(
            "horovod built with TensorFlow",
            bool(info.get("tensorflow_ext")),
            "yes" if info.get("tensorflow_ext") else "no TensorFlow extension",
            fix_build,
        ),
        Check(
            "horovod built with gloo",
            bool(info.get("gloo")),
            "yes" if info.get("gloo") else "no",
            fix_build,
        ),
        Check(
            "horovod built with PyTorch",
            None,
            "yes" if info.get("torch_ext") else "no",
            required=False,
        ),
        Check(
            "horovod built with MPI",
            None,
            "yes" if info.get("mpi") else "no (gloo is used)",
            required=False,
        ),
        Check(
            "horovod built with NCCL",
            None,
            "yes" if info.get("nccl") else "no (CPU/gloo allreduce)",
            required=False,
        ),
    ]
    return checks


def evaluate_stack(versions: dict[str, str | None]) -> list[Check]:
    """Version compatibility of the stack. Pure: tests feed it fake versions."""
    checks: list[Check] = []
    tf = versions.get("tensorflow")
    checks.append(
        Check("tensorflow", tf is not None, tf or "not installed", "pip install tensorflow==2.15.1")
    )
    keras = versions.get("keras")
    if keras is not None:
        major = int(keras.split(".")[0])
        checks.append(
            Check(
                "keras 2 (horovod's Keras callbacks break on Keras 3)",
                major == 2,
                keras,
                "pip install keras==2.15.0 (TF 2.15)",
            )
        )
    numpy = versions.get("numpy")
    if numpy is not None:
        checks.append(
            Check(
                "numpy < 2 (TF 2.15)",
                int(numpy.split(".")[0]) < 2,
                numpy,
                "pip install numpy==1.26.4",
            )
        )
    pyarrow, petastorm = versions.get("pyarrow"), versions.get("petastorm")
    if petastorm is None:
        checks.append(Check("petastorm", False, "not installed", "pip install petastorm==0.13.1"))
    else:
        ok = pyarrow is not None and int(pyarrow.split(".")[0]) < 15
        checks.append(
            Check(
                f"petastorm {petastorm} with pyarrow < 15",
                ok,
                f"pyarrow {pyarrow}",
                "pip install pyarrow==14.0.2 (petastorm 0.13.1 fails on pyarrow>=15: "
                "unexpected keyword 'validate_schema')",
            )
        )
    spark = versions.get("pyspark")
    checks.append(
        Check("pyspark", spark is not None, spark or "not installed", "pip install pyspark==3.5.9")
    )
    mlflow = versions.get("mlflow")
    checks.append(
        Check("mlflow", mlflow is not None, mlflow or "not installed", "pip install mlflow==3.17.2")
    )
    return checks


def environment_checks(master: str | None) -> list[Check]:
    """Java, GPUs, MLflow tracking URI and, with ``master``, Spark's task slots."""
    from hvdrunner.distributed import host_gpus

    checks = [
        Check(
            "java (for Spark)",
            shutil.which("java") is not None,
            shutil.which("java") or "not found",
            "install Java 17 (apt-get install openjdk-17-jdk-headless)",
        ),
    ]
    gpus = host_gpus()
    checks.append(
        Check(
            "GPUs visible", None, ", ".join(gpus) if gpus else "none (CPU training)", required=False
        )
    )
    try:
        import mlflow

        checks.append(Check("MLflow tracking URI", None, mlflow.get_tracking_uri(), required=False))
    except ImportError:
        pass
    if master:
        from hvdrunner._launch.spark_backend import task_slots
        from hvdrunner.spark import local_session

        spark = local_session(master)
        slots, why = task_slots(spark.sparkContext)
        checks.append(
            Check(
                f"Spark {spark.version} master {master}",
                None,
                f"{slots} task slots ({why})",
                required=False,
            )
        )
    return checks


def run_doctor(master: str | None = None) -> int:
    """Print the checklist; return 1 when a required piece is missing, else 0."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # the checks load TF; keep its banner out
    versions = {
        d: _version(d)
        for d in ("tensorflow", "keras", "numpy", "pyarrow", "petastorm", "pyspark", "mlflow")
    }
    checks = (
        evaluate_build(collect_build_info()) + evaluate_stack(versions) + environment_checks(master)
    )
    failed = 0
    for c in checks:
        mark = {True: "[x]", False: "[ ]", None: "[-]"}[c.ok]
        print(f"{mark} {c.name}: {c.detail}")
        if c.ok is False and c.required:
            failed += 1
            print(f"      fix: {c.fix}")
    print(f"\n{'OK' if not failed else f'{failed} required check(s) failed'}")
    return 1 if failed else 0
