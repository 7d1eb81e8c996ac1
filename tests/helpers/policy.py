"""A compute policy applied to a job cluster, as Databricks applies one (the "Compute policy
reference": one limitation per attribute path, nested fields joined by dots, attributes the
policy does not name unlimited; a regex is anchored at both ends; a limited attribute that
the cluster leaves out is refused unless it is optional or has a default, except a fixed one,
which the policy sets). ``cluster_type`` is the virtual attribute a job cluster reads as
``job``. Used by the workspace stand-in (tests/helpers/standin.py) for ``policy_id``."""

from __future__ import annotations

import re
from typing import Any

MISSING = object()


def _value(cluster: dict[str, Any], path: str) -> Any:
    if path == "cluster_type":
        return "job"  # every cluster of the bundle is a job's new_cluster
    node: Any = cluster
    for i, part in enumerate(path.split(".")):
        if not isinstance(node, dict):
            return MISSING
        # spark_conf.spark.task.resource.gpu.amount: a map key may itself hold dots
        rest = ".".join(path.split(".")[i:])
        if rest in node:
            return node[rest]
        if part not in node:
            return MISSING
        node = node[part]
    return node


def _violation(rule: dict[str, Any], value: Any) -> str | None:
    kind = rule["type"]
    if kind == "fixed":
        return None if str(value) == str(rule["value"]) else f"must be {rule['value']!r}"
    if kind == "forbidden":
        return "is forbidden"
    if kind == "allowlist":
        return None if value in rule["values"] else f"must be one of {rule['values']}"
    if kind == "blocklist":
        return f"may not be one of {rule['values']}" if value in rule["values"] else None
    if kind == "regex":
        ok = re.fullmatch(rule["pattern"], str(value))
        return None if ok else f"must match {rule['pattern']!r}"
    if kind == "range":
        low, high = rule.get("minValue", float("-inf")), rule.get("maxValue", float("inf"))
        return None if low <= float(value) <= high else f"must be in [{low}, {high}]"
    if kind == "unlimited":
        return None
    raise ValueError(f"a limitation type the stand-in does not know: {kind}")


def problems(cluster: dict[str, Any], definition: dict[str, dict[str, Any]]) -> list[str]:
    """What the policy ``definition`` refuses in a resolved ``new_cluster``; [] if nothing."""
    out = []
    for path, rule in definition.items():
        value = _value(cluster, path)
        if value is MISSING:
            optional = rule.get("isOptional") or "defaultValue" in rule
            if rule["type"] not in ("fixed", "forbidden", "unlimited") and not optional:
                out.append(f"{path}: the policy requires a value")
            continue
        why = _violation(rule, value)
        if why:
            out.append(f"{path} {value!r} {why}")
    return out
