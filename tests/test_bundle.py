"""The asset bundle, per target, as the Databricks CLI resolves it (tests/helpers/bundle.py
ports the CLI mutators that matter; no workspace or CLI binary exists here): the official
schema, the CLI's target-mode rules, the paths the jobs receive, the horovod wheel that the
build job writes and the training job installs, and the artifact build."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from helpers import bundle, scripts
from helpers.repo_copy import copy_repository
from hvdrunner import workspace

ROOT = Path(__file__).resolve().parents[1]
VALIDATOR = ROOT.parent / "shared" / "tools" / "validate_bundle.py"
TARGETS = ("dev", "compiled", "keras_on_torch", "lts", "prod")
USER = "first.last@example.com"
WHEEL = re.compile(r"horovod-0\.28\.1-(cp3\d+)-\1-linux_x86_64\.whl")
#: What a user passes (BUNDLE_VAR_catalog / --var): catalog and schema have no default.
VALUES = {"catalog": "ml", "schema": "team_a"}
#: prod runs as a service principal (--var service_principal=<application-id>).
SP = "6f1c2d3e-0000-4000-8000-000000000001"
CHECK = ROOT / "scripts" / "databricks" / "check_wheel.py"
check_wheel = scripts.load("databricks/check_wheel")


def _resolved(name: str) -> dict:
    values = VALUES | {"service_principal": SP} if name == "prod" else VALUES
    return bundle.target(ROOT, name, USER, values)


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
    assert bundle.run_as_problems(config) == []
    owner = f"Users/{SP if name == 'prod' else USER}"  # prod: the principal's, whoever deploys
    assert config["workspace"]["file_path"] == f"/Workspace/{owner}/.bundle/hvdrunner/{name}/files"


def test_the_helper_catches_the_doubled_workspace_prefix_and_the_prod_root_rule():
    # What the bundle had before: /Workspace${workspace.file_path} is not rewritten by the
    # CLI (its rewrite needs the slash), so the path doubles; /Workspace/${...} is rewritten.
    config = bundle.select(bundle.load(ROOT), "dev", USER, VALUES)
    config["resources"]["x"] = [
        "/Workspace${workspace.file_path}",
        "/Workspace/${workspace.file_path}",
    ]
    doubled, rewritten = bundle.resolve(config)["resources"]["x"]
    assert doubled.startswith("/Workspace/Workspace/Users/")
    assert rewritten == f"/Workspace/Users/{USER}/.bundle/hvdrunner/dev/files"
    raw = bundle.load(ROOT)
    del raw["targets"]["prod"]["workspace"]
    del raw["targets"]["prod"]["run_as"]
    prod = bundle.resolve(bundle.select(raw, "prod", USER, VALUES))
    assert bundle.mode_diagnostics(prod)[0][0] == "error"
    assert bundle.mode_diagnostics(prod, service_principal=True)[0][0] == "recommendation"


def test_the_default_target_is_the_newest_lts_ml_gpu_runtime_and_its_python_tag_is_derived():
    raw = bundle.load(ROOT)
    assert [n for n, t in raw["targets"].items() if t.get("default")] == ["dev"]
    dev, lts = _resolved("dev"), _resolved("lts")
    # The 18 LTS line's key (18.0.x was the Beta's, supported until 2026-06-09).
    assert dev["variables"]["spark_version"]["default"] == "18.x-gpu-ml-scala2.13"
    assert lts["variables"]["spark_version"]["default"] == "15.4.x-gpu-ml-scala2.12"
    for name in TARGETS:
        variables = _resolved(name)["variables"]
        line = check_wheel.runtime_line(variables["spark_version"]["default"])
        assert variables["python_tag"]["default"] == check_wheel.RUNTIME_PYTHON[line], name
    with pytest.raises(ValueError, match="is not a runtime key"):
        check_wheel.runtime_line("18.0-gpu-ml")


@pytest.mark.parametrize("name", TARGETS)
def test_catalog_and_schema_are_required_and_every_volume_path_derives_from_them(name):
    with pytest.raises(bundle.RequiredVariable, match="required variable catalog"):
        bundle.target(ROOT, name, USER)  # what `bundle validate` says without them
    config = _resolved(name)
    variables = {k: v["default"] for k, v in config["variables"].items()}
    volume = "/Volumes/ml/team_a/hvdrunner"
    # The team's volume; prod's data in prod's own, which only its principal writes.
    assert variables["storage_root"].startswith(volume + ("_prod/" if name == "prod" else "/"))
    assert variables["wheel_dir"] == volume + "/wheels"  # one folder per runtime, every target
    paths = [t for t in _strings(config["resources"]) if "/Volumes/" in t]
    assert paths and all(volume in p for p in paths), paths
    text = "".join(
        p.read_text() for p in [ROOT / "databricks.yml", *(ROOT / "resources").glob("*.yml")]
    )
    assert "main/default" not in text and "main.default" not in text


def _needs_horovod(target: str, job: str) -> bool:
    """Only target ``compiled``'s Keras job needs a horovod wheel: every other job runs on
    hvdrunner's engine (torch.distributed), or on 15.4 LTS ML's own horovod."""
    return job == "hvdrunner_train" and target == "compiled"


def test_only_the_compiled_target_checks_a_wheel_first_naming_the_build_job(tmp_path):
    for name in TARGETS:
        config = _resolved(name)
        for job in ("hvdrunner_train", "hvdrunner_train_torch"):
            tasks = {t["task_key"]: t for t in _job(config, job)["tasks"]}
            if not _needs_horovod(name, job):  # nothing to check, nothing to wait for
                assert "check_horovod_wheel" not in tasks
                assert "depends_on" not in tasks["prepare_data"]
                train = tasks["train_keras" if job == "hvdrunner_train" else "train_torch"]
                assert not [lib for lib in train["libraries"] if "horovod" in lib.get("whl", "")]
                continue
            check = tasks["check_horovod_wheel"]
            assert "libraries" not in check  # runs before any library install
            assert tasks["prepare_data"]["depends_on"] == [{"task_key": "check_horovod_wheel"}]
            params = check["spark_python_task"]["parameters"]
            train = tasks["train_keras" if job == "hvdrunner_train" else "train_torch"]
            horovod = [lib["whl"] for lib in train["libraries"] if "horovod" in lib.get("whl", "")]
            assert horovod == [params[params.index("--wheel") + 1]]
            build_job = params[params.index("--build-job") + 1]
            # The command as printed runs in a new shell: the required variables included.
            assert build_job == workspace.build_command(name, catalog="ml", schema="team_a")
            assert bundle.run_problems(config, name, build_job) == []
    # The check itself, run as the task runs it: seconds, naming the fix.
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    wheel = tmp_path / f"horovod-0.28.1-{tag}-{tag}-linux_x86_64.whl"
    start = time.monotonic()
    missing = subprocess.run([sys.executable, str(CHECK), "--wheel", str(wheel), "--build-job", "BUILD"],
                             capture_output=True, text=True, timeout=30)  # fmt: skip
    assert time.monotonic() - start < 10
    assert missing.returncode == 1 and f"no horovod wheel at {wheel}" in missing.stderr
    assert "`BUILD`" in missing.stderr
    other = tmp_path / "horovod-0.28.1-cp39-cp39-linux_x86_64.whl"
    job = (
        "databricks bundle run -t compiled --var catalog=ml --var schema=s hvdrunner_build_horovod"
    )
    wrong = subprocess.run([sys.executable, str(CHECK), "--wheel", str(other), "--build-job", job],
                           capture_output=True, text=True, timeout=30)  # fmt: skip
    deploy = "databricks bundle deploy -t compiled --var catalog=ml --var schema=s"
    assert wrong.returncode == 1 and f"`{deploy} --var python_tag={tag}`" in wrong.stderr
    wheel.write_bytes(b"wheel")
    ready = subprocess.run([sys.executable, str(CHECK), "--wheel", str(wheel), "--build-job", "BUILD"],
                           capture_output=True, text=True, timeout=30)  # fmt: skip
    assert ready.returncode == 0 and "horovod wheel ready" in ready.stdout
    assert check_wheel.problems(str(wheel), "B", tag, "18.0") == []  # no record: not judged
    Path(f"{wheel}.json").write_text('{"runtime": "17.3"}')
    (stale,) = check_wheel.problems(str(wheel), "B", tag, "18.0")
    assert "built on runtime 17.3, this cluster runs 18.0" in stale


def test_the_keras_job_and_the_wheel_build_get_tensorflow_where_the_runtime_lacks_it():
    for name in TARGETS:
        config = _resolved(name)
        tf = config["variables"]["tensorflow_pip"]["default"]
        keras = _task(_job(config, "hvdrunner_train"), "train_keras")["libraries"]
        build = _task(_job(config, "hvdrunner_build_horovod"), "build_horovod").get("libraries", [])
        torch = _task(_job(config, "hvdrunner_train_torch"), "train_torch")["libraries"]
        # 15.4 ships TF 2.16; keras_on_torch trains Keras on PyTorch, with no TensorFlow
        expected = [] if name in ("lts", "keras_on_torch") else [{"pypi": {"package": tf}}]
        assert [lib for lib in keras if "pypi" in lib] == expected
        assert build == expected  # horovod is compiled against the TF the Keras job runs
        assert not [lib for lib in torch if "pypi" in lib]
    # The TensorFlow 18 LTS ML ships (the 18 replica's): pip installs nothing over the runtime.
    shipped = (ROOT / "requirements" / "18" / "runtime.txt").read_text()
    assert f"\n{tf}\n" in f"\n{shipped}", f"{tf} is not the TensorFlow 18 LTS ML ships"


@pytest.mark.parametrize("name", TARGETS)
def test_the_keras_job_runs_on_the_backend_its_target_names(name):
    config = _resolved(name)
    job = _job(config, "hvdrunner_train")
    params = _task(job, "train_keras")["notebook_task"]["base_parameters"]
    env = job["job_clusters"][0]["new_cluster"].get("spark_env_vars", {})
    if name == "keras_on_torch":  # the notebook, the ranks and the scoring UDF all on PyTorch
        assert params["keras_backend"] == "torch" and env == {"KERAS_BACKEND": "torch"}
    else:
        assert params["keras_backend"] == "tensorflow" and "KERAS_BACKEND" not in env
    # The engine by default; the compiled horovod where the target installs it, on every
    # process of the cluster (HorovodRunner passes the driver's setting on to the ranks).
    assert env.get("HVDRUNNER_ENGINE") == ("horovod" if name == "compiled" else None)
    notebook = (ROOT / "notebooks" / "02_train_keras.py").read_text()
    assert 'dbutils.widgets.text("keras_backend"' in notebook


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
        assert (
            cluster["single_user_name"]
            == variables["cluster_user"]
            == (SP if name == "prod" else USER)
        )
        libs = [lib["whl"] for lib in _task(train, task_key)["libraries"] if "whl" in lib]
        horovod = [lib for lib in libs if "horovod" in lib]
        if not _needs_horovod(name, job):
            # hvdrunner's engine: hvdrunner's wheel is all they get. 15.4 LTS ML ships horovod
            # 0.28.1; pip skips a wheel of the same version, so attaching ours would silently
            # keep theirs: lts keeps it on purpose.
            assert horovod == []
        else:
            (wheel,) = horovod  # the one wheel, built against the runtime's TF and torch
            assert os.path.dirname(wheel) == out
            match = WHEEL.fullmatch(os.path.basename(wheel))
            assert match and match.group(1) == variables["python_tag"]
        for task in train["tasks"]:
            if task["task_key"] != "check_horovod_wheel":  # that one runs before any install
                assert {"whl": "../dist/hvdrunner-*.whl"} in task["libraries"]


def test_production_identity_and_node_types_are_variables():
    raw = bundle.load(ROOT)
    assert raw["targets"]["prod"]["workspace"]["root_path"].startswith(
        "/Workspace/Users/${var.service_principal}/"
    )  # only the principal may write prod's files
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
    copy = copy_repository(tmp_path / "checkout")  # the checkout's own dist/ is left alone
    dist = copy / "dist"
    dist.mkdir(exist_ok=True)
    stale = dist / "hvdrunner-0.0.1-py3-none-any.whl"
    stale.write_bytes(b"stale")
    proc = subprocess.run([sys.executable, str(copy / "scripts" / "build_wheel.py")],
                          capture_output=True, text=True, timeout=300, cwd=copy)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    wheels = sorted(p.name for p in dist.iterdir())
    assert not stale.exists() and len(wheels) == 1 and wheels[0].startswith("hvdrunner-")


@pytest.mark.parametrize("name", TARGETS)
def test_every_cluster_is_one_a_workspace_takes_and_every_training_task_is_bounded(name):
    config = _resolved(name)
    for job_name, job in config["resources"]["jobs"].items():
        for cluster in job["job_clusters"]:
            spec = cluster["new_cluster"]
            assert bundle.cluster_problems(spec) == [], (job_name, spec)
            assert "driver_node_type_id" not in spec  # the driver is a GPU node too
            assert spec.get("policy_id", "") == ""  # none unless --var policy_id=...
    user = config["workspace"]["current_user"]["userName"]
    for job_name, train in (
        ("hvdrunner_train", "train_keras"),
        ("hvdrunner_train_torch", "train_torch"),
    ):
        task = _task(_job(config, job_name), train)
        assert int(task["timeout_seconds"]) == 14400
        (rule,) = task["health"]["rules"]
        assert rule["metric"] == "RUN_DURATION_SECONDS" and rule["op"] == "GREATER_THAN"
        assert int(rule["value"]) == 7200 < int(task["timeout_seconds"])
        told = task["email_notifications"]
        assert told["on_failure"] == told["on_duration_warning_threshold_exceeded"] == [user]
    policy = bundle.target(
        ROOT, name, USER, {**VALUES, "policy_id": "ABC123", "service_principal": SP}
    )
    for job in policy["resources"]["jobs"].values():
        assert all(c["new_cluster"]["policy_id"] == "ABC123" for c in job["job_clusters"])


def test_the_stand_in_refuses_a_cpu_driver_on_a_gpu_runtime_as_a_workspace_does(tmp_path):
    from helpers.standin import StandIn, StandInError

    gpu = {"spark_version": "18.x-gpu-ml-scala2.13", "node_type_id": "g5.xlarge"}
    assert bundle.cluster_problems(gpu) == []
    assert bundle.cluster_problems(gpu | {"driver_node_type_id": "Standard_NC4as_T4_v3"}) == []
    (problem,) = bundle.cluster_problems(gpu | {"driver_node_type_id": "m5.xlarge"})
    assert "driver_node_type_id 'm5.xlarge' is not a GPU instance type" in problem
    assert bundle.cluster_problems({"spark_version": "18.x-cpu-ml-scala2.13",
                                    "node_type_id": "m5.xlarge"}) == []  # fmt: skip
    ws = StandIn(tmp_path, "dev", VALUES, USER)
    ws.config["resources"]["jobs"]["hvdrunner_train"]["job_clusters"][0]["new_cluster"][
        "driver_node_type_id"] = "m5.xlarge"  # fmt: skip
    with pytest.raises(StandInError, match=r"hvdrunner_train\.gpu_cluster: .*m5\.xlarge"):
        ws.deploy()


def test_each_target_and_user_registers_its_own_model_and_only_prod_moves_prods_alias():
    from hvdrunner import tracking

    names: dict[tuple[str, str], set[str]] = {}
    for name in TARGETS:
        for user in (USER, "second.member@example.com"):
            values = VALUES | {"service_principal": SP} if name == "prod" else VALUES
            config = bundle.target(ROOT, name, user, values)
            for job, key in (("hvdrunner_train", "train_keras"),
                             ("hvdrunner_train_torch", "train_torch")):  # fmt: skip
                params = _task(_job(config, job), key)["notebook_task"]["base_parameters"]
                # What the registry would refuse is refused here, not after training.
                tracking.check_registered_model_name(params["registered_model_name"],
                                                     registry_uri="databricks-uc")  # fmt: skip
                tracking.check_model_alias(params["model_alias"])
                names.setdefault((name, user), set()).add(params["registered_model_name"])
            variables = {k: v["default"] for k, v in config["variables"].items()}
            # Where each writes: its data, checkpoints and MLflow experiment.
            names[(name, user)] |= {variables["storage_root"], variables["experiment"]}
    prod = names[("prod", USER)]
    assert prod == names[("prod", "second.member@example.com")]  # one prod, whoever deploys
    assert {"ml.team_a.hvdrunner_digits_keras", "ml.team_a.hvdrunner_digits_torch"} < prod
    others = [n for key, n in names.items() if key[0] != "prod"]
    assert all(len(n) == 4 for n in names.values())  # Keras and PyTorch apart
    # Every (target, user) outside prod its own names and folders: a dev run never moves
    # prod's alias nor a colleague's, nor writes where they do.
    flat = [m for n in others for m in n]
    assert len(flat) == len(set(flat)) and not set(flat) & prod


def test_a_team_shares_one_volume_and_only_prods_principal_writes_prods(tmp_path):
    """prod's deploy (as its principal, from CI) makes the team's volume and prod's own, with
    their grants; every member's dev deploy then neither fails nor reaches prod's data; a team
    volume made by hand before is handed over and bound as the error says. Unity Catalog
    itself is the stand-in's (helpers/volumes.py): no metastore exists here."""
    from helpers.standin import StandIn
    from helpers.volumes import VolumeError

    team, prod_data = "ml.team_a.hvdrunner", "ml.team_a.hvdrunner_prod"
    prod = StandIn(tmp_path, "prod", VALUES | {"service_principal": SP}, SP)
    assert prod.volumes.get(team) is None  # prod makes no volume by hand: its deploy does
    prod.deploy_volumes()
    prod.deploy_volumes()  # the next CI deploy changes nothing
    assert prod.volumes.get(team) == {
        "owner": SP, "grants": {"account users": ["READ_VOLUME", "WRITE_VOLUME"]},
        "deployment": [prod.config["workspace"]["root_path"], "team"]}  # fmt: skip
    assert prod.volumes.get(prod_data)["grants"] == {"account users": ["READ_VOLUME"]}
    jobs = ("hvdrunner_train", "hvdrunner_train_torch", "hvdrunner_build_horovod")
    for job in jobs:
        prod.check_access(job)
    # Two members: the team's volume is there ("already exists"), each writes its own folder.
    members = [StandIn(tmp_path, target, VALUES, user)
               for user in (USER, "second.member@example.com")
               for target in ("dev", "compiled", "keras_on_torch")]  # fmt: skip
    for ws in members:
        assert ws.volumes.get(team)["owner"] == SP and ws.identity == ws.user
        for job in jobs:
            ws.check_access(job)
    roots = {ws.vars["storage_root"] for ws in members}
    assert len(roots) == len(members) and all(r.startswith("/Volumes/ml/team_a/hvdrunner/")
                                              for r in roots)  # fmt: skip
    # prod's data: the team reads it, only the principal writes it.
    stray = StandIn(tmp_path, "dev", VALUES | {"storage_root": "/Volumes/ml/team_a/hvdrunner_prod/x"},
                    USER)  # fmt: skip
    with pytest.raises(VolumeError, match=f"{USER} lacks WRITE_VOLUME on volume {prod_data}"):
        stray.check_access("hvdrunner_train")
    prod.volumes.check("/Volumes/ml/team_a/hvdrunner_prod/prod/predictions", USER, write=False)

    # A team that made its volume by hand before prod existed: prod's deploy stops naming
    # the two steps in the order docs/databricks.md gives them.
    other = tmp_path / "by-hand"
    StandIn(other, "dev", VALUES, USER)
    late = StandIn(other, "prod", VALUES | {"service_principal": SP}, SP)
    bind = f"databricks bundle deployment bind team {team} -t prod"
    with pytest.raises(VolumeError, match=re.escape(bind)):
        late.deploy_volumes()
    late.volumes.bind(team, late.config["workspace"]["root_path"], "team")
    with pytest.raises(VolumeError, match=re.escape(f"ALTER VOLUME {team} OWNER TO `{SP}`")):
        late.deploy_volumes()
    late.volumes.set_owner(team, SP)
    late.deploy_volumes()
    assert late.volumes.get(team)["grants"] == prod.volumes.get(team)["grants"]
    docs = (ROOT / "docs" / "databricks.md").read_text()
    for step in (
        "ALTER VOLUME <catalog>.<schema>.hvdrunner OWNER TO `<application-id>`",
        "databricks bundle deployment bind team <catalog>.<schema>.hvdrunner -t prod",
    ):
        assert step in docs, step


