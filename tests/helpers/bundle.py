"""The bundle as the Databricks CLI sees it for one target, resolved here without a workspace.

A port of the CLI mutators that decide the values that matter (databricks/cli, bundle/config/
mutator/): includes and target overrides merged (maps merged, sequences concatenated, job
tasks merged by ``task_key``, job clusters by ``job_cluster_key``: libs/dyn/merge/merge.go,
merge_job_tasks.go, merge_job_clusters.go), the default
workspace root ``~/.bundle/<name>/<target>`` expanded to ``/Users/<user>/...``
(default_workspace_root.go, expand_workspace_root.go) and prefixed with ``/Workspace``
(prepend_workspace_prefix.go), ``file_path`` = root + ``/files`` (default_workspace_paths.go),
``/Workspace/${workspace.file_path}`` rewritten to ``${workspace.file_path}`` - with the slash
only (rewrite_workspace_prefix.go) - then ``${...}`` references resolved. ``mode_diagnostics``
ports resourcemutator/validate_target_mode.go. No CLI binary exists here (not on PyPI).
"""

from __future__ import annotations

import copy
import glob
import json
import re
from pathlib import Path
from typing import Any

import yaml

REF = re.compile(r"\$\{([a-zA-Z0-9_.\[\]-]+)\}")
WORKSPACE_KEYS = ("root_path", "file_path", "artifact_path", "state_path", "resource_path")
#: GPU instance families by cloud (AWS g4dn/g5/g6/p3/p4d/p5, Azure NC/ND/NV, GCP a2/a3/g2):
#: Databricks' GPU-enabled compute takes only these for driver and workers on a GPU runtime.
GPU_NODE = re.compile(r"^(?:(?:g4dn|g5|g6|g6e|p3|p4d|p4de|p5)\.|Standard_N[CDV]|(?:a2|a3|g2)-)")
DEFAULT_LEAVES = {  # default_workspace_paths.go
    "file_path": "files", "artifact_path": "artifacts", "state_path": "state",
    "resource_path": "resources",
}  # fmt: skip


def merge(a: Any, b: Any) -> Any:
    """The CLI's merge: b's map entries win, sequences concatenate, nil yields the other."""
    if a is None:
        return copy.deepcopy(b)
    if b is None:
        return copy.deepcopy(a)
    if isinstance(a, dict) and isinstance(b, dict):
        out = copy.deepcopy(a)
        for key, value in b.items():
            out[key] = merge(out[key], value) if key in out else copy.deepcopy(value)
        return out
    if isinstance(a, list) and isinstance(b, list):
        return copy.deepcopy(a) + copy.deepcopy(b)
    return copy.deepcopy(b)


def _merge_tasks(config: dict[str, Any]) -> None:
    for job in config.get("resources", {}).get("jobs", {}).values():
        for field, key_name in (("tasks", "task_key"), ("job_clusters", "job_cluster_key")):
            merged: dict[str, Any] = {}
            for item in job.get(field, []):
                key = item[key_name]
                merged[key] = merge(merged[key], item) if key in merged else item
            if field in job:
                job[field] = list(merged.values())


def load(root: Path) -> dict[str, Any]:
    """databricks.yml with its include files merged in."""
    config = yaml.safe_load((root / "databricks.yml").read_text())
    for pattern in config.get("include", []):
        for path in sorted(glob.glob(str(root / pattern))):
            config = merge(config, yaml.safe_load(Path(path).read_text()))
    return config


def short_name(user: str) -> str:
    """``${workspace.current_user.short_name}``: the user name before @, non-alnum as _."""
    return re.sub(r"[^a-z0-9]", "_", user.split("@")[0].lower())


class RequiredVariable(KeyError):
    """A variable with no default and no value: ``bundle validate`` stops on it."""


