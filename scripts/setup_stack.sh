#!/usr/bin/env bash
# Brings one stack's venv up to its pins:  STACK=modern|15.4|torch|gpu bash scripts/setup_stack.sh
# Idempotent: `make` calls it only when a requirements file or a script changed, and each
# stage below checks before it works.
#
#   15.4    a replica of Databricks Runtime 15.4 LTS ML, from Databricks' own package list
#           (requirements/15.4/runtime.txt): Python 3.11, TF 2.16.1 (Keras 3.2.1, tf-keras
#           2.16.0), torch 2.3.1, pyspark 3.5.0 without package metadata (as on a cluster),
#           pyarrow 14, petastorm 0.12.1, mlflow-skinny 2.13.1, horovod 0.28.1 for TensorFlow
#   modern  Python 3.12, TF 2.21 (Keras 3) + tf_keras, pyspark 4.1, pyarrow < 23, no petastorm
#   torch   Python 3.11, torch 2.13 (CPU), pyspark 4.1, pyarrow < 23, no TensorFlow and no
#           horovod: PyTorch runs on hvdrunner's engine (torch.distributed), nothing compiled
#   gpu     Python 3.11, torch 2.14 (CUDA 13.0) + the registry's nvcc, horovod with CUDA + NCCL
#           (built here with no GPU; the tests run its CPU paths), the torch stack's pins: the
#           stack that keeps a compiled horovod.torch (unchanged-import and parity tests)
#
# Order matters: 1. the framework (requirements/<stack>/framework.txt); 2. horovod from source
# against it (scripts/install_horovod.sh; not on torch); 3. Spark, Arrow, MLflow, dev tools and hvdrunner
# itself (editable). Any missing piece (the framework's or gloo support in horovod,
# `pip check`) fails loudly.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STACK="${STACK:-modern}"
REPLICA=  # a runtime replica: its pins come from requirements/<runtime>/runtime.txt
case "$STACK" in
  15.4) PYVER=3.11; REPLICA=1 ;;
  modern) PYVER=3.12 ;;
  torch) PYVER=3.11 ;;  # on 3.11 pip takes torch's CPU wheel from disk; elsewhere a CUDA build
  gpu) PYVER=3.11 ;;    # on 3.11 pip takes torch 2.14.1's CUDA wheel and its nvidia-* from disk
  *) printf 'ERROR: STACK must be 15.4, modern, torch or gpu (got %s)\n' "$STACK" >&2; exit 2 ;;
esac
VENV="${VENV:-$ROOT/.venv-$STACK}"
REQ="$ROOT/requirements/$STACK"

say() { printf '\n==> [setup %s %s] %s\n' "$STACK" "$(date +%H:%M:%S)" "$*"; }
die() { printf '\nERROR: %s\n' "$*" >&2; exit 1; }

find_python() {
  # PYTHON_BIN wins; else python3.X on PATH; else a pyenv-installed 3.X (pyenv's shim says
  # "command not found" for versions that are installed but not selected).
  local cand
  for cand in "${PYTHON_BIN:-}" "python$PYVER" "$HOME"/.pyenv/versions/"$PYVER".*/bin/python"$PYVER"; do
    [ -n "$cand" ] || continue
    if "$cand" -c "import sys; assert sys.version_info[:2] == tuple(map(int, '$PYVER'.split('.')))" >/dev/null 2>&1; then
      command -v "$cand" 2>/dev/null || echo "$cand"
      return 0
    fi
  done
  return 1
}
PYTHON_BIN="$(find_python)" \
  || die "the $STACK stack needs Python $PYVER; none found. Install it or set PYTHON_BIN=/path/to/python$PYVER."
command -v java >/dev/null 2>&1 || die "Java (17) is needed by pyspark; install a JDK (e.g. apt-get install openjdk-17-jdk-headless)."

if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV with $PYTHON_BIN"
  "$PYTHON_BIN" -m venv "$VENV"
fi
PY="$VENV/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q --upgrade "pip>=24,<26"

