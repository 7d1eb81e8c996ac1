"""Remember one target's bundle variables for every later shell: the cloud's GPU node type
(one choice: aws, azure or gcp) and where the volume lives, written to
``.databricks/bundle/<target>/variable-overrides.json`` - the file the Databricks CLI reads for
that target, after ``--var`` and ``BUNDLE_VAR_*`` and before databricks.yml's own values.
Values already in the file are kept unless given again. Standard library only: it runs where
``databricks bundle deploy`` runs.

    python scripts/bundle_vars.py --target dev --cloud azure --catalog ml --schema team_a
    python scripts/bundle_vars.py --target prod --cloud aws --catalog ml --schema team_a \\
        --set service_principal=<application-id> --set notify=ml-team@example.com
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Per cloud, the training clusters' node type (driver and workers: a GPU ML runtime takes
#: GPU instance types for both), one GPU each: databricks.yml's default is AWS's.
PRESETS: dict[str, dict[str, str]] = {
    "aws": {"node_type_id": "g5.xlarge"},  # NVIDIA A10G, 24 GB
    "azure": {"node_type_id": "Standard_NC4as_T4_v3"},  # NVIDIA T4, 16 GB
    "gcp": {"node_type_id": "g2-standard-4"},  # NVIDIA L4, 24 GB
}


def overrides_file(root: Path, target: str) -> Path:
    """Where the CLI looks for ``target``'s remembered variables."""
    return root / ".databricks" / "bundle" / target / "variable-overrides.json"


def declared(root: Path) -> tuple[set[str], set[str]]:
    """The variable names databricks.yml declares, and its target names (read without YAML:
    a top-level ``variables:``/``targets:`` block's two-space keys)."""
    blocks: dict[str, set[str]] = {"variables": set(), "targets": set()}
    current = None
    for line in (root / "databricks.yml").read_text().splitlines():
        top = re.match(r"^(\w+):", line)
        if top:
            current = top[1] if top[1] in blocks else None
        elif current and (key := re.match(r"^  (\w+):", line)):
            blocks[current].add(key[1])
    return blocks["variables"], blocks["targets"]


def write(root: Path, target: str, cloud: str, values: dict[str, str]) -> Path:
    """Merge the cloud's preset and ``values`` into ``target``'s file; its path.

    Raises:
        ValueError: an unknown cloud, target or variable, naming the choices.
    """
    if cloud not in PRESETS:
        raise ValueError(f"--cloud {cloud!r}: one of {', '.join(sorted(PRESETS))}")
    variables, targets = declared(root)
    if target not in targets:
        raise ValueError(f"--target {target!r}: databricks.yml's targets are {sorted(targets)}")
    chosen = {**PRESETS[cloud], **values}
    unknown = sorted(set(chosen) - variables)
    if unknown:
        raise ValueError(f"{unknown}: not variables of databricks.yml ({sorted(variables)})")
    path = overrides_file(root, target)
    current = json.loads(path.read_text()) if path.is_file() else {}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**current, **chosen}, indent=2, sort_keys=True) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="dev", help="the bundle target (default: dev)")
    parser.add_argument("--cloud", required=True, choices=sorted(PRESETS))
    parser.add_argument("--catalog", required=True, help="Unity Catalog catalog of the volume")
    parser.add_argument("--schema", required=True, help="schema of the volume in that catalog")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="any other variable of databricks.yml (repeatable)")  # fmt: skip
    args = parser.parse_args(argv)
    values = {"catalog": args.catalog, "schema": args.schema}
    for item in args.set:
        name, sep, value = item.partition("=")
        if not sep or not name:
            parser.error(f"--set {item!r}: expected NAME=VALUE")
        values[name] = value
    try:
        path = write(ROOT, args.target, args.cloud, values)
    except ValueError as exc:
        parser.error(str(exc))
    print(f"{path.relative_to(ROOT)}: {json.loads(path.read_text())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