def select(
    config: dict[str, Any], target: str | None, user: str, values: dict[str, str] | None = None,
    remembered: dict[str, Any] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The config of one target (the default one if None) before references are resolved;
    ``values`` are ``--var name=value``, ``remembered`` the target's variable-overrides.json:
    --var wins over the file, the file over the target's values and the defaults (the CLI's
    SetVariables: a value, then BUNDLE_VAR_*, then the file, then the default)."""
    targets = config.get("targets", {})
    if target is None:
        target = next(name for name, t in targets.items() if t.get("default"))
    chosen = targets[target]
    out = {k: copy.deepcopy(v) for k, v in config.items() if k != "targets"}
    for key in ("resources", "workspace", "artifacts", "run_as", "permissions", "presets"):
        if key in chosen:
            out[key] = merge(out.get(key), chosen[key])
    for name, value in chosen.get("variables", {}).items():
        default = value.get("default") if isinstance(value, dict) else value
        out["variables"][name]["default"] = default
    for name, value in {**(remembered or {}), **(values or {})}.items():
        if name not in out["variables"]:
            raise KeyError(f"variable {name!r} is not defined in databricks.yml")
        out["variables"][name]["default"] = value
    out["bundle"] = dict(out["bundle"], target=target, mode=chosen.get("mode", ""))
    out["_explicit_root"] = bool(chosen.get("workspace", {}).get("root_path"))
    workspace = out.setdefault("workspace", {})
    workspace["current_user"] = {"userName": user, "short_name": short_name(user)}
    root = workspace.get("root_path") or f"~/.bundle/{out['bundle']['name']}/{target}"
    if root.startswith("~/"):
        root = f"/Users/{user}/{root[2:]}"
    workspace["root_path"] = root
    for key, leaf in DEFAULT_LEAVES.items():
        workspace.setdefault(key, f"{root}/{leaf}")
    for key in WORKSPACE_KEYS:
        path = workspace[key]
        if path.startswith("/") and not path.startswith(("/Workspace/", "/Volumes/")):
            workspace[key] = "/Workspace" + path
    _merge_tasks(out)
    return out


def _rewrite_prefix(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _rewrite_prefix(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rewrite_prefix(v) for v in value]
    if isinstance(value, str) and any(
        f"/Workspace/${{workspace.{k}}}" in value for k in WORKSPACE_KEYS[:4]
    ):
        return value.replace("/Workspace/", "")
    return value


def _lookup(config: dict[str, Any], ref: str) -> Any:
    if ref.startswith("var."):
        value = config["variables"][ref[4:]].get("default")
        if value is None:  # the CLI: "no value assigned to required variable"
            raise RequiredVariable(f"no value assigned to required variable {ref[4:]}")
        return value
    node: Any = config
    for part in ref.split("."):
        node = node[part]
    return node


def resolve(config: dict[str, Any]) -> dict[str, Any]:
    """Every ``${...}`` replaced, as after ``bundle validate`` (KeyError on an unknown one)."""
    config = _rewrite_prefix(config)

    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        if not isinstance(value, str):
            return value
        for _ in range(10):  # references to references
            whole = REF.fullmatch(value)
            if whole:
                value = _lookup(config, whole.group(1))
                if not isinstance(value, str):
                    return walk(value)
                continue
            new = REF.sub(lambda m: str(_lookup(config, m.group(1))), value)
            if new == value:
                break
            value = new
        return value

    return walk(config)


def target(
    root: Path, name: str | None, user: str = "someone@example.com",
    values: dict[str, str] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """``load`` + ``select`` + ``resolve``: the bundle as deployed to target ``name``, with the
    target's ``.databricks/bundle/<target>/variable-overrides.json`` under ``root`` read as the
    CLI reads it."""
    config = load(root)
    chosen = name or next(n for n, t in config["targets"].items() if t.get("default"))
    path = root / ".databricks" / "bundle" / chosen / "variable-overrides.json"
    remembered = json.loads(path.read_text()) if path.is_file() else None
    return resolve(select(config, chosen, user, values, remembered))


def mode_diagnostics(
    config: dict[str, Any], service_principal: bool = False
) -> list[tuple[str, str]]:
    """(severity, summary) of validate_target_mode.go for a selected, resolved config."""
    mode = config["bundle"]["mode"]
    workspace = config["workspace"]
    user = workspace["current_user"]
    if mode == "development":
        for key in WORKSPACE_KEYS:
            path = workspace[key]
            if user["userName"] not in path and user["short_name"] not in path:
                return [("error", f"{key} must start with '~/' or contain the current username")]
        return []
    if mode == "production" and not config["_explicit_root"]:
        jobs = config.get("resources", {}).get("jobs", {}).values()
        # The run_as mutator has copied a bundle-level run_as into every job by then.
        if service_principal or config.get("run_as") or all(job.get("run_as") for job in jobs):
            return [
                (
                    "recommendation",
                    "target with 'mode: production' should set 'workspace.root_path'",
                )
            ]
        return [("error", "target with 'mode: production' must set 'workspace.root_path'")]
    return []


def run_as_problems(config: dict[str, Any]) -> list[str]:
    """run_as's identity rule (bundle/config/mutator/resourcemutator/run_as.go): one of
    service_principal_name and user_name, not both, not neither (an empty value is none)."""
    run_as = config.get("run_as")
    if run_as is None:
        return []
    names = [k for k in ("service_principal_name", "user_name") if run_as.get(k)]
    if not names:
        return [
            "run_as section must specify exactly one identity. Neither service_principal_name "
            "nor user_name is specified"
        ]
    if len(names) == 2:
        return ["run_as section cannot specify both service_principal_name and user_name"]
    return []


def run_problems(config: dict[str, Any], target: str, command: str) -> list[str]:
    """What ``databricks bundle run`` says of ``command`` for this resolved config: the ports
    of bundle/run/job_options.go (Validate: job parameters and task parameters exclude each
    other) and job_args.go (``-- --key value`` after a job with job parameters), plus the Jobs
    API's refusal of an undeclared job parameter. [] when it would start the run."""
    import shlex

    words = shlex.split(command, comments=True)
    if words[:3] != ["databricks", "bundle", "run"]:
        return [f"not a bundle run command: {command!r}"]
    words, problems = words[3:], []
    key, params, task_flags, rest = None, {}, [], []
    while words:
        word = words.pop(0)
        if word == "--":
            rest, words = words, []
        elif word in ("-t", "--target"):
            if words.pop(0) != target:
                problems.append(f"{command!r} names another target than {target}")
        elif word == "--var" or word.startswith("--var="):  # the bundle commands' own flag
            pair = word.split("=", 1)[1] if word.startswith("--var=") else words.pop(0)
            name, sep, _ = pair.partition("=")
            if not sep:
                return [f"unexpected flag format {pair!r}, expected key=value"]
            if name not in config.get("variables", {}):
                return [f"variable {name} has not been defined"]
        elif word == "--params" or word.startswith("--params="):
            value = word.split("=", 1)[1] if "=" in word else words.pop(0)
            for pair in value.split(","):
                if "=" not in pair:
                    return [
                        f"invalid argument {value!r} for --params: {pair!r} must be formatted as key=value"
                    ]
                k, v = pair.split("=", 1)
                params[k] = v
        elif word.startswith("--") and word.split("=")[0] in (
            "--notebook-params", "--python-params", "--jar-params", "--python-named-params",
            "--spark-submit-params", "--sql-params", "--dbt-commands", "--pipeline-params",
        ):  # fmt: skip
            task_flags.append(word)
            if "=" not in word:
                words.pop(0)
        elif word.startswith("-"):
            return [f"unknown flag: {word}"]
        elif key is None:
            key = word
        else:
            return [f"unexpected argument {word!r}"]
    jobs = config.get("resources", {}).get("jobs", {})
    if key not in jobs:
        return [f"no such resource: {key}"]
    declared = {p["name"] for p in jobs[key].get("parameters", [])}
    if declared and rest:
        while rest:  # job_args.go: --key value pairs become job parameters
            flag = rest.pop(0)
            if not flag.startswith("--") or not rest:
                return [f"unexpected positional arguments after --: {flag!r}"]
            params[flag[2:]] = rest.pop(0)
    if declared and task_flags:
        problems.append(
            "the job to run defines job parameters; specifying task parameters is not allowed"
        )
    if not declared and params:
        problems.append(
            "the job to run does not define job parameters; specifying job parameters is not allowed"
        )
    problems += [
        f"job parameter {k!r} is not defined by {key}"
        for k in params
        if declared and k not in declared
    ]
    return problems


def cluster_problems(cluster: dict[str, Any]) -> list[str]:
    """What a workspace refuses in a resolved ``new_cluster`` on a GPU ML runtime: a driver or
    worker type that is not a GPU instance type (Databricks, "GPU-enabled compute"); [] if
    nothing. Without ``driver_node_type_id`` the driver is a node of ``node_type_id``."""
    if "-gpu-ml-" not in str(cluster.get("spark_version", "")):
        return []
    return [
        f"{key} {cluster[key]!r} is not a GPU instance type: a GPU runtime needs GPU driver "
        "and worker types"
        for key in ("node_type_id", "driver_node_type_id")
        if key in cluster and not GPU_NODE.match(str(cluster[key]))
    ]
