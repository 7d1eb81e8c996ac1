"""``hvdrunner doctor``: what a user needs to know before training, as a checklist: horovod's
build (doctor.build), the stack's versions, the host and the environment.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

from hvdrunner import _versions, multihost, workspace
from hvdrunner._console import say
from hvdrunner.doctor.build import collect_build_info, evaluate_build
from hvdrunner.doctor.checklist import Check
from hvdrunner.errors import EnvironmentCheckError

_version = _versions.version
__all__ = ["Check", "check", "collect_build_info", "environment_checks", "evaluate_build",
           "evaluate_stack", "installed_versions", "multihost_check", "run_doctor"]  # fmt: skip


def _mm(version: str) -> tuple[int, int]:
    parts = (version.split(".") + ["0", "0"])[:2]
    return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)


def _framework_checks(tf: str | None, torch: str | None, env: dict[str, str]) -> list[Check]:
    """TensorFlow or torch (the torch stack has no TF): at least one must be there; torch
    too where ``HVDRUNNER_ENGINE=hvdrunner`` asks for TensorFlow on hvdrunner's engine (its
    transport is torch.distributed; unset, TensorFlow without torch takes the compiled horovod)."""
    asked = env.get(_versions.ENGINE_ENV, "").strip().lower() == "hvdrunner"
    needs_torch = tf is not None and torch is None and asked
    torch_detail = torch or (
        "not installed: TensorFlow runs on the compiled horovod here (with torch it runs on "
        "hvdrunner's engine, nothing compiled)" if tf is not None else
        "not installed (optional: hvdrunner.torch and horovod.torch need it)")  # fmt: skip
    return [
        Check("tensorflow", tf is not None if torch is None else (tf is not None or None),
              tf or "not installed", "install a supported stack: make env STACK=18 (or "
              "STACK=15.4, or STACK=19 for PyTorch)", required=torch is None),
        Check("torch", False if needs_torch else (True if torch else None), torch_detail,
              "pip install torch (every Databricks ML runtime with TensorFlow ships it): "
              "HVDRUNNER_ENGINE=hvdrunner runs TensorFlow over torch.distributed",
              required=needs_torch),
    ]  # fmt: skip


def _keras3_backend(
    keras: str | None, tf: str | None, torch: str | None, env: dict[str, str]
) -> Check:
    """Keras 3 trains on TensorFlow or PyTorch (``horovod.tensorflow``/``horovod.torch``),
    the backend being Keras' default (``tensorflow``) unless ``KERAS_BACKEND`` says."""
    chosen = env.get("KERAS_BACKEND", "").strip().lower()
    if not chosen and tf is None and torch is not None:
        # A PyTorch environment that has Keras too: nothing is wrong until Keras is used.
        return Check("Keras generation", None, f"Keras 3 (keras {keras}) beside PyTorch, no "
                     "TensorFlow: to train Keras on PyTorch set KERAS_BACKEND=torch before "
                     "Keras is imported (Keras' default backend, tensorflow, is absent)",
                     required=False)  # fmt: skip
    backend = chosen or "tensorflow"
    installed = {"tensorflow": tf, "torch": torch}.get(backend)
    fix = ("set KERAS_BACKEND=torch (Keras' default, tensorflow, is not installed)" if tf is None
           else "unset KERAS_BACKEND, or set it to tensorflow or torch (Horovod has no JAX "
           "collectives)")  # fmt: skip
    return Check(
        "Keras generation", installed is not None,
        f"Keras 3 (keras {keras}, backend {backend}): use hvdrunner.keras.fit or "
        f"`import hvdrunner.hvd_keras as hvd`; horovod.tensorflow.keras is refused in ranks "
        f"(it would train unsynchronized)", fix)  # fmt: skip


def evaluate_stack(
    versions: dict[str, str | None], env: dict[str, str] | None = None
) -> list[Check]:
    """Version compatibility of every supported stack. Pure: tests feed it fake versions.

    TF <= 2.15 (Keras 2, numpy < 2), TF >= 2.16 (15.4 and 18: Keras 3 or tf_keras
    mode), petastorm with pyarrow < 15 and torch without TF pass; mixes that break training
    fail.
    """
    env = dict(os.environ if env is None else env)
    tf = versions.get("tensorflow")
    checks = _framework_checks(tf, versions.get("torch"), env)
    modern = tf is not None and _mm(tf) >= (2, 16)
    legacy = env.get("TF_USE_LEGACY_KERAS", "").strip().lower() in ("1", "true", "yes")
    keras, tfk = versions.get("keras"), versions.get("tf_keras")
    if tf is not None and not modern:
        ok = keras is None or keras.startswith("2.")
        checks.append(Check(
            "Keras generation", ok if keras else None,
            f"Keras 2 (tf.keras {keras}): hvdrunner.keras and horovod.tensorflow.keras both work"
            if ok else f"keras {keras} with TensorFlow {tf}",
            f"pip install keras=={tf} (TF {tf} needs Keras 2)"))  # fmt: skip
        numpy = versions.get("numpy")
        if numpy is not None:
            checks.append(Check("numpy < 2 (TF <= 2.15)", int(numpy.split(".")[0]) < 2, numpy,
                                "pip install numpy==1.26.4"))  # fmt: skip
    elif modern and legacy:
        same = tfk is not None and _mm(tfk) == _mm(tf or "0")
        checks.append(Check(
            "Keras generation", same,
            f"tf_keras mode (TF_USE_LEGACY_KERAS=1, tf_keras {tfk}): Keras 2; "
            f"horovod.tensorflow.keras works unchanged in ranks" if same
            else f"TF_USE_LEGACY_KERAS=1 but tf_keras is {tfk or 'not installed'} "
            f"(TensorFlow {tf}): tf.keras would not be the Keras 2 you asked for",
            f"pip install tf_keras=={'.'.join(map(str, _mm(tf or '0')))}.* or unset TF_USE_LEGACY_KERAS"))  # fmt: skip
    elif modern or (tf is None and keras is not None and _mm(keras) >= (3, 0)):
        checks.append(_keras3_backend(keras, tf, versions.get("torch"), env))
    pyarrow, petastorm = versions.get("pyarrow"), versions.get("petastorm")
    if petastorm is None:
        checks.append(Check("petastorm", None, "not installed (optional: hvdrunner.petastorm "
                            "offers its converter API; petastorm 0.13.1 works only with pyarrow < 15)",
                            required=False))  # fmt: skip
    else:
        ok = pyarrow is not None and int(pyarrow.split(".")[0]) < 15
        checks.append(Check(
            f"petastorm {petastorm} with pyarrow < 15", ok, f"pyarrow {pyarrow}",
            "pip install pyarrow==14.0.2, or pip uninstall petastorm (it cannot import with "
            "pyarrow >= 16 and fails on 15: 'validate_schema'; import the converter from "
            "hvdrunner.petastorm.spark instead)"))  # fmt: skip
    spark = versions.get("pyspark")
    checks.append(Check("pyspark", spark is not None, spark or "not installed",
                        "pip install pyspark (3.5 with 15.4, 4.1 with 18, 4.2 with 19)"))  # fmt: skip
    mlflow = versions.get("mlflow")
    checks.append(
        Check("mlflow", mlflow is not None, mlflow or "not installed", "pip install mlflow==3.17.2")
    )
    return checks


