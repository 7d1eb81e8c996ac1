"""Installed framework versions and the Keras mode, from package metadata (or, for a package a
Databricks cluster ships without metadata, its version file).

A leaf: no TensorFlow, PyTorch, Horovod or hvdrunner import, so the launcher, the rank entry
point, ``doctor`` and the benchmarks can decide before anything heavy loads.

- Keras 2: TensorFlow <= 2.15, or TensorFlow >= 2.16 with ``TF_USE_LEGACY_KERAS=1`` and
  ``tf_keras`` installed ("tf_keras mode"). Keras 3: TensorFlow >= 2.16 by default, or
  ``keras`` 3 without TensorFlow (its PyTorch backend).
- Keras 3's backend: :func:`keras_backend`, read as Keras reads it at import.

Example:
    >>> mode() in ("keras2", "tf_keras", "keras3", "none")
    True
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import json
import os
import re

LEGACY_ENV = "TF_USE_LEGACY_KERAS"
BACKEND_ENV = "KERAS_BACKEND"

#: Which Horovod runs Horovod's APIs (hvdrunner.torch, hvdrunner.keras, the drop-ins'
#: internals): ``hvdrunner`` (the default, hvdrunner's engine on torch.distributed: nothing
#: compiled) or ``horovod`` (a compiled ``horovod.torch``/``horovod.tensorflow``, where the
#: runtime has one). HorovodRunner passes it to every rank. ``HVDRUNNER_TORCH_ENGINE`` is its
#: older, PyTorch-only name (still read, for PyTorch, when ``HVDRUNNER_ENGINE`` is unset).
ENGINE_ENV = "HVDRUNNER_ENGINE"
TORCH_ENGINE_ENV = "HVDRUNNER_TORCH_ENGINE"
ENGINES = {
    "hvdrunner": {"torch": "hvdrunner.engine", "tensorflow": "hvdrunner.engine.tf"},
    "horovod": {"torch": "horovod.torch", "tensorflow": "horovod.tensorflow"},
}

# -- the frameworks hvdrunner knows, named once -------------------------------------------
#: Horovod's framework modules a rank may initialise (hvdrunner.hvd_keras uses one of them;
#: hvdrunner.engine is hvdrunner.hvd_torch's).
HOROVOD_FRAMEWORKS = (
    "hvdrunner.engine",
    "horovod.torch",
    "horovod.tensorflow",
)  # engine.tf: the engine's
#: Packages a stalled rank counts as "inside a library" in (the stall's report).
#: Where a rank's main thread counts as inside a library for the stall watchdog: the
#: frameworks, Horovod, and hvdrunner's own Horovod engine (a rank blocked in hvd.allreduce).
LIBRARY_PACKAGES = ("tensorflow", "keras", "tf_keras", "torch", "horovod", "hvdrunner/engine")


#: Where a Databricks runtime ships a package under another distribution name: MLflow as
#: ``mlflow-skinny`` (every ML runtime since 15.4 names only the skinny one).
ALIASES = {"mlflow": ("mlflow", "mlflow-skinny")}
#: Packages a cluster puts on the path with no distribution metadata at all (pyspark comes
#: from the runtime's Spark, /databricks/spark/python): their version is read from the
#: module's own version file, without importing it.
VERSION_FILES = {"pyspark": "version.py"}


def version(dist: str) -> str | None:
    """The installed version of distribution ``dist``, or ``None``.

    Where no metadata says (pyspark on a Databricks cluster), the package's own version file
    does; MLflow counts as installed as ``mlflow`` or ``mlflow-skinny``.

    Example:
        >>> version("no-such-package") is None
        True
    """
    for name in ALIASES.get(dist, (dist,)):
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            continue
    return _version_file(dist)


def _version_file(package: str) -> str | None:
    """``__version__`` as written in ``package``'s version file, found on ``sys.path``
    without importing the package; ``None`` where there is none."""
    file = VERSION_FILES.get(package)
    if file is None:
        return None
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        try:
            with open(os.path.join(folder, file), encoding="utf-8") as f:
                text = f.read()
        except OSError:
            continue
        found = re.search(r"""__version__(?:\s*:\s*str)?\s*=\s*["']([^"']+)["']""", text)
        if found:
            return found.group(1)
    return None


def major_minor(text: str) -> tuple[int, int]:
    """``(2, 16)`` from ``"2.16.1"`` (a suffix such as ``rc0`` ignored)."""
    parts = (text.split(".") + ["0", "0"])[:2]
    return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)


def tensorflow() -> str | None:
    """TensorFlow's version (the ``tensorflow`` or ``tensorflow-cpu`` distribution)."""
    return version("tensorflow") or version("tensorflow-cpu")


def legacy_requested() -> bool:
    """``TF_USE_LEGACY_KERAS`` is set to a true value (TensorFlow's own reading of it)."""
    return os.environ.get(LEGACY_ENV, "").strip().lower() in ("1", "true", "yes")


