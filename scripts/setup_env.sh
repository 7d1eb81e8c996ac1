#!/usr/bin/env bash
# Brings .venv up to the pinned hvdrunner stack. Idempotent: `make` only calls it when a
# requirements file or this script changed, and each stage below checks before it works.
#
# Order matters (see README "Supported stack"):
#   1. TensorFlow 2.15 (Keras 2) + numpy 1.26 + pandas<3
#   2. horovod 0.28.1 compiled from source against that TF, with gloo, without MPI
#   3. pyspark, petastorm, pyarrow 14, mlflow, dev tools, and hvdrunner itself (editable)
# Any missing piece (TF or gloo support in horovod, `pip check`) fails the script loudly.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
PYTHON_BIN="${PYTHON_BIN:-python3.11}"
command -v "$PYTHON_BIN" >/dev/null 2>&1 || PYTHON_BIN=python3
HOROVOD_VERSION="0.28.1"
# Built wheels are cached outside the repo so a fresh clone on the same machine does not
# rebuild horovod (~6.5 min); the key covers everything the binary depends on.
WHEEL_CACHE="${HVDRUNNER_WHEEL_CACHE:-$HOME/.cache/hvdrunner/wheels}"

say() { printf '\n==> [setup %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
die() { printf '\nERROR: %s\n' "$*" >&2; exit 1; }

"$PYTHON_BIN" -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' 2>/dev/null \
  || die "hvdrunner's pinned stack needs Python 3.11 (TF 2.15 + horovod 0.28.1); found $("$PYTHON_BIN" --version 2>&1). Set PYTHON_BIN=/path/to/python3.11."
command -v java >/dev/null 2>&1 || die "Java (17) is needed by pyspark; install a JDK (e.g. apt-get install openjdk-17-jdk-headless)."
command -v cmake >/dev/null 2>&1 || die "cmake is needed to build horovod; install it (apt-get install cmake)."
command -v g++ >/dev/null 2>&1 || die "a C++ compiler is needed to build horovod; install g++."

if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV"
  "$PYTHON_BIN" -m venv "$VENV"
fi
PY="$VENV/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q --upgrade "pip>=24,<26"

say "stage 1/3: TensorFlow stack"
"${PIP[@]}" install -q -r "$ROOT/requirements/stack-1-tensorflow.txt"

say "stage 2/3: horovod $HOROVOD_VERSION (from source: TensorFlow + gloo, no MPI)"
horovod_ok() {
  # Ask horovod's own build checks, not the banner (which claims PyTorch even when absent).
  "$PY" - <<'PY'
import sys
import horovod
from horovod.common.util import gloo_built
try:
    import horovod.tensorflow.mpi_ops  # noqa: F401  (raises when built without TF)
except Exception as exc:  # pragma: no cover - only on a broken build
    sys.exit(f"horovod {horovod.__version__} has no TensorFlow extension: {exc}")
if not gloo_built():
    sys.exit(f"horovod {horovod.__version__} was built without gloo")
print(f"horovod {horovod.__version__}: TensorFlow [X] gloo [X]")
PY
}
installed_hvd="$("$PY" -c 'import importlib.metadata as m; print(m.version("horovod"))' 2>/dev/null || true)"
if [ "$installed_hvd" = "$HOROVOD_VERSION" ] && horovod_ok >/dev/null 2>&1; then
  say "horovod $HOROVOD_VERSION already built with TensorFlow and gloo"
else
  TF_VERSION="$("$PY" -c 'import importlib.metadata as m; print(m.version("tensorflow"))')"
  KEY="horovod-$HOROVOD_VERSION-tf$TF_VERSION-py311-gloo-nompi-$(uname -m)"
  mkdir -p "$WHEEL_CACHE/$KEY"
  if ! ls "$WHEEL_CACHE/$KEY"/horovod-*.whl >/dev/null 2>&1; then
    say "building horovod wheel (2-7 min on 2 cores); build log: $WHEEL_CACHE/$KEY/build.log"
    export HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
           HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_JAX=1 \
           MAKEFLAGS="${MAKEFLAGS:--j2}"
    "${PIP[@]}" install -q cloudpickle psutil pyyaml packaging cffi
    tmp="$(mktemp -d)"
    # Progress: print a heartbeat while the compiler runs, so a long build never looks hung.
    ( while sleep 60; do echo "    ... still compiling horovod ($(date +%H:%M:%S))"; done ) &
    beat=$!
    if ! "${PIP[@]}" wheel --no-build-isolation --no-cache-dir --no-deps -w "$tmp" \
          "horovod==$HOROVOD_VERSION" >"$WHEEL_CACHE/$KEY/build.log" 2>&1; then
      kill "$beat" 2>/dev/null || true
      tail -n 40 "$WHEEL_CACHE/$KEY/build.log" >&2
      die "horovod build failed (full log: $WHEEL_CACHE/$KEY/build.log)"
    fi
    kill "$beat" 2>/dev/null || true
    mv "$tmp"/horovod-*.whl "$WHEEL_CACHE/$KEY/"
    rm -rf "$tmp"
  else
    say "reusing cached horovod wheel $WHEEL_CACHE/$KEY"
  fi
  "${PIP[@]}" install -q --force-reinstall --no-deps "$WHEEL_CACHE/$KEY"/horovod-*.whl
  "${PIP[@]}" install -q cloudpickle psutil pyyaml packaging cffi
  if ! horovod_ok; then
    rm -rf "${WHEEL_CACHE:?}/$KEY"   # never reuse a wheel that failed the check
    die "horovod is installed but unusable (see above). Rebuild: rm -rf .venv && make test"
  fi
fi

say "stage 3/3: Spark, Petastorm, MLflow, dev tools, hvdrunner"
"${PIP[@]}" install -q -r "$ROOT/requirements/stack-3-spark.txt" -c "$ROOT/requirements/stack-1-tensorflow.txt"
"${PIP[@]}" install -q --no-deps -e "$ROOT"

say "pip check"
"${PIP[@]}" check || die "pip check found conflicts in $VENV (see above)"
horovod_ok
say "environment ready: $VENV"
