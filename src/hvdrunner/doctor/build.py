"""Horovod's build facts for ``hvdrunner doctor``: what the installed horovod was built with
and whether this stack needs it.

The facts come from horovod's own checks (extension files and the loaded library's
``gloo_built()`` / ``mpi_built()`` / ``nccl_built()``), never from ``horovodrun
--check-build``'s banner, which reports PyTorch even when no torch extension was built.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from hvdrunner import _versions, workspace
from hvdrunner.doctor.checklist import Check

_version = _versions.version


def _extension_file(subdir: str, base: str) -> bool:
    import horovod
    from horovod.common.util import get_ext_suffix

    path = os.path.join(os.path.dirname(horovod.__file__), subdir, base + get_ext_suffix())
    return os.path.exists(path)


#: Run in a fresh interpreter: loads horovod's extension for one framework (the module named
#: in argv) and prints what the library was built with.
_PROBE = (
    "import importlib, json, sys\n"
    "m = importlib.import_module(sys.argv[1])\n"
    "print(json.dumps({k: bool(getattr(m, k)()) for k in ('gloo_built', 'mpi_built', "
    "'nccl_built')}))\n"
)


def collect_build_info() -> dict[str, Any]:
    """Ask horovod what it was built with: one fresh interpreter per framework loads that
    framework's extension (a file built against another version fails to load there, and a
    broken one cannot crash the doctor) and asks the loaded library. Horovod's own
    ``gloo_built()`` & co. would start an interpreter each: with the load check, TensorFlow
    imported four times (the doctor 15 s on 18, against 5.7 s so)."""
    info: dict[str, Any] = {"horovod": _version("horovod")}
    info["tensorflow"], info["torch"] = _version("tensorflow"), _version("torch")
    if info["horovod"] is None:
        return info
    loaded: list[dict[str, bool]] = []
    for dist, subdir, base, module in (("tensorflow", "tensorflow", "mpi_lib", "horovod.tensorflow"),
                                       ("torch", "torch", "mpi_lib_v2", "horovod.torch")):  # fmt: skip
        if not _extension_file(subdir, base):
            info[f"{dist}_ext"] = False
        elif info[dist] is None:  # a file for a framework that is not here: nothing to load
            info[f"{dist}_ext"] = True
        else:
            built = _probe(module)
            info[f"{dist}_ext"] = built is not None
            loaded += [built] if built is not None else []
    for key in ("gloo", "mpi", "nccl"):
        info[key] = bool(loaded and loaded[0][f"{key}_built"])
    return info


def _probe(module: str) -> dict[str, bool] | None:
    """What ``module``'s loaded horovod library was built with, or None where it fails to
    load."""
    proc = subprocess.run([sys.executable, "-c", _PROBE, module], capture_output=True,
                          text=True, timeout=180, check=False)  # fmt: skip
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return None
    try:
        return {k: bool(v) for k, v in json.loads(lines[-1]).items()}
    except (ValueError, AttributeError):
        return None


def _framework_check(info: dict[str, Any], name: str, dist: str, fix: str,
                     needed: bool = True) -> Check:  # fmt: skip
    """Required where the framework is installed (and ``needed``); information otherwise."""
    built = bool(info.get(f"{dist}_ext"))
    title = f"horovod built with {name}"
    if info.get(dist) is None:
        return Check(title, None, f"{'yes' if built else 'no'} ({dist} not installed)",
                     required=False)  # fmt: skip
    detail = (
        f"yes ({dist} {info[dist]})" if built else f"no {name} extension for {dist} {info[dist]}"
    )
    if not needed:
        return Check(title, built or None, detail if built else detail + ENGINE_NOTE,
                     required=False)  # fmt: skip
    return Check(title, built, detail, fix)


#: What runs without a compiled horovod (doctor's wording, said once).
ENGINE_NOTE = (
    "; not needed: hvdrunner.keras, hvdrunner.torch and the drop-ins hvdrunner.hvd_keras, "
    "hvdrunner.hvd_tensorflow and hvdrunner.hvd_torch run on hvdrunner's engine "
    "(torch.distributed); unchanged "
    "`import horovod.tensorflow`/`horovod.torch` code and HVDRUNNER_ENGINE=horovod need it"
)


def _fix_build(env: dict[str, str] | None) -> str:
    """How to get a horovod built for these frameworks: on a Databricks cluster the build job
    and the install cell (a cluster has no checkout); elsewhere the builder script."""
    if workspace.access_mode(env=dict(os.environ if env is None else env)) != "not databricks":
        return workspace.compiled_hint()
    return (
        "rebuild horovod against the installed frameworks: PYTHON=$(which python) bash "
        "scripts/install_horovod.sh (it applies the patches in patches/: TF >= 2.16 and "
        "torch >= 2.1 need them), or rm -rf .venv-<stack> && make test"
    )


def evaluate_build(info: dict[str, Any], env: dict[str, str] | None = None) -> list[Check]:
    """Turn build facts into checks. Pure: tests feed it fake build info (and ``env``).

    TensorFlow and PyTorch run on hvdrunner's engine, so horovod and its extensions are
    required only with ``HVDRUNNER_ENGINE=horovod`` (``HVDRUNNER_TORCH_ENGINE`` for PyTorch).
    """
    compiled_torch = _versions.torch_engine(env) == _versions.ENGINES["horovod"]["torch"]
    compiled_tf = (_versions.tf_engine(env, has_torch=bool(info.get("torch")))
                   == _versions.ENGINES["horovod"]["tensorflow"])  # fmt: skip
    fix_build = _fix_build(env)
    if not info.get("horovod"):
        frameworks = info.get("tensorflow") or info.get("torch")
        if (
            frameworks
            and not (compiled_tf and info.get("tensorflow"))
            and not (compiled_torch and info.get("torch"))
        ):
            return [Check("horovod", None, "not installed" + ENGINE_NOTE, required=False)]
        return [Check("horovod", False, "not installed", fix_build)]
    checks = [
        Check("horovod", True, info["horovod"]),
        _framework_check(info, "TensorFlow", "tensorflow", fix_build, needed=compiled_tf),
        _framework_check(info, "PyTorch", "torch", fix_build, needed=compiled_torch),
        Check(
            "horovod built with gloo",
            bool(info.get("gloo")),
            "yes" if info.get("gloo") else "no",
            fix_build,
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