def generation() -> int | None:
    """2 or 3: the Keras generation ``tf.keras`` (or, without TensorFlow, ``keras``) resolves
    to; ``None`` with neither TensorFlow nor Keras 3.

    Example:
        >>> generation() in (2, 3, None)
        True
    """
    tf = tensorflow()
    if tf is None:
        keras = version("keras")
        return 3 if keras is not None and major_minor(keras) >= (3, 0) else None
    if major_minor(tf) < (2, 16):
        return 2
    if legacy_requested() and version("tf_keras") is not None:
        return 2
    return 3


def mode() -> str:
    """``"keras2"`` (TF <= 2.15), ``"tf_keras"`` (legacy mode on TF >= 2.16), ``"keras3"``
    (on any backend), or ``"none"`` (neither TensorFlow nor Keras 3 installed)."""
    if generation() == 3:
        return "keras3"
    tf = tensorflow()
    if tf is None:
        return "none"
    return "tf_keras" if major_minor(tf) >= (2, 16) else "keras2"


def keras_backend(env: dict[str, str] | None = None) -> str:
    """The backend Keras 3 will load: ``KERAS_BACKEND``, else ``keras.json``'s ``backend``
    (in ``$KERAS_HOME`` or ``~/.keras``), else ``"tensorflow"`` - Keras' own order, read
    without importing Keras (which would load the backend). Keras 2 is always
    ``"tensorflow"``. Inside a rank, :func:`hvdrunner.keras.backend.name` asks Keras itself.

    Example:
        >>> keras_backend({"KERAS_BACKEND": "torch"})
        'torch'
    """
    env = dict(os.environ if env is None else env)
    if generation() == 2:
        return "tensorflow"
    chosen = env.get(BACKEND_ENV, "").strip()
    if chosen:
        return chosen.lower()
    home = env.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    try:
        with open(os.path.join(home, "keras.json")) as f:
            return str(json.load(f).get("backend", "tensorflow")).strip().lower()
    except (OSError, ValueError, AttributeError):
        return "tensorflow"


def _engine_choice(env: dict[str, str] | None, names: tuple[str, ...]) -> str:
    source = dict(os.environ) if env is None else env
    for name in names:
        choice = source.get(name, "").strip().lower()
        if not choice:
            continue
        if choice not in ENGINES:
            raise ValueError(
                f"{name}={source.get(name)!r}: expected 'hvdrunner' (hvdrunner's engine on "
                f"torch.distributed, the default) or 'horovod' (a compiled horovod)"
            )
        return choice
    return "hvdrunner"


def torch_engine(env: dict[str, str] | None = None) -> str:
    """The module that runs Horovod's PyTorch API here (``HVDRUNNER_ENGINE``, else its older
    name ``HVDRUNNER_TORCH_ENGINE``).

    Example:
        >>> torch_engine({}), torch_engine({"HVDRUNNER_ENGINE": "horovod"})
        ('hvdrunner.engine', 'horovod.torch')
    """
    return ENGINES[_engine_choice(env, (ENGINE_ENV, TORCH_ENGINE_ENV))]["torch"]


def tf_engine(env: dict[str, str] | None = None, has_torch: bool | None = None) -> str:
    """The module that runs Horovod's TensorFlow API here (``HVDRUNNER_ENGINE``). Unset, it
    is hvdrunner's engine where torch (its transport) is installed, else a compiled
    ``horovod.tensorflow`` (the lts stack's: TensorFlow 2.15 without torch).

    Example:
        >>> tf_engine({}, has_torch=True), tf_engine({"HVDRUNNER_ENGINE": "horovod"})
        ('hvdrunner.engine.tf', 'horovod.tensorflow')
        >>> tf_engine({}, has_torch=False)
        'horovod.tensorflow'
    """
    source = dict(os.environ) if env is None else env
    choice = _engine_choice(source, (ENGINE_ENV,))
    if not source.get(ENGINE_ENV, "").strip():
        torch_here = version("torch") is not None if has_torch is None else has_torch
        choice = "hvdrunner" if torch_here else "horovod"
    return ENGINES[choice]["tensorflow"]


def framework_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The driver's settings that choose a framework (``KERAS_BACKEND``,
    ``TF_USE_LEGACY_KERAS``, ``HVDRUNNER_ENGINE``), for every rank: a notebook that sets them in ``os.environ``
    trains its ranks on what it chose, whatever the executors' own environment says.

    Example:
        >>> framework_env({"KERAS_BACKEND": "torch", "PATH": "/bin"})
        {'KERAS_BACKEND': 'torch'}
    """
    source = dict(os.environ) if env is None else env
    return {
        name: source[name]
        for name in (BACKEND_ENV, LEGACY_ENV, ENGINE_ENV, TORCH_ENGINE_ENV)
        if name in source
    }
