"""The bundle as a user deploys it, against a local stand-in for the workspace
(tests/helpers/standin.py says what it maps and what it cannot reach: clusters, access modes,
the UI, GPUs, PyPI): each target's jobs run from the paths their tasks name, the docs' install
cells install what the build job wrote, every path and command the docs, notebooks and hints
print is hvdrunner.workspace's, and the CLI accepts every command they give (its argument rules,
ported in tests/helpers/bundle.py)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest

from helpers import bundle, scripts
from helpers.docblocks import block
from helpers.repo_copy import copy_repository
from helpers.standin import ROOT, StandIn, StandInError, install_requirements, pip_install
from hvdrunner import workspace

pytestmark = pytest.mark.background  # no time bound (tests/conftest.py)
USER = "first.last@example.com"
VALUES = {"catalog": "ml", "schema": "team_a"}
#: prod runs as a service principal and tells a team address, not whoever deploys.
PROD = VALUES | {"service_principal": "6f1c2d3e-0000-4000-8000-000000000001",
                 "notify": "ml-team@example.com"}  # fmt: skip
FAST = {"epochs": "2"}  # --var epochs=2: the jobs as deployed, shorter
INSTALL_MD = ROOT / "docs" / "install.md"


def _final_accuracy(log: Path) -> float:
    """The training accuracy a train notebook's last line reports (its task's log)."""
    final = re.search(r"final accuracy (\S+),", log.read_text())
    assert final, f"{log} reports no final accuracy"
    return float(final[1])


def _user_values(text: str, runtime: str) -> str:
    return (text.replace(workspace.CATALOG, VALUES["catalog"])
            .replace(workspace.SCHEMA, VALUES["schema"]).replace(workspace.RUNTIME, runtime))  # fmt: skip


def _install_line(cell: str, runtime: str) -> str:
    """An install cell of docs/install.md with the test's names: its ``%pip`` line (the
    cell's second line must be the restart every install cell ends with)."""
    line, restart = _user_values(cell, runtime).strip().splitlines()
    assert restart == workspace.RESTART
    return line


