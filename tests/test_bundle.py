"""The asset bundle, per target, as the Databricks CLI resolves it (tests/helpers/bundle.py
ports the CLI mutators that matter; no workspace or CLI binary exists here): the official
schema, the CLI's target-mode rules, the paths the jobs receive, the horovod wheel that the
build job writes and the training job installs, and the artifact build."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers import bundle

ROOT = Path(__file__).resolve().parents[1]
VALIDATOR = ROOT.parent / "shared" / "tools" / "validate_bundle.py"
TARGETS = ("dev", "lts", "prod")
USER = "first.last@example.com"
WHEEL = re.compile(r"horovod-0\.28\.1-(cp3\d+)-\1-linux_x86_64\.whl")


def _resolved(name: str) -> dict:
    return bundle.target(ROOT, name, USER)


def _strings(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)
    elif isinstance(value, str):
        yield value


def _job(config: dict, name: str) -> dict:
    return config["resources"]["jobs"][name]


def _task(job: dict, key: str) -> dict:
    return next(t for t in job["tasks"] if t["task_key"] == key)


def test_bundle_against_official_schema():
    if not VALIDATOR.exists():
        if os.environ.get("CI"):
            pytest.fail(f"CI must validate the bundle: {VALIDATOR} is missing")
        pytest.skip("../shared/tools/validate_bundle.py is not beside this checkout")
    proc = subprocess.run(
        [sys.executable, str(VALIDATOR), str(ROOT)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("name", TARGETS)
def test_every_target_resolves_and_passes_the_clis_mode_rules(name):
    config = _resolved(name)
    assert bundle.mode_diagnostics(config) == []
    for text in _strings(config["resources"]):
        assert "${" not in text, f"unresolved reference in {text!r}"
        assert "/Workspace/Workspace" not in text, text
    assert config["workspace"]["file_path"] == (
        f"/Workspace/Users/{USER}/.bundle/hvdrunner/{name}/files"
    )


def test_the_helper_catches_the_doubled_workspace_prefix_and_the_prod_root_rule():
    # What the bundle had before: /Workspace${workspace.file_path} is not rewritten by the
    # CLI (its rewrite needs the slash), so the path doubles; /Workspace/${...} is rewritten.
    config = bundle.select(bundle.load(ROOT), "dev", USER)
    config["resources"]["x"] = [
        "/Workspace${workspace.file_path}",
        "/Workspace/${workspace.file_path}",
    ]
    doubled, rewritten = bundle.resolve(config)["resources"]["x"]
    assert doubled.startswith("/Workspace/Workspace/Users/")
    assert rewritten == f"/Workspace/Users/{USER}/.bundle/hvdrunner/dev/files"
    raw = bundle.load(ROOT)
    del raw["targets"]["prod"]["workspace"]
    prod = bundle.resolve(bundle.select(raw, "prod", USER))
    assert bundle.mode_diagnostics(prod)[0][0] == "error"
    assert bundle.mode_diagnostics(prod, service_principal=True)[0][0] == "recommendation"


def test_the_default_target_is_the_newest_lts_ml_gpu_runtime():
    raw = bundle.load(ROOT)
    assert [n for n, t in raw["targets"].items() if t.get("default")] == ["dev"]
    dev, lts = _resolved("dev"), _resolved("lts")
    assert dev["variables"]["spark_version"]["default"].startswith("18.")
    assert "-gpu-ml-" in dev["variables"]["spark_version"]["default"]
    assert lts["variables"]["spark_version"]["default"] == "15.4.x-gpu-ml-scala2.12"


@pytest.mark.parametrize("name", TARGETS)
def test_the_training_job_installs_the_wheel_the_build_job_writes(name):
    config = _resolved(name)
    variables = {k: v["default"] for k, v in config["variables"].items()}
    build = _task(_job(config, "hvdrunner_build_horovod"), "build_horovod")
    params = build["spark_python_task"]["parameters"]
    assert params[params.index("--src") + 1] == config["workspace"]["file_path"]
    out = params[params.index("--out") + 1]
    assert out == f"{variables['wheel_dir']}/{variables['spark_version']}"
    assert out.startswith("/Volumes/")
    for job, task_key in (
        ("hvdrunner_train", "train_keras"),
        ("hvdrunner_train_torch", "train_torch"),
    ):
        train = _job(config, job)
        cluster = train["job_clusters"][0]["new_cluster"]
        assert "init_scripts" not in cluster  # nothing installs at cluster start any more
        assert cluster["single_user_name"] == variables["cluster_user"] == USER
        libs = [lib["whl"] for lib in _task(train, task_key)["libraries"]]
        horovod = [lib for lib in libs if "horovod" in lib]
        if name == "lts":
            # 15.4 LTS ML ships horovod 0.28.1; pip skips a wheel of the same version, so
            # attaching ours would silently keep theirs: lts keeps it on purpose.
            assert horovod == []
        else:
            (wheel,) = horovod  # the one wheel, built against the runtime's TF and torch
            assert os.path.dirname(wheel) == out
            match = WHEEL.fullmatch(os.path.basename(wheel))
            assert match and match.group(1) == variables["python_tag"]
        for task in train["tasks"]:
            assert {"whl": "../dist/hvdrunner-*.whl"} in task["libraries"]


def test_production_identity_and_node_types_are_variables():
    raw = bundle.load(ROOT)
    assert raw["targets"]["prod"]["workspace"]["root_path"].startswith("/Workspace/Users/")
    text = (ROOT / "databricks.yml").read_text()
    for cloud_node in ("g5.xlarge", "Standard_NC4as_T4_v3", "g2-standard-4"):
        assert cloud_node in text  # AWS, Azure, GCP documented beside the variable
    for path in (ROOT / "resources").glob("*.yml"):
        doc = yaml.safe_load(path.read_text())
        for job in doc["resources"]["jobs"].values():
            for cluster in job["job_clusters"]:
                assert cluster["new_cluster"]["node_type_id"] == "${var.node_type_id}"
                assert cluster["new_cluster"]["single_user_name"] == "${var.cluster_user}"


def test_the_artifact_build_empties_dist_first(tmp_path):
    raw = bundle.load(ROOT)
    artifact = raw["artifacts"]["hvdrunner_wheel"]
    assert artifact["build"] == "python scripts/build_wheel.py"
    assert artifact["files"] == [{"source": "dist/hvdrunner-*.whl"}]
    dist = ROOT / "dist"
    dist.mkdir(exist_ok=True)
    stale = dist / "hvdrunner-0.0.1-py3-none-any.whl"
    stale.write_bytes(b"stale")
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "build_wheel.py")],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    wheels = sorted(p.name for p in dist.iterdir())
    assert not stale.exists() and len(wheels) == 1 and wheels[0].startswith("hvdrunner-")