def multihost_check(facts: multihost.HostFacts) -> Check:
    """Whether this host can run ranks of a multi-host job. Pure: tests feed it facts."""
    name = "multi-host gloo (hostname, horovod's gloo interface patch)"
    if facts.patched is None:
        return Check(name, None, "horovod not installed", required=False)
    resolves = f"{facts.hostname} resolves to {facts.address or 'nothing'}"
    if not facts.broken:
        patch = "patched" if facts.patched else "unpatched, fine while hostnames resolve"
        return Check(name, True, f"{resolves}; horovod {patch}", required=False)
    return Check(name, False, multihost.problem(facts),
                 "install the horovod hvdrunner builds, or fix /etc/hosts (see above); "
                 "single-host jobs are not affected", required=False)  # fmt: skip


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
    checks.append(Check("compute", None, workspace.describe_access_mode(_session()),
                        required=False))  # fmt: skip
    supported, runtime = workspace.runtime_support()
    if runtime != "not databricks":
        checks.append(Check("runtime", supported, runtime, "use 15.4 LTS ML or later",
                            required=False))  # fmt: skip
    try:
        import mlflow

        checks.append(Check("MLflow tracking URI", None, mlflow.get_tracking_uri(), required=False))
    except ImportError:
        pass
    if master:
        from hvdrunner._launch import backends  # through the launch seam
        from hvdrunner.spark import local_session

        spark = local_session(master)
        slots = backends.choose(1).describe_slots()
        checks.append(
            Check(
                f"Spark {spark.version} master {master}",
                None,
                slots,
                required=False,
            )
        )
    return checks


def _session() -> Any:
    """The active SparkSession (classic or Connect), if pyspark has one."""
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        return None
    return SparkSession.getActiveSession()


def check(master: str | None = None) -> None:
    """Print the checklist in a notebook cell and raise when a required piece is missing: the
    cell after an install cell (it runs in the notebook's own environment).

    Raises:
        EnvironmentCheckError: naming how many required checks failed (each is printed above
            with its fix).

    Example:
        >>> import hvdrunner.doctor
        >>> hvdrunner.doctor.check()  # doctest: +SKIP
    """
    failed = run_doctor(master)
    if failed:
        raise EnvironmentCheckError(
            "hvdrunner doctor: required check(s) failed; each is printed above with its fix"
        )


#: The distributions evaluate_stack reads.
STACK_PACKAGES = ("tensorflow", "torch", "keras", "tf_keras", "numpy", "pyarrow", "petastorm",
                  "pyspark", "mlflow")  # fmt: skip


def installed_versions() -> dict[str, str | None]:
    """What evaluate_stack reads, as installed here; a cluster's pyspark (no package
    metadata) and its ``mlflow-skinny`` count (``_versions.version``).

    Example:
        >>> sorted(installed_versions()) == sorted(STACK_PACKAGES)
        True
    """
    return {d: _version(d) for d in STACK_PACKAGES}


def run_doctor(master: str | None = None, quiet: bool = False) -> int:
    """Print the checklist (only failures with ``quiet``); 1 when a required piece is missing."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # the checks load TF; keep its banner out
    versions = installed_versions()
    checks = (
        evaluate_build(collect_build_info())
        + [multihost_check(multihost.host_facts())]
        + evaluate_stack(versions)
        + environment_checks(master)
    )
    failed = 0
    for c in checks:
        mark = {True: "[x]", False: "[ ]", None: "[-]"}[c.ok]
        bad = c.ok is False and c.required
        if bad or not quiet:
            say(f"{mark} {c.name}: {c.detail}")
        if c.ok is False and (bad or not quiet):
            say(f"      fix: {c.fix}")
        failed += bad
    say(f"{'' if quiet else chr(10)}{'OK' if not failed else f'{failed} required check(s) failed'}")
    return 1 if failed else 0