# A replica installs every stage under its runtime's pins (with its recorded differences).
PINS=()
if [ -n "$REPLICA" ]; then
  "$PY" "$ROOT/scripts/runtime_pins.py" constraints "$STACK" >"$VENV/replica-constraints.txt"
  PINS=(-c "$VENV/replica-constraints.txt")
fi

say "stage 1/3: the framework ($REQ/framework.txt)"
"${PIP[@]}" install -q -r "$REQ/framework.txt" "${PINS[@]}"

GPU=none
[ "$STACK" != gpu ] || GPU=nccl
if [ "$STACK" = torch ]; then
  # What a PyTorch user installs: hvdrunner alone. A horovod left from an older set-up goes,
  # so this stack's tests prove that nothing compiled is needed.
  say "stage 2/3: no horovod (PyTorch runs on hvdrunner's engine over torch.distributed)"
  "${PIP[@]}" uninstall -q -y horovod 2>/dev/null || true
elif [ "$STACK" = modern ]; then
  # TensorFlow and PyTorch run on hvdrunner's engine: nothing compiled. `make test` adds the
  # compiled horovod for TensorFlow (the parity reference, HVDRUNNER_ENGINE=horovod).
  say "stage 2/3: no horovod to build (TensorFlow and PyTorch run on hvdrunner's engine)"
elif [ -n "$REPLICA" ]; then
  # The runtime ships horovod 0.28.1; hvdrunner's engine runs TensorFlow and PyTorch there
  # unless HVDRUNNER_ENGINE=horovod. Built for TensorFlow, as the lts stack's was.
  say "stage 2/3: horovod from source for TensorFlow (the runtime ships one; the engine is the default)"
  PIP_CONSTRAINT="$VENV/replica-constraints.txt" PYTHON="$PY" \
    HVDRUNNER_HOROVOD_FRAMEWORKS=tensorflow bash "$ROOT/scripts/install_horovod.sh"
else
  say "stage 2/3: horovod from source (the framework + gloo, no MPI; GPU operations: $GPU)"
  PYTHON="$PY" HVDRUNNER_HOROVOD_GPU="$GPU" bash "$ROOT/scripts/install_horovod.sh"
fi

say "stage 3/3: Spark, Arrow, MLflow, dev tools, hvdrunner ($REQ/stack.txt)"
if [ -n "$REPLICA" ]; then
  "${PIP[@]}" install -q -r "$REQ/stack.txt" "${PINS[@]}"
  # On a cluster pyspark is on the interpreter's path with no package metadata (no pip
  # distribution): whatever reads its version from metadata must not work here either.
  "$PY" - <<'PY'
import pathlib, shutil, sysconfig
for meta in pathlib.Path(sysconfig.get_paths()["purelib"]).glob("pyspark-*.dist-info"):
    shutil.rmtree(meta)
PY
else
  "${PIP[@]}" install -q -r "$REQ/stack.txt" -c "$REQ/framework.txt"
fi
# The editable install writes src/hvdrunner.egg-info, shared by every stack's venv: one at a
# time when stacks are set up side by side (.ci/run does).
if command -v flock >/dev/null 2>&1; then
  flock "${TMPDIR:-/tmp}/hvdrunner-editable-$(id -u).lock" "${PIP[@]}" install -q --no-deps -e "$ROOT"
else
  "${PIP[@]}" install -q --no-deps -e "$ROOT"
fi

say "pip check"
if [ -n "$REPLICA" ]; then
  # A cluster's pyspark has no metadata, so pip reports it missing to whoever requires it
  # (petastorm): that line, and only that one, is what the runtime itself shows.
  conflicts="$("${PIP[@]}" check 2>&1 | grep -v -e 'requires pyspark, which is not installed' \
    -e '^No broken requirements' || true)"
  [ -z "$conflicts" ] || die "pip check found conflicts in $VENV: $conflicts"
else
  "${PIP[@]}" check || die "pip check found conflicts in $VENV (see above)"
fi
TF_CPP_MIN_LOG_LEVEL=3 "$PY" -m hvdrunner doctor --quiet || die "hvdrunner doctor failed in $VENV (see above)"
say "environment ready: $VENV"
