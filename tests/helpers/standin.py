"""A local stand-in for the Databricks workspace the bundle deploys to.

What it does, as the workspace would: the bundle for one target resolved as the CLI resolves it
(tests/helpers/bundle.py); ``deploy`` copies the repository's tracked files to the target's
``workspace.file_path`` and runs the artifact build there (``dist/hvdrunner-*.whl``); ``/Volumes``
and ``/Workspace`` are folders of a temporary directory (every path a task receives is mapped,
none is rewritten otherwise); ``run_job`` runs a job's tasks in dependency order - a
``spark_python_task`` as ``python <file> <parameters>``, a ``notebook_task`` after installing
its task libraries from the exact paths the task names into a fresh folder (``pip install
--target``, first on ``PYTHONPATH``: the installed wheels are what runs, not the checkout),
with its ``base_parameters`` as widgets, task values shared along the job, and the cluster's
``spark_env_vars``; ``{{job.run_id}}`` and ``{{job.parameters.*}}`` are filled in as the Jobs
service does. A cluster's ``policy_id`` is held to the policy's definition
(tests/helpers/policy.py). Unity Catalog's volumes keep owners and grants
(tests/helpers/volumes.py): a deploy creates the volumes its target declares, and a job whose
identity may not read a library or write a path it is given in a volume fails before its
first task.

What it cannot reach: a cluster (tasks run on ``local[2]`` of this machine, one Python for
every node), access modes and the UI, the Jobs service's own checks, the runtime's
``DATABRICKS_RUNTIME_VERSION`` (not set: hvdrunner would write Delta tables), GPUs, and
PyPI: a ``pypi`` library must already be satisfied by this environment (its version is
checked) - the stand-in downloads nothing.
"""

from __future__ import annotations

import glob
import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement

from helpers import bundle, policy
from helpers.repo_copy import copy_repository
from helpers.volumes import Volumes

ROOT = Path(__file__).resolve().parents[2]
RESOURCES = "resources"  # where the job files live: their relative paths start there
VOLUME_PATH = re.compile(r"(?<![\w/])/Volumes/\S*")


class StandInError(AssertionError):
    """A path, parameter or library of the bundle does not line up."""


