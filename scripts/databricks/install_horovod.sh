#!/usr/bin/env bash
# Databricks cluster init script: horovod 0.28.1 on the runtimes after 15.4 LTS ML, which
# ship TensorFlow (Keras 3) but no horovod. The bundle (resources/train_job.yml) attaches it
# to the job cluster and sets the environment below through spark_env_vars.
#
#   HVDRUNNER_SRC          the deployed bundle's files (/Workspace/...): the one horovod
#                          builder (scripts/install_horovod.sh) and its patch live there
#   HVDRUNNER_WHEEL_CACHE  a Unity Catalog volume path, e.g. /Volumes/main/default/hvdrunner/wheels:
#                          the first cluster builds (~10-15 min), later ones install the cached
#                          wheel in seconds; keyed by horovod, TF, Python, CUDA and build flags
#   HVDRUNNER_HOROVOD_GPU  auto (default: NCCL when the node has GPUs and nvcc), none or nccl
#
# It builds against the cluster's own TensorFlow (/databricks/python), applies hvdrunner's
# patches (patches/: the gloo process-set interface fix always, the no-XLA one on TF >= 2.16),
# and fails the cluster start loudly if horovod then lacks TensorFlow or gloo support. A
# horovod 0.28.1 already built by hvdrunner is only checked. One that lacks the gloo patch
# (15.4 LTS ML's preinstalled one) is rebuilt; HVDRUNNER_KEEP_INSTALLED_HOROVOD=1 keeps it
# (multi-host jobs then need hostnames that resolve to the nodes' addresses).
set -euo pipefail
SRC="${HVDRUNNER_SRC:?set HVDRUNNER_SRC to the workspace file path of the deployed bundle, /Workspace/...}"
export PYTHON="${HVDRUNNER_PYTHON:-/databricks/python/bin/python}"
export HVDRUNNER_WHEEL_CACHE="${HVDRUNNER_WHEEL_CACHE:?set HVDRUNNER_WHEEL_CACHE to a /Volumes/... path}"
export HVDRUNNER_HOROVOD_GPU="${HVDRUNNER_HOROVOD_GPU:-auto}"
[ -f "$SRC/scripts/install_horovod.sh" ] || { echo "ERROR: $SRC/scripts/install_horovod.sh not found (is HVDRUNNER_SRC the file path of the deployed bundle?)" >&2; exit 1; }
if ! command -v cmake >/dev/null 2>&1 || [ "$(cmake --version | sed -n 's/^cmake version \([0-9]*\).*/\1/p')" -ge 4 ]; then
  # horovod 0.28.1's CMake files need cmake 3.x; the PyPI package brings one.
  "$PYTHON" -m pip install -q 'cmake>=3.18,<4'
  export PATH="$(dirname "$PYTHON"):$PATH"
fi
exec bash "$SRC/scripts/install_horovod.sh"
