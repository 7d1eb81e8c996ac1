"""Cache/checkpoint locations: one user-facing string → (Spark URL, local file path).

Databricks exposes DBFS through a FUSE mount at ``/dbfs`` and Unity Catalog volumes at
``/Volumes``; Spark wants ``dbfs:/`` URLs, Python file APIs want the FUSE paths. Ranks read
with Python file APIs, so every location must have a local path.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from urllib.parse import urlparse


def on_databricks() -> bool:
    """Whether this process runs on a Databricks cluster (its runtime sets the variable)."""
    return "DATABRICKS_RUNTIME_VERSION" in os.environ


@dataclass(frozen=True)
class Location:
    """Where data lives: ``spark_url`` for Spark writers, ``local_path`` for file APIs."""

    spark_url: str
    local_path: str
    shared: bool  # visible from every node of a multi-node cluster

    def join(self, *parts: str) -> Location:
        return Location(
            "/".join([self.spark_url.rstrip("/"), *parts]),
            os.path.join(self.local_path, *parts),
            self.shared,
        )


def resolve(path: str) -> Location:
    """Normalize ``dbfs:/x``, ``/dbfs/x``, ``file:/dbfs/x``, ``/Volumes/...``, ``file:///x``, ``x``.

    Raises:
        ValueError: for schemes ranks cannot read through a local path (s3://, abfss://, ...).

    Example:
        >>> resolve("dbfs:/tmp/cache")
        Location(spark_url='dbfs:/tmp/cache', local_path='/dbfs/tmp/cache', shared=True)
    """
    if not isinstance(path, str) or not path.strip():
        raise ValueError(f"a path must be a non-empty string, got {path!r}")
    path = path.strip()
    parsed = urlparse(path)
    scheme = parsed.scheme.lower()
    if scheme == "dbfs":
        rel = "/" + parsed.path.lstrip("/")
        if rel.startswith("/Volumes/"):
            return Location(rel, rel, True)
        return Location(f"dbfs:{rel}", f"/dbfs{rel}", True)
    if scheme == "file":
        path = parsed.path
    elif scheme:
        raise ValueError(
            f"{path!r}: scheme {scheme}:// is not readable by the ranks as a file path. Use a "
            f"DBFS path (dbfs:/... or /dbfs/...), a Unity Catalog volume (/Volumes/...), or a "
            f"local directory."
        )
    path = os.path.abspath(path)
    if path == "/dbfs" or path.startswith("/dbfs/"):
        rel = path[len("/dbfs") :] or "/"
        return Location(f"dbfs:{rel}", path, True)
    if path.startswith("/Volumes/"):
        return Location(path, path, True)
    return Location(f"file://{path}", path, False)


#: Where Unity Catalog volumes are mounted on a Databricks node.
VOLUMES_MOUNT = "/Volumes"
#: Catalogs that cannot hold a volume: the legacy Hive metastore, a workspace's default
#: catalog where Unity Catalog is not the default (``CREATE VOLUME`` fails there).
NO_VOLUME_CATALOGS = ("hive_metastore", "spark_catalog")


def require_volumes(local_path: str) -> None:
    """Refuse a ``/Volumes/...`` path where no volume mount exists (off Databricks), or in a
    volume that does not exist (naming the statement that creates it).

    Otherwise a local run as root would quietly create ``/Volumes/...`` on the root disk.

    Raises:
        ValueError: naming the path and the fix.

    Example:
        >>> require_volumes("/tmp/cache")  # not a volume: nothing to check
    """
    if not local_path.startswith(VOLUMES_MOUNT + "/"):
        return
    if not os.path.isdir(VOLUMES_MOUNT):
        raise ValueError(
            f"{local_path!r} is a Unity Catalog volume path, but this machine has no /Volumes "
            f"mount (volumes exist on Databricks clusters): pass a local directory, e.g. "
            f"--param output_dir=.hvdrunner/data, or run on Databricks"
        )
    names = local_path[len(VOLUMES_MOUNT) + 1 :].split("/")[:3]
    if len(names) == 3 and not os.path.isdir(os.path.join(VOLUMES_MOUNT, *names)):
        catalog, schema, volume = names
        elsewhere = (
            f"if the volume is in another catalog and schema (the README's `databricks volumes "
            f"create <catalog> <schema> {volume} MANAGED`), run `USE CATALOG <catalog>` and "
            f"`USE SCHEMA <schema>` in a SQL cell first, or set the folder to a volume you can write"
        )
        if catalog in NO_VOLUME_CATALOGS:
            raise ValueError(
                f"{local_path!r} is in catalog {catalog}, the workspace's legacy Hive metastore, "
                f"which has no volumes (they exist only in Unity Catalog): {elsewhere}"
            )
        raise ValueError(
            f"{local_path!r} is in the volume {catalog}.{schema}.{volume}, which does not exist: "
            f"{elsewhere}; or create it once (SQL: CREATE VOLUME {catalog}.{schema}.{volume}; or "
            f"`databricks volumes create {catalog} {schema} {volume} MANAGED`)"
        )


def ensure_writable(local_path: str) -> None:
    """Create ``local_path`` (a directory) and prove it writable with a probe file.

    Raises:
        ValueError: a ``/Volumes`` path where volumes do not exist.
        OSError: it cannot be created or written (the caller words the fix).
    """
    require_volumes(local_path)
    os.makedirs(local_path, exist_ok=True)
    probe = os.path.join(local_path, f".hvdrunner-probe-{uuid.uuid4().hex}")
    with open(probe, "w") as f:
        f.write("ok")
    os.remove(probe)


def for_ranks(path: str, master: str, shared: bool, argument: str) -> Location:
    """``path`` resolved and proven writable, where every rank of a job on ``master`` can read
    it: refused when it is local to each machine and the ranks run on other nodes (unless
    declared ``shared``). ``argument`` names the path in the errors.

    Raises:
        ValueError: the path cannot be seen by the ranks, or cannot be written.

    Example:
        >>> for_ranks("/Volumes/<catalog>/<schema>/hvdrunner/mds", "spark://h:7077", False, "path").shared  # doctest: +SKIP
        True
    """
    loc = resolve(path)
    if not master.startswith("local") and not loc.shared and not shared:
        raise ValueError(
            f"{argument}={path!r} looks local to each machine, but master {master!r} runs "
            f"ranks on other nodes, which would not see the files. On Databricks use "
            f"dbfs:/..., /dbfs/... or /Volumes/<catalog>/<schema>/<volume>/...; on another "
            f"cluster put it on a mount every node sees at the same path (NFS, a FUSE-mounted "
            f"bucket) and pass shared=True (each rank then checks it can see the files)."
        )
    try:
        ensure_writable(loc.local_path)
    except OSError as exc:
        raise ValueError(
            f"{argument}={path!r} is not writable ({exc.strerror or exc}). Pass a "
            f"directory you can write to."
        ) from exc
    return loc