def _doctor(target: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """docs/install.md's doctor cell, in the environment the install cell made (``target``
    first); the page's cell is hvdrunner.workspace's (what the build job and hints print)."""
    cell = block("install.md", "doctor-cell")
    assert cell.strip() == workspace.DOCTOR_CELL
    code = f"import hvdrunner\n{cell}\nprint('FROM', hvdrunner.__file__)"
    run_env = {
        **os.environ,
        **(env or {}),
        "PYTHONPATH": f"{target}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    return subprocess.run([sys.executable, "-c", code], env=run_env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip


# -- the paths and commands every place prints ------------------------------------------------


@pytest.mark.parametrize("name", ["dev", "compiled", "keras_on_torch", "lts", "prod"])
def test_every_target_builds_into_the_one_wheel_folder_the_docs_print(name):
    values = PROD if name == "prod" else VALUES
    config = bundle.target(ROOT, name, USER, values)
    runtime = config["variables"]["spark_version"]["default"]
    build = next(t for t in config["resources"]["jobs"]["hvdrunner_build_horovod"]["tasks"])
    params = build["spark_python_task"]["parameters"]
    assert params[params.index("--out") + 1] == workspace.wheel_folder("ml", "team_a", runtime)
    install = INSTALL_MD.read_text()
    assert (
        workspace.compiled_cell()
        .splitlines()[0]
        .replace(workspace.RUNTIME, "18.x-gpu-ml-scala2.13")
        in install
    )
    assert workspace.wheel_cell() in install


def test_notebooks_migrate_and_doctor_print_the_same_install_lines():
    compiled = workspace.compiled_cell().splitlines()[0]
    wheel = workspace.wheel_cell().splitlines()[0]
    for path in sorted((ROOT / "notebooks").glob("*.py")):
        text = path.read_text()
        assert compiled in text and wheel in text and workspace.RESTART in text, path.name
        assert "hvdrunner.doctor.check()" in text, path.name
    from hvdrunner.doctor import evaluate_build
    from hvdrunner.migrate.rules import INSTALL

    assert wheel in INSTALL.fix and compiled in INSTALL.fix
    # A compiled horovod asked for (HVDRUNNER_ENGINE=horovod) and missing on a cluster: the fix
    # is the build job and its install cell, or the engine.
    on_cluster = {"DATABRICKS_RUNTIME_VERSION": "18.0", "HVDRUNNER_ENGINE": "horovod"}
    (failed,) = [
        c for c in evaluate_build({"horovod": None, "tensorflow": "2.21.0"}, env=on_cluster)
    ]
    assert workspace.build_command() in failed.fix and compiled in failed.fix
    assert "scripts/" not in failed.fix and "make " not in failed.fix  # a cluster has neither
    # Without the setting, TensorFlow beside torch needs no horovod at all.
    engine = evaluate_build({"horovod": None, "tensorflow": "2.21.0", "torch": "2.9.0"},
                            env={"DATABRICKS_RUNTIME_VERSION": "18.0"})  # fmt: skip
    assert not [c for c in engine if c.required and not c.ok], engine


@pytest.mark.parametrize("name", ["dev", "compiled", "keras_on_torch", "lts", "prod"])
def test_the_cli_accepts_every_command_the_docs_and_hints_give(name):
    values = PROD if name == "prod" else VALUES
    config = bundle.target(ROOT, name, USER, values)
    commands = [workspace.build_command(name, catalog="ml", schema="team_a"),
                workspace.build_command(name, rebuild=True, catalog="ml", schema="team_a"),
                f"databricks bundle run -t {name} hvdrunner_train",
                f"databricks bundle run -t {name} hvdrunner_train_torch"]  # fmt: skip
    docs = "".join(p.read_text() for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
    commands += [c for c in re.findall(r"databricks bundle run[^`\n]*", docs) if f"-t {name} " in c]
    for command in commands:
        assert bundle.run_problems(config, name, command) == [], command
    # What the port refuses, as the CLI does (job_options.go Validate).
    assert bundle.run_problems(
        config, name, f"databricks bundle run -t {name} hvdrunner_train --params rebuild=true"
    )
    assert bundle.run_problems(
        config, name, f"databricks bundle run -t {name} hvdrunner_build_horovod --params=--rebuild"
    )


NODES = {"aws": "g5.xlarge", "azure": "Standard_NC4as_T4_v3", "gcp": "g2-standard-4"}


def _bundle_vars(copy: Path, line: str, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = shlex.split(line)
    assert argv[:2] == ["python", "scripts/bundle_vars.py"]
    return subprocess.run([sys.executable, *argv[1:], *extra], cwd=copy, capture_output=True,
                          text=True, timeout=60)  # fmt: skip


def test_the_set_up_runs_as_printed_and_a_new_shell_needs_no_variable(tmp_path):
    """README's and docs/databricks.md's set-up line, per cloud, in a copy of the repository;
    then the bundle as the CLI resolves it in a new shell (no --var, no BUNDLE_VAR_*)."""
    pages = (ROOT / "README.md", ROOT / "docs" / "databricks.md")
    (line,) = {text for page in pages for text in page.read_text().splitlines()
               if text.startswith("python scripts/bundle_vars")}  # fmt: skip
    line = line.replace("<catalog>", "ml").replace("<schema>", "team_a")
    copy = copy_repository(tmp_path / "checkout")
    for cloud, node in NODES.items():
        proc = _bundle_vars(copy, line.replace("--cloud aws", f"--cloud {cloud}"))
        assert proc.returncode == 0, proc.stderr
        config = bundle.target(copy, "dev", USER)  # nothing passed: the file remembers
        assert config["variables"]["catalog"]["default"] == "ml"
        clusters = [c["new_cluster"] for job in config["resources"]["jobs"].values()
                    for c in job["job_clusters"]]  # fmt: skip
        assert {c["node_type_id"] for c in clusters} == {node}, cloud
        assert all(bundle.cluster_problems(c) == [] for c in clusters)
    # --var still wins over the file, as in the CLI.
    config = bundle.target(copy, "dev", USER, {"node_type_id": "p4d.24xlarge"})
    assert config["resources"]["jobs"]["hvdrunner_train"]["job_clusters"][0]["new_cluster"][
        "node_type_id"] == "p4d.24xlarge"  # fmt: skip
    # AWS's preset is databricks.yml's default.
    assert bundle.load(ROOT)["variables"]["node_type_id"]["default"] == NODES["aws"]
    # prod's own file: the principal and the team address, and nothing of dev's leaks in.
    prod_line = line.replace("--target dev", "--target prod")
    proc = _bundle_vars(copy, prod_line, "--set", f"service_principal={PROD['service_principal']}",
                        "--set", f"notify={PROD['notify']}")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    prod = bundle.target(copy, "prod", USER)
    assert bundle.run_as_problems(prod) == []
    assert prod["variables"]["node_type_id"]["default"] == NODES["aws"]
    # Refused, naming what it takes, and the file left as it was.
    remembered = (copy / ".databricks/bundle/dev/variable-overrides.json").read_text()
    for extra, said in ((["--set", "nodes=3"], "not variables of databricks.yml"),
                        (["--target", "staging"], "databricks.yml's targets are"),
                        (["--set", "catalog"], "expected NAME=VALUE")):  # fmt: skip
        proc = _bundle_vars(copy, line, *extra)
        assert proc.returncode == 2 and said in proc.stderr, proc.stderr
    proc = _bundle_vars(copy, line.replace("--cloud aws", "--cloud oci"))
    assert proc.returncode == 2 and "invalid choice: 'oci'" in proc.stderr
    assert (copy / ".databricks/bundle/dev/variable-overrides.json").read_text() == remembered


def test_prod_is_one_deployment_run_as_a_service_principal():
    config = bundle.target(ROOT, "prod", USER, PROD)
    other = bundle.target(ROOT, "prod", "someone.else@example.com", PROD)
    assert config["workspace"]["root_path"] == other["workspace"]["root_path"]
    assert USER not in json.dumps(config["resources"])  # nothing is the deployer's
    assert config["run_as"] == {"service_principal_name": PROD["service_principal"]}
    # One copy in the principal's own folder; it manages, the team views.
    assert config["workspace"]["root_path"].startswith(
        f"/Workspace/Users/{PROD['service_principal']}/"
    )
    assert config["permissions"] == [
        {"level": "CAN_MANAGE", "service_principal_name": PROD["service_principal"]},
        {"level": "CAN_VIEW", "group_name": "users"},
    ]
    # prod installs no wheel from the shared folder (its jobs run on the engine), so no dev
    # or compiled build there can change what prod runs.
    for job in ("hvdrunner_train", "hvdrunner_train_torch"):
        for task in config["resources"]["jobs"][job]["tasks"]:
            assert all("/wheels/" not in lib.get("whl", "") for lib in task.get("libraries", []))
    assert bundle.mode_diagnostics(config) == [] and bundle.run_as_problems(config) == []
    unset = bundle.target(ROOT, "prod", USER, VALUES)
    assert bundle.run_as_problems(unset) == [
        "run_as section must specify exactly one identity. Neither service_principal_name nor "
        "user_name is specified"
    ]
    for job in ("hvdrunner_train", "hvdrunner_train_torch"):
        cluster = config["resources"]["jobs"][job]["job_clusters"][0]["new_cluster"]
        assert cluster["single_user_name"] == PROD["service_principal"]
        assert bundle.cluster_problems(cluster) == []  # a GPU driver, as on every target


# -- the jobs, run against the stand-in --------------------------------------------------------


@pytest.mark.keras
@pytest.mark.stacks("18")
@pytest.mark.timeout(1200)
def test_dev_keras_job_needs_nothing_built_and_the_compiled_target_builds_once(tmp_path):
    ws = StandIn(tmp_path, "dev", VALUES | FAST, USER)
    ws.deploy()
    values = ws.run_job("hvdrunner_train")  # Keras on TensorFlow over the engine: no build
    assert values["batch_inference"]["test_accuracy"] > 0.8
    assert not list(tmp_path.rglob("horovod-*.whl"))
    # Target `compiled`: the same job on the horovod the build job compiles.
    c = StandIn(tmp_path / "c", "compiled", VALUES | FAST, USER)
    c.deploy()
    # Before the build: the first task stops the job in seconds, naming the build command.
    with pytest.raises(
        StandInError,
        match=r"(?s)check_horovod_wheel.*"
        + re.escape(workspace.build_command("compiled", catalog="ml", schema="team_a")),
    ):
        c.run_job("hvdrunner_train")
    c.run_job("hvdrunner_build_horovod")
    runtime = c.vars["spark_version"]
    folder = c.map(workspace.wheel_folder("ml", "team_a", runtime))
    (horovod,) = folder.glob("horovod-*.whl")
    record = json.loads(Path(f"{horovod}.json").read_text())
    import tensorflow as tf

    assert record["frameworks"]["tensorflow"] == tf.__version__
    assert record["cuda_archs"] == []  # a CPU build here; a GPU node records its list
    requirements = (folder / "requirements.txt").read_text()
    assert c.vars["tensorflow_pip"] in requirements.splitlines()
    # HVDRUNNER_ENGINE=horovod on the cluster: the ranks import the wheel's horovod or fail.
    # Scoring is the dev run's (the model's flavour is the same): `bundle run --only`.
    c.run_job("hvdrunner_train", only=("prepare_data", "train_keras"))
    assert _final_accuracy(c.last / "train_keras.log") > 0.8
    # A second build run keeps the wheel; the rebuild parameter builds it again.
    c.run_job("hvdrunner_build_horovod")
    assert "already built" in (c.last / "build_horovod.log").read_text()
    c.run_job("hvdrunner_build_horovod", {"rebuild": "true"})
    assert "already built" not in (c.last / "build_horovod.log").read_text()
    # docs/install.md's cell for the compiled horovod, against the folder the build job wrote.
    line = _install_line(block("install.md", "install-compiled"), runtime)
    requirements_path = c.map(line.split("-r ", 1)[1])
    env_dir = tmp_path / "notebook-env"
    assert install_requirements(requirements_path, env_dir) == [c.vars["tensorflow_pip"]]
    doctor = _doctor(env_dir)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert f"FROM {env_dir}" in doctor.stdout  # the installed copy, not the checkout


@pytest.mark.keras
@pytest.mark.stacks("15.4")
@pytest.mark.timeout(900)
def test_lts_keras_job_runs_on_what_15_4_ships(tmp_path, tracking_db):
    """Target ``lts`` on its runtime's replica: no TensorFlow library (15.4 ships 2.16.1),
    hvdrunner's wheel alone, MLflow 2.13's client registering the job's model."""
    ws = StandIn(tmp_path, "lts", VALUES | FAST, USER)
    assert all("pypi" not in lib for task in ws.job("hvdrunner_train")["tasks"]
               for lib in task.get("libraries", []))  # fmt: skip
    ws.deploy()
    uri = tracking_db  # the registry, local in place of Unity Catalog
    values = ws.run_job("hvdrunner_train",
                        env={"MLFLOW_TRACKING_URI": uri, "MLFLOW_REGISTRY_URI": uri})  # fmt: skip
    assert values["batch_inference"]["test_accuracy"] > 0.8
    name = f"ml.team_a.hvdrunner_digits_lts_{bundle.short_name(USER)}_keras"
    assert values["train_keras"]["model_uri"] == f"models:/{name}@champion"


@pytest.mark.torch
@pytest.mark.stacks("19")
@pytest.mark.timeout(900)
def test_dev_torch_job_and_keras_on_torch_need_nothing_built(tmp_path, tracking_db):
    # A team's workspace: prod's principal deployed first (its volumes and their grants), so
    # the member's job runs in a team volume it does not own and must leave prod's untouched.
    sp = PROD["service_principal"]
    StandIn(tmp_path, "prod", PROD, sp).deploy_volumes()
    ws = StandIn(tmp_path, "dev", VALUES | FAST, USER)
    assert ws.volumes.get("ml.team_a.hvdrunner")["owner"] == sp
    ws.deploy()
    uri = tracking_db  # the registry, local in place of Unity Catalog
    values = ws.run_job("hvdrunner_train_torch",
                        env={"MLFLOW_TRACKING_URI": uri, "MLFLOW_REGISTRY_URI": uri})  # fmt: skip
    assert values["batch_inference"]["test_accuracy"] > 0.8  # nothing built before it
    # The job left its model in the registry under the alias, and inference scored it by
    # that alias: the version the training run registered, its accuracy logged to that run.
    name = f"ml.team_a.hvdrunner_digits_dev_{bundle.short_name(USER)}_torch"
    trained = values["train_torch"]
    assert trained["model_uri"] == f"models:/{name}@champion"
    client = mlflow.MlflowClient(uri, uri)
    version = client.get_model_version_by_alias(name, "champion")
    assert version.run_id == trained["run_id"]
    metrics = client.get_run(trained["run_id"]).data.metrics
    assert metrics["test_accuracy"] == values["batch_inference"]["test_accuracy"]
    assert f"models:/{name}@champion" in (ws.last / "train_torch.log").read_text()
    assert not list(tmp_path.rglob("horovod-*.whl"))
    assert list(ws.map(ws.vars["storage_root"]).rglob("*.parquet"))  # its data, in its folder
    assert not list(ws.map("/Volumes/ml/team_a/hvdrunner_prod").iterdir())  # prod's untouched
    # prod's own run, deployed and run as its principal: prod's volume, model and alias
    # (its scoring is the member's, scored above: `bundle run --only`).
    p = StandIn(tmp_path, "prod", PROD | FAST, sp)
    p.deploy()
    values = p.run_job("hvdrunner_train_torch", only=("prepare_data", "train_torch"),
                       env={"MLFLOW_TRACKING_URI": uri, "MLFLOW_REGISTRY_URI": uri})  # fmt: skip
    assert "batch_inference" not in values
    assert _final_accuracy(p.last / "train_torch.log") > 0.8
    assert values["train_torch"]["model_uri"] == "models:/ml.team_a.hvdrunner_digits_torch@champion"
    assert list(p.map("/Volumes/ml/team_a/hvdrunner_prod/prod").rglob("*.parquet"))
    # The member's alias still names the member's version: prod moved only its own.
    assert client.get_model_version_by_alias(name, "champion").run_id == trained["run_id"]
    k = StandIn(tmp_path / "k", "keras_on_torch", VALUES | FAST, USER)
    k.deploy()
    values = k.run_job("hvdrunner_train")
    assert values["batch_inference"]["test_accuracy"] > 0.5
    # docs/install.md's PyTorch route: the wheel copied into the volume, one %pip line.
    copy = block("install.md", "copy-wheel").strip()
    src, dest = copy.split()[-2:]
    wheel = ws.files / src
    assert wheel.is_file(), f"{src} is not what the artifact build writes"
    dest_dir = ws.map(_user_values(dest.removeprefix("dbfs:"), ""))
    dest_dir.mkdir(parents=True, exist_ok=True)
    (dest_dir / wheel.name).write_bytes(wheel.read_bytes())
    line = _install_line(block("install.md", "install-wheel"), "")
    env_dir = tmp_path / "notebook-env"
    pip_install([str(ws.map(line.split()[-1]))], env_dir)
    doctor = _doctor(env_dir, {"KERAS_BACKEND": ""})
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert f"FROM {env_dir}" in doctor.stdout


@pytest.mark.torch  # every replica ships torch: on 19, which has no TensorFlow, too
@pytest.mark.stacks("15.4", "16.4", "17.3", "18", "19")  # each runtime's smoke test
@pytest.mark.timeout(600)
def test_the_install_cell_and_the_doctor_cell_pass_on_the_runtime(tmp_path):
    """docs/install.md's route on this runtime's replica, as a notebook takes it: the wheel
    the artifact build makes, in the volume; the install cell's ``%pip`` line (into a folder of
    its own, as a notebook-scoped install); the doctor cell passes from the installed copy,
    reads pyspark without metadata and says CI tests this runtime."""
    stack = os.environ["STACK"]
    volume = tmp_path / "volume"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--wheel-dir",
                    str(volume), str(ROOT)], check=True, capture_output=True, timeout=300)  # fmt: skip
    line = _install_line(block("install.md", "install-wheel"), "")
    wheel = volume / Path(line.split()[-1]).name
    assert wheel.is_file(), f"{line}: the build made {sorted(volume.iterdir())}"
    env_dir = tmp_path / "notebook-env"
    pip_install([str(wheel)], env_dir)
    version = stack if "." in stack else f"{stack}.0"  # as the runtime sets it: "18.0"
    doctor = _doctor(env_dir, {"DATABRICKS_RUNTIME_VERSION": version, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert f"FROM {env_dir}" in doctor.stdout
    spark = subprocess.run([sys.executable, "-c", "import pyspark; print(pyspark.__version__)"],
                           capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    assert f"[x] pyspark: {spark}" in doctor.stdout, doctor.stdout
    assert f"[x] runtime: Databricks Runtime {version}: tested: CI runs a replica" in doctor.stdout


@pytest.mark.torch
@pytest.mark.timeout(600)
def test_notebooks_opened_by_hand_run_01_02_03_with_their_defaults(tmp_path, tracking_db):
    """As a user runs them one by one in a workspace: no task values (``--interactive``), no
    parameter set; each finds what the one before wrote."""
    env = {**os.environ, "MLFLOW_TRACKING_URI": tracking_db}
    for name, params in (("01_prepare_data.py", []), ("02_train_torch.py", ["--param", "epochs=2"]),
                         ("03_batch_inference.py", ["--param", "train_task=train_torch"])):  # fmt: skip
        proc = subprocess.run(
            [sys.executable, "-m", "hvdrunner.notebook", "run", str(ROOT / "notebooks" / name),
             "--interactive", "--task-values", str(tmp_path / "tv.json"), *params],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400,
        )  # fmt: skip
        assert proc.returncode == 0, f"{name}: {proc.stdout[-3000:]}{proc.stderr[-3000:]}"
    assert re.search(r"test accuracy: 0\.\d+", proc.stdout)
    assert "(what prepare_data wrote with its defaults)" in proc.stdout + proc.stderr


def test_the_access_mode_is_named_and_the_docs_say_what_works_there():
    assert workspace.access_mode(env={"IS_SERVERLESS": "TRUE"}) == "serverless"
    assert workspace.access_mode(env={}) == "not databricks"
    on_cluster = {"DATABRICKS_RUNTIME_VERSION": "18.0"}
    assert workspace.access_mode(object(), env=on_cluster) == "dedicated"
    # A Spark Connect session is told by its type's module (pyspark.sql.connect.session),
    # which standard access mode's notebooks hold; no server is needed to tell.
    connect = type("SparkSession", (), {"__module__": "pyspark.sql.connect.session"})()
    assert workspace.access_mode(connect, env=on_cluster) == "standard"
    cluster_md = (ROOT / "docs" / "cluster.md").read_text()
    for mode in ("dedicated", "standard", "serverless"):
        assert f"| {mode}" in cluster_md
    # The runner's "no session" error names the compute (a fresh process: no session).
    code = "from hvdrunner._launch.backends import choose\nchoose(2)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "IS_SERVERLESS": "TRUE"})  # fmt: skip
    assert (
        proc.returncode == 1
        and "This compute: serverless: serverless notebooks have no ML" in proc.stderr
    )


def test_the_wheel_check_names_a_tensorflow_or_gpu_the_wheel_was_not_built_for(tmp_path):
    check = scripts.load("databricks/check_wheel")
    build = scripts.load("databricks/build_horovod_wheel")
    key = "horovod-0.28.1-tf2.21.0-py312-cuda13.0-nccl2.30.7-sm75.80.90-gloo-nompi-px-x86_64"
    assert build.cuda_archs(key) == ["75", "80", "90"]
    assert build.cuda_archs("horovod-0.28.1-tf2.21.0-py312-cpu-gloo-nompi-px-x86_64") == []
    assert check.pinned_version("tensorflow[and-cuda]==2.21.0") == "2.21.0"
    assert check.pinned_version("tensorflow>=2.16") is None
    wheel = tmp_path / "horovod-0.28.1-cp312-cp312-linux_x86_64.whl"
    wheel.write_bytes(b"wheel")
    Path(f"{wheel}.json").write_text(json.dumps(
        {"runtime": "18.0", "cuda_archs": ["75", "80", "90"], "frameworks": {"tensorflow": "2.20.0"}}))  # fmt: skip
    job = workspace.build_command("dev")
    assert check.problems(str(wheel), job, "cp312", "18.0", gpus=["86"]) == []  # sm_80 runs on 8.6
    (older,) = check.problems(str(wheel), job, "cp312", "18.0", gpus=["70"])
    deploy = "databricks bundle deploy -t dev --var catalog=<catalog> --var schema=<schema>"
    assert "this node's GPU is 70" in older and f"`{deploy} --var cuda_archs=all`" in older
    assert workspace.build_command("dev", rebuild=True) in older
    (tf,) = check.problems(
        str(wheel), job, "cp312", "18.0", requires="tensorflow[and-cuda]==2.21.0"
    )
    assert (
        "built against tensorflow 2.20.0" in tf
        and workspace.build_command("dev", rebuild=True) in tf
    )
