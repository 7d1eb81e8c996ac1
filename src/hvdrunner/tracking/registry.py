"""The model registry on the driver: an alias for the newest good version, and a model URI
pinned to the version it names before anything is scored with it.

A training job registers its model from rank 0 (``fit(registered_model_name=...)``); once the
job has finished without error, :func:`set_alias` points an alias (``champion``) at the version
that run registered, so the alias only ever names a model whose training completed. Scoring
by alias then goes through :func:`pin`: the alias is resolved once to ``models:/<name>/<version>``
and that version is what is loaded, so an alias another job moves meanwhile cannot swap the
model under a running scoring job, and an accuracy is never logged to a run that did not train
the model scored (:func:`hvdrunner.inference.score` refuses it).
"""

from __future__ import annotations

import re

from hvdrunner.tracking.driver import (
    check_registered_model_name,
    is_unity_catalog_name,
    is_workspace_registry,
)

#: What both registries take: Unity Catalog's alias rule (letters, digits, underscores; not
#: starting with a digit) within MLflow's (which also reserves ``latest`` and ``v<digits>``).
_ALIAS = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,254}$")
_RESERVED = re.compile(r"^(latest|v\d+)$", re.IGNORECASE)
_MODELS_URI = re.compile(r"^models:/(?P<name>[^@]+?)(?:@(?P<alias>[^/]+)|/(?P<version>\d+))$")


def check_model_alias(alias: str) -> None:
    """Refuse an alias a registry would refuse, before training starts.

    Raises:
        ValueError: naming ``model_alias`` and what it may be.

    Example:
        >>> check_model_alias("champion")
    """
    if not isinstance(alias, str) or not _ALIAS.match(alias) or _RESERVED.match(alias):
        raise ValueError(
            f"model_alias={alias!r}: an alias is letters, digits and underscores, not starting "
            f"with a digit, and neither 'latest' nor 'v<number>' (the registry reserves those), "
            f"e.g. 'champion'"
        )


def set_alias(name: str, alias: str, run_id: str) -> str:
    """Point ``alias`` of registered model ``name`` at the newest version ``run_id`` registered;
    ``models:/<name>@<alias>``. Call it after the job's run ended without error.

    Raises:
        LookupError: that run registered no version of ``name`` (nothing is moved).

    Example:
        >>> set_alias("main.ml.digits", "champion", run.info.run_id)  # doctest: +SKIP
        'models:/main.ml.digits@champion'
    """
    from mlflow.tracking import MlflowClient

    check_model_alias(alias)
    client = MlflowClient()
    versions = client.search_model_versions(f"name='{name}' and run_id='{run_id}'")
    if not versions:
        raise LookupError(
            f"run {run_id} registered no version of {name!r}, so alias {alias!r} was not moved: "
            f"train with registered_model_name={name!r}"
        )
    newest = max(versions, key=lambda v: int(v.version))
    client.set_registered_model_alias(name, alias, newest.version)
    return f"models:/{name}@{alias}"


def pin(model_uri: str) -> tuple[str, str | None]:
    """``(uri, run id)``: an alias resolved to the version it names now (``models:/n/3``), with
    the run that logged the model; a ``runs:/`` URI with its run; anything else as given.

    Example:
        >>> pin("runs:/0a1b/model")
        ('runs:/0a1b/model', '0a1b')
    """
    if model_uri.startswith("runs:/"):
        return model_uri, model_uri[len("runs:/") :].split("/", 1)[0]
    match = _MODELS_URI.match(model_uri)
    if match is None:
        return model_uri, None
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    name = match["name"]
    if match["alias"]:
        version = client.get_model_version_by_alias(name, match["alias"])
    else:
        version = client.get_model_version(name, match["version"])
    return f"models:/{name}/{version.version}", version.run_id


def registry_for(name: str | None, alias: str | None = None) -> None:
    """Before training: refuse a model name or alias the registry would refuse, and on
    Databricks send a three-level name to Unity Catalog where MLflow 2 (15.4 LTS ML) still
    defaults to the workspace registry, which rejects such names after training.

    Raises:
        ValueError: naming ``registered_model_name`` or ``model_alias`` and the fix.

    Example:
        >>> registry_for("main.ml.digits", "champion")  # doctest: +SKIP
    """
    import mlflow

    if alias is not None:
        check_model_alias(alias)
    if name is None:
        return
    if is_unity_catalog_name(name) and is_workspace_registry(mlflow.get_registry_uri() or ""):
        mlflow.set_registry_uri("databricks-uc")
    check_registered_model_name(name)