def test_the_policy_hvdrunner_ships_takes_every_job_cluster_and_refuses_what_it_limits(tmp_path):
    """resources/cluster_policy.json, the policy docs/databricks.md tells an admin to create
    for `--var policy_id`: every job cluster of every target on every cloud's preset node type
    passes it in the stand-in's deploy (tests/helpers/policy.py applies it as Databricks does;
    no workspace exists here); what it limits is refused, naming the attribute."""
    from helpers import policy
    from helpers.standin import StandIn, StandInError

    definition = json.loads((ROOT / "resources" / "cluster_policy.json").read_text())
    bundle_vars = scripts.load("bundle_vars")
    policies = {"hvd-0001": definition}
    for name in TARGETS:
        for cloud, preset in bundle_vars.PRESETS.items():
            values = (VALUES | {"service_principal": SP} if name == "prod" else VALUES) | preset
            ws = StandIn(tmp_path / name / cloud, name, values | {"policy_id": "hvd-0001"},
                         SP if name == "prod" else USER, policies)  # fmt: skip
            for job in ws.config["resources"]["jobs"].values():
                for cluster in job["job_clusters"]:
                    assert cluster["new_cluster"]["policy_id"] == "hvd-0001"
                    assert ws.policy_problems(cluster["new_cluster"]) == [], (name, cloud)
    cluster = _job(_resolved("dev"), "hvdrunner_train")["job_clusters"][0]["new_cluster"]
    refused = {
        "node_type_id": {"node_type_id": "p4d.24xlarge"},
        "num_workers": {"num_workers": 8},
        "data_security_mode": {"data_security_mode": "USER_ISOLATION"},
        "spark_version": {"spark_version": "18.x-cpu-ml-scala2.13"},
        "custom_tags.project": {"custom_tags": {"project": "other"}},
    }
    for attribute, change in refused.items():
        (problem,) = policy.problems(cluster | change, definition)
        assert problem.startswith(f"{attribute} "), problem
    (problem,) = policy.problems({k: v for k, v in cluster.items() if k != "node_type_id"},
                                 definition)  # fmt: skip
    assert problem == "node_type_id: the policy requires a value"
    # The deploy stops on a refused cluster, and on a policy the workspace does not have.
    ws = StandIn(tmp_path / "refused", "dev", VALUES | {"policy_id": "hvd-0001",
                 "node_type_id": "p4d.24xlarge"}, USER, policies)  # fmt: skip
    with pytest.raises(StandInError, match=r"hvdrunner_\w+\.\w+: .*'p4d\.24xlarge' must be one"):
        ws.deploy()
    ws = StandIn(tmp_path / "missing", "dev", VALUES | {"policy_id": "nope"}, USER, policies)
    with pytest.raises(StandInError, match="policy_id 'nope': no such compute policy"):
        ws.deploy()
    docs = (ROOT / "docs" / "databricks.md").read_text()
    assert '--definition "$(cat resources/cluster_policy.json)"' in docs
