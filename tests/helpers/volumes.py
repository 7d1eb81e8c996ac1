"""Unity Catalog volumes as the workspace stand-in keeps them (tests/helpers/standin.py): who
owns each volume, its grants, and which bundle deployment made it. One JSON file under the
stand-in's folder, so several ``StandIn`` on one folder (two members, dev and prod) share one
metastore, as a team shares one.

The rules, as Unity Catalog applies them to volume files: the owner may read and write; anyone
else needs ``READ_VOLUME`` to read and ``WRITE_VOLUME`` to write, granted to them or to a group
they are in. Every identity of the stand-in is in the account-level group ``account users``
(Unity Catalog takes account groups only). A bundle deployment that declares a volume creates
it; one that already exists outside that deployment's state stops the deploy, as Terraform's
create does, until ``bundle deployment bind`` adopts it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: The account-level group every identity of the stand-in is in.
EVERYONE = "account users"


class VolumeError(AssertionError):
    """A volume a task needs is missing, or its identity may not use it so."""


class Volumes:
    """The volumes of one stand-in metastore (``<folder>/metastore.json``)."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / "metastore.json"

    def _load(self) -> dict[str, dict[str, Any]]:
        return json.loads(self.path.read_text()) if self.path.exists() else {}

    def _save(self, volumes: dict[str, dict[str, Any]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(volumes, indent=1))

    def get(self, full_name: str) -> dict[str, Any] | None:
        return self._load().get(full_name)

    def create_by_hand(self, full_name: str, owner: str) -> bool:
        """``databricks volumes create``: False (nothing changed) if it exists."""
        volumes = self._load()
        if full_name in volumes:
            return False
        volumes[full_name] = {"owner": owner, "grants": {}, "deployment": None}
        self._save(volumes)
        return True

    def deploy(
        self, declared: dict[str, dict[str, Any]], owner: str, deployment: str, target: str
    ) -> None:
        """A deployment's ``resources.volumes``: created (owned by the deploying identity) or,
        if this deployment made or bound them, updated; their grants set as declared."""
        volumes = self._load()
        for key, spec in declared.items():
            full_name = f"{spec['catalog_name']}.{spec['schema_name']}.{spec['name']}"
            have = volumes.get(full_name)
            if have and have["deployment"] != [deployment, key]:
                raise VolumeError(
                    f"volumes.{key}: Volume '{full_name}' already exists (made outside this "
                    f"deployment); adopt it first: databricks bundle deployment bind {key} "
                    f"{full_name} -t {target}"
                )
            grants = {g["principal"]: sorted(g["privileges"]) for g in spec.get("grants", [])}
            if have and grants and have["owner"] != owner:
                # Granting on a securable takes its owner (or MANAGE): a bound volume made by
                # hand is the principal's only once its owner hands it over.
                raise VolumeError(
                    f"volumes.{key}: {owner} may not grant on {full_name} (owner "
                    f"{have['owner']}); its owner runs first: ALTER VOLUME {full_name} OWNER "
                    f"TO `{owner}`"
                )
            volumes[full_name] = {"owner": have["owner"] if have else owner, "grants": grants,
                                  "deployment": [deployment, key]}  # fmt: skip
        self._save(volumes)

    def bind(self, full_name: str, deployment: str, key: str) -> None:
        """``bundle deployment bind <key> <full_name>``: the deployment adopts the volume."""
        volumes = self._load()
        if full_name not in volumes:
            raise VolumeError(f"bind: volume {full_name} does not exist")
        volumes[full_name]["deployment"] = [deployment, key]
        self._save(volumes)

    def set_owner(self, full_name: str, owner: str) -> None:
        """``ALTER VOLUME <full_name> OWNER TO <owner>``."""
        volumes = self._load()
        volumes[full_name]["owner"] = owner
        self._save(volumes)

    def check(self, path: str, identity: str, write: bool) -> None:
        """May ``identity`` read (or write) ``/Volumes/<catalog>/<schema>/<volume>/...``?"""
        parts = path.split("/")
        if len(parts) < 5 or parts[1] != "Volumes":
            raise VolumeError(f"{path!r} is not a path in a volume")
        full_name = ".".join(parts[2:5])
        volume = self.get(full_name)
        if volume is None:
            raise VolumeError(f"{path}: volume {full_name} does not exist")
        if volume["owner"] == identity:
            return
        need = "WRITE_VOLUME" if write else "READ_VOLUME"
        for principal in (identity, EVERYONE):
            if need in volume["grants"].get(principal, []):
                return
        raise VolumeError(
            f"{path}: {identity} lacks {need} on volume {full_name} (owner {volume['owner']}; "
            f"granted: {volume['grants'] or 'nothing'})"
        )