class StandIn:
    """One target of the bundle, deployed to a temporary 'workspace' under ``tmp``."""

    def __init__(
        self, tmp: Path, target: str, values: dict[str, str], user: str,
        policies: dict[str, dict[str, Any]] | None = None,
    ) -> None:  # fmt: skip
        """``policies``: the workspace's compute policies, id -> definition."""
        self.tmp = tmp
        self.policies = policies or {}
        self.config = bundle.target(ROOT, target, user, values)
        self.vars = {k: v.get("default") for k, v in self.config["variables"].items()}
        self.files = self.map(self.config["workspace"]["file_path"])
        self.run_id = 0
        self.last = tmp
        self.user = user  # who deploys: a member, or (prod, from CI) the service principal
        run_as = self.config.get("run_as", {})
        self.identity = run_as.get("service_principal_name") or run_as.get("user_name") or user
        self.volumes = Volumes(tmp)
        if not self.config["resources"].get("volumes"):
            # docs/databricks.md's `databricks volumes create` (it says "already exists" if
            # prod's deploy, or a colleague, made the team's volume first).
            team = f"{values['catalog']}.{values['schema']}.{self.vars['volume']}"
            self.volumes.create_by_hand(team, owner=user)
            self.map("/Volumes/" + team.replace(".", "/")).mkdir(parents=True, exist_ok=True)

    def map(self, path: str) -> Path:
        """A workspace path (``/Volumes/...``, ``/Workspace/...``) as a folder of ``tmp``."""
        if not path.startswith(("/Volumes/", "/Workspace/")):
            raise StandInError(f"{path!r} is neither a volume nor a workspace path")
        return self.tmp / path.lstrip("/")

    def _value(self, text: str, job_params: dict[str, str]) -> str:
        text = text.replace("{{job.run_id}}", str(self.run_id))
        for name, value in job_params.items():
            text = text.replace(f"{{{{job.parameters.{name}}}}}", value)
        if "{{" in text:
            raise StandInError(f"{text!r}: a dynamic value reference the job does not define")
        return re.sub(r"(?<![\w/])/(?:Volumes|Workspace)/\S*", lambda m: str(self.map(m[0])), text)

    def deploy(self) -> None:
        """``bundle deploy``: the tracked files to file_path, then the artifact build there.
        A job cluster a workspace would refuse (bundle.cluster_problems) fails it first."""
        for name, job in self.config["resources"]["jobs"].items():
            for cluster in job.get("job_clusters", []):
                problems = bundle.cluster_problems(cluster["new_cluster"])
                problems += self.policy_problems(cluster["new_cluster"])
                if problems:
                    raise StandInError(f"{name}.{cluster['job_cluster_key']}: {problems}")
        self.deploy_volumes()
        copy_repository(self.files)
        build = self.config["artifacts"]["hvdrunner_wheel"]["build"].split()
        proc = subprocess.run([sys.executable, *build[1:]], cwd=self.files, capture_output=True,
                              text=True, timeout=300)  # fmt: skip
        if proc.returncode != 0:
            raise StandInError(f"artifact build failed: {proc.stdout}{proc.stderr}")

    def policy_problems(self, cluster: dict[str, Any]) -> list[str]:
        """What the compute policy the cluster names refuses (helpers/policy.py); an empty
        ``policy_id`` names none (the CLI leaves the field out)."""
        policy_id = cluster.get("policy_id")
        if not policy_id:
            return []
        if policy_id not in self.policies:
            return [f"policy_id {policy_id!r}: no such compute policy in the workspace"]
        return policy.problems(cluster, self.policies[policy_id])

    def deploy_volumes(self) -> None:
        """The volumes the target declares, made or updated with their grants as the
        deploying identity (the first part of ``deploy``; helpers/volumes.py)."""
        declared = self.config["resources"].get("volumes", {})
        self.volumes.deploy(declared, self.user, self.config["workspace"]["root_path"],
                            self.config["bundle"]["target"])  # fmt: skip
        for spec in declared.values():
            folder = f"/Volumes/{spec['catalog_name']}/{spec['schema_name']}/{spec['name']}"
            self.map(folder).mkdir(parents=True, exist_ok=True)

    def job(self, name: str) -> dict[str, Any]:
        return self.config["resources"]["jobs"][name]

    def check_access(self, name: str) -> None:
        """What Unity Catalog would refuse job ``name``'s identity (its run_as, else the
        deploying user), before any task starts: a task library in a volume needs READ VOLUME,
        a volume path among a task's parameters (data, cache, checkpoints, predictions, the
        build's output) WRITE VOLUME, unless the identity owns the volume (helpers/volumes.py)."""
        for task in self.job(name)["tasks"]:
            for lib in task.get("libraries", []):
                if lib.get("whl", "").startswith("/Volumes/"):
                    self.volumes.check(lib["whl"], self.identity, write=False)
            spec = task.get("notebook_task", {}).get("base_parameters", {}).values()
            args = task.get("spark_python_task", {}).get("parameters", [])
            for value in [*spec, *args]:
                for path in VOLUME_PATH.findall(str(value)):
                    self.volumes.check(path, self.identity, write=True)

    def _local(self, path: str) -> list[Path]:
        """A task's file or library path, as the deployed bundle holds it (relative to the
        job's file in resources/, a glob for the artifact)."""
        if path.startswith(("/Volumes/", "/Workspace/")):
            found = [self.map(path)]
        else:
            found = [Path(p) for p in glob.glob(str((self.files / origin(path) / path).resolve()))]
        if not found or not all(p.exists() for p in found):
            raise StandInError(f"{path!r}: nothing at {found or path} in the deployed workspace")
        return found

    def _libraries(self, libraries: list[dict[str, Any]], target: Path) -> None:
        for lib in libraries:
            if "whl" in lib:
                wheels = [str(p) for p in self._local(lib["whl"])]
                pip_install(wheels, target)
            elif "pypi" in lib:
                require_satisfied(lib["pypi"]["package"])
            else:
                raise StandInError(f"a library kind the stand-in does not know: {lib}")

    def run_job(self, name: str, params: dict[str, str] | None = None,
                env: dict[str, str] | None = None, timeout: float = 900,
                only: tuple[str, ...] = ()) -> dict[str, Any]:  # fmt: skip
        """Run job ``name`` (``params``: its job parameters, as ``--params``; ``only``: these
        tasks alone, as ``bundle run --only``); the task values it set. Raises StandInError
        naming the task that failed."""
        job = self.job(name)
        keys = {t["task_key"] for t in job["tasks"]}
        if set(only) - keys:
            raise StandInError(f"{name} has no task {sorted(set(only) - keys)}")
        self.check_access(name)
        # Run ids are the workspace's, unique across its deployments (a member's and prod's).
        runs = (int(d.name.rsplit("-", 1)[1]) for d in (self.tmp / "runs").glob("*-*"))
        self.run_id = 1 + max(runs, default=0)
        declared = {p["name"]: p.get("default", "") for p in job.get("parameters", [])}
        unknown = set(params or {}) - set(declared)
        if unknown:
            raise StandInError(f"{name} has no job parameter {sorted(unknown)}")
        job_params = {**declared, **(params or {})}
        run_dir = self.tmp / "runs" / f"{name}-{self.run_id}"
        run_dir.mkdir(parents=True)
        self.last = run_dir  # each task's output: <task_key>.log
        cluster_env = {}
        for cluster in job.get("job_clusters", []):
            cluster_env.update(cluster["new_cluster"].get("spark_env_vars", {}))
        values = run_dir / "task_values.json"
        for task in ordered(job["tasks"]):
            if only and task["task_key"] not in only:
                continue
            self._task(task, job_params, run_dir, values, {**(env or {}), **cluster_env}, timeout)
        return json.loads(values.read_text()) if values.exists() else {}

    def _task(self, task: dict[str, Any], job_params: dict[str, str], run_dir: Path,
              values: Path, env: dict[str, str], timeout: float) -> None:  # fmt: skip
        key = task["task_key"]
        libs = run_dir / f"libs-{key}"
        self._libraries(task.get("libraries", []), libs)
        full_env = {
            **os.environ,
            **env,
            "PYTHONPATH": os_pathsep(libs, os.environ.get("PYTHONPATH")),
        }
        full_env.pop("DATABRICKS_RUNTIME_VERSION", None)
        if "spark_python_task" in task:
            # What the task pip-installs goes to a folder of its own, never into the
            # environment under test (the build job installs and checks the horovod it built).
            site = run_dir / f"site-{key}"
            full_env.update(
                PIP_TARGET=str(site), PYTHONPATH=os_pathsep(site, full_env["PYTHONPATH"])
            )
            spec = task["spark_python_task"]
            (script,) = self._local(spec["python_file"])
            args = [self._value(a, job_params) for a in spec.get("parameters", [])]
            cmd = [sys.executable, str(script), *args]
        elif "notebook_task" in task:
            spec = task["notebook_task"]
            (notebook,) = self._local(spec["notebook_path"])
            cmd = [sys.executable, "-m", "hvdrunner.notebook", "run", str(notebook),
                   "--task-values", str(values)]  # fmt: skip
            for k, v in spec.get("base_parameters", {}).items():
                cmd += ["--param", f"{k}={self._value(v, job_params)}"]
        else:
            raise StandInError(f"{key}: a task kind the stand-in does not run")
        proc = subprocess.run(cmd, cwd=run_dir, env=full_env, capture_output=True, text=True,
                              timeout=timeout)  # fmt: skip
        (run_dir / f"{key}.log").write_text(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            raise StandInError(f"task {key} failed (exit {proc.returncode}):\n"
                               f"{proc.stdout[-3000:]}{proc.stderr[-3000:]}")  # fmt: skip


def origin(path: str) -> str:
    """The folder a relative path in the bundle is relative to: the CLI resolves it against
    the file that defines it (databricks.yml at the root, the job files in resources/)."""
    value = re.compile(rf"^\s*(?:-\s+)?(?:\w+:\s+)?{re.escape(path)}\s*(?:#.*)?$", re.M)
    where = {str(p.parent.relative_to(ROOT)) for p in [ROOT / "databricks.yml", *ROOT.glob(f"{RESOURCES}/*.yml")]
             if value.search(p.read_text())}  # fmt: skip
    if len(where) != 1:
        raise StandInError(f"{path!r} is defined in {sorted(where) or 'no bundle file'}")
    return where.pop()


def os_pathsep(first: Path, rest: str | None) -> str:
    return f"{first}{os.pathsep}{rest}" if rest else str(first)


def ordered(tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tasks in an order their ``depends_on`` allows (the Jobs service's DAG)."""
    done: list[str] = []
    left = list(tasks)
    while left:
        ready = [t for t in left if all(d["task_key"] in done for d in t.get("depends_on", []))]
        if not ready:
            raise StandInError(
                f"tasks depend on ones that do not exist: {[t['task_key'] for t in left]}"
            )
        for t in ready:
            done.append(t["task_key"])
            left.remove(t)
    return [next(t for t in tasks if t["task_key"] == k) for k in done]


def pip_install(wheels: list[str], target: Path) -> None:
    """``pip install --no-deps --target``: the wheel files, as a library install would."""
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                           "--no-index", "--target", str(target), *wheels],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    if proc.returncode != 0:
        raise StandInError(f"pip install {wheels} failed: {proc.stdout}{proc.stderr}")


def require_satisfied(spec: str) -> None:
    """A PyPI requirement the stand-in cannot download: this environment must satisfy it."""
    req = Requirement(spec)
    try:
        have = importlib.metadata.version(req.name)
    except importlib.metadata.PackageNotFoundError:
        raise StandInError(
            f"{spec}: not installed here, and the stand-in downloads nothing"
        ) from None
    if not req.specifier.contains(have, prereleases=True):
        raise StandInError(f"{spec}: this environment has {req.name} {have}")


def install_requirements(path: Path, target: Path) -> list[str]:
    """``%pip install -r path``: wheel paths installed into ``target``, pins checked against
    this environment; returns the pins."""
    wheels, pins = [], []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("/"):
            if not Path(line).exists():
                raise StandInError(f"{path} names {line}, which does not exist")
            wheels.append(line)
        else:
            require_satisfied(line)
            pins.append(line)
    pip_install(wheels, target)
    return pins
