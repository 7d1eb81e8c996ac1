#!/usr/bin/env bash
# Brings one stack's venv up to its pins:  STACK=15.4|16.4|17.3|18|19|gpu bash scripts/setup_stack.sh
# Idempotent: `make` calls it only when a requirements file or a script changed, and each
# stage below checks before it works.
#
# A runtime replica (STACK=15.4, 16.4, 17.3, 18, 19: a folder requirements/<runtime>/ with runtime.txt)
# installs every stage under Databricks' own pins for that runtime (scripts/runtime_pins.py),
# with its Python, and ends as a cluster does: pyspark importable without package metadata.
#   15.4    15.4 LTS ML: Python 3.11, TF 2.16.1 (Keras 3.2.1, tf-keras 2.16.0), torch 2.3.1,
#           pyspark 3.5.0, pyarrow 14, petastorm 0.12.1, mlflow-skinny 2.13.1, horovod 0.28.1
#           built for TensorFlow (the runtime ships one)
#   18      18 LTS ML (the default): Python 3.12, TF 2.20 (Keras 3.12, tf-keras 2.20.1), torch
#           2.9.0, pyspark 4.1.0, pyarrow 21, mlflow 3.8.1; nothing compiled (make test adds
#           the compiled horovod for TensorFlow, the engine's parity reference)
#   19      19 ML: Python 3.12, torch 2.12.0, pyspark 4.2.0, mlflow 3.12.0, no TensorFlow and
#           no horovod (Keras 3.15 added, as a user would, for Keras on PyTorch)
#   16.4    16.4 LTS ML (TF 2.17, Keras 3.9, torch 2.6, Spark 3.5.2, MLflow 2.21.3) and 17.3 LTS
#   17.3    ML (TF 2.19, Keras 3.5, torch 2.7, Spark 4.0.0, MLflow 3.0.1): CI's smoke replicas
#   gpu     no replica: Python 3.11, torch 2.14 (CUDA 13.0) + the registry's nvcc, horovod with
#           CUDA + NCCL (built here with no GPU; the tests run its CPU paths): the stack that
#           keeps a compiled horovod.torch (unchanged-import and parity tests)
#
# Order matters: 1. the framework (requirements/<stack>/framework.txt); 2. horovod from source
# against it (scripts/install_horovod.sh; only where the runtime ships one, and on gpu); 3. Spark,
# Arrow, MLflow, dev tools and hvdrunner itself (editable). Any missing piece (the framework's
# or gloo support in horovod, `pip check`) fails loudly.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STACK="${STACK:-18}"
REPLICA=  # a runtime replica: its pins come from requirements/<runtime>/runtime.txt
if [ "$STACK" = gpu ]; then
  PYVER=3.11  # on 3.11 pip takes torch 2.14.1's CUDA wheel and its nvidia-* from disk
elif [ -f "$ROOT/requirements/$STACK/runtime.txt" ] && [ -f "$ROOT/requirements/$STACK/framework.txt" ]; then
  REPLICA=1
  PYVER="$(sed -n 's/^# python \([0-9.]*\)$/\1/p' "$ROOT/requirements/$STACK/runtime.txt")"
else
  printf 'ERROR: STACK must be a runtime replica (15.4, 16.4, 17.3, 18, 19) or gpu (got %s)\n' "$STACK" >&2; exit 2
fi
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
"${PIP[@]}" install -q --upgrade "pip>=24,<26" "uv==0.13.9"

# The framework and the stack install with uv: it downloads and unpacks in parallel and
# links from its cache, where pip does one file at a time on one core (a 16.4 set-up alone:
# pip 4m05s and 231 CPU-seconds; uv 1m57s and 124, docs/testing.md). uv reads neither pip.conf
# nor PIP_* variables, so pip's own settings (indexes, find-links, constraints) are handed on,
# and it weighs every index as pip does (unsafe-best-match). If uv fails, pip runs the same
# install, saying so: pip is the reference.
mapfile -t FROM_PIP < <("$PY" - <<'PY'
from pip._internal.configuration import Configuration  # pip's own reading of its settings

conf = Configuration(isolated=False)
conf.load()
flags = {"index-url": "--index-url", "extra-index-url": "--extra-index-url",
         "find-links": "--find-links", "constraint": "--constraint"}
for key, value in conf.items():
    flag = flags.get(key.partition(".")[2])
    for item in value.split() if flag else ():
        print(flag)
        print(item)
PY
)
install() {  # install ARGS...: pip install's arguments, run by uv (pip if uv fails)
  "$VENV/bin/uv" pip install -q --python "$PY" --index-strategy unsafe-best-match \
    --find-links "$BUILT" "${FROM_PIP[@]}" "$@" && return 0
  say "uv failed (above); pip installs the same instead"
  "${PIP[@]}" install -q "$@"
}
# Every stage installs under the stack's pins: a replica's runtime (with its recorded
# differences), gpu's framework file.
if [ -n "$REPLICA" ]; then
  "$PY" "$ROOT/scripts/runtime_pins.py" constraints "$STACK" >"$VENV/replica-constraints.txt"
  PINS=(-c "$VENV/replica-constraints.txt")
else
  PINS=(-c "$REQ/framework.txt")
fi

# Source distributions (pyspark: 300 MB, mostly jars; an old psutil on a newer Python) are
# built by pip, which keeps each wheel it built in its cache for every later set-up (CI keeps
# that cache); uv takes them from here instead of building its own each time (CI deletes
# uv's cache with each wave).
BUILT="$VENV/.built-wheels"
{ grep -E '^pyspark([^A-Za-z0-9_.-]|$)' "$REQ/stack.txt"; echo psutil; } >"$VENV/.sdists.txt"
"${PIP[@]}" wheel -q --no-deps -w "$BUILT" -r "$VENV/.sdists.txt" "${PINS[@]}"

say "stage 1/3: the framework ($REQ/framework.txt)"
install -r "$REQ/framework.txt" "${PINS[@]}"

if [ -n "$REPLICA" ] && grep -q '^horovod==' "$ROOT/requirements/$STACK/runtime.txt"; then
  # The runtime ships horovod 0.28.1; hvdrunner's engine runs TensorFlow and PyTorch there
  # unless HVDRUNNER_ENGINE=horovod. Built for TensorFlow, as the runtime's is.
  say "stage 2/3: horovod from source for TensorFlow (the runtime ships one; the engine is the default)"
  PIP_CONSTRAINT="$VENV/replica-constraints.txt" PYTHON="$PY" \
    HVDRUNNER_HOROVOD_FRAMEWORKS=tensorflow bash "$ROOT/scripts/install_horovod.sh"
elif [ -n "$REPLICA" ]; then
  # What a user installs on this runtime: hvdrunner alone. TensorFlow and PyTorch run on
  # hvdrunner's engine; a horovod left from an older set-up goes, so the tests prove that
  # nothing compiled is needed (`make test` on 18 adds it back: the parity reference).
  say "stage 2/3: no horovod (the runtime ships none; hvdrunner's engine over torch.distributed)"
  "${PIP[@]}" uninstall -q -y horovod 2>/dev/null || true
  rm -f "$VENV/.hvdrunner-horovod-stamp"
else
  say "stage 2/3: horovod from source (torch + gloo, no MPI; GPU operations: NCCL)"
  PYTHON="$PY" HVDRUNNER_HOROVOD_GPU=nccl bash "$ROOT/scripts/install_horovod.sh"
fi

say "stage 3/3: Spark, Arrow, MLflow, dev tools, hvdrunner ($REQ/stack.txt)"
install -r "$REQ/stack.txt" "${PINS[@]}"
if [ -n "$REPLICA" ]; then
  # On a cluster pyspark is on the interpreter's path with no package metadata (no pip
  # distribution): whatever reads its version from metadata must not work here either.
  "$PY" - <<'PY'
import pathlib, shutil, sysconfig
for meta in pathlib.Path(sysconfig.get_paths()["purelib"]).glob("pyspark-*.dist-info"):
    shutil.rmtree(meta)
PY
fi
# The editable install writes src/hvdrunner.egg-info, shared by every stack's venv: one at a
# time when stacks are set up side by side (.ci/run does).
if command -v flock >/dev/null 2>&1; then
  flock "${TMPDIR:-/tmp}/hvdrunner-editable-$(id -u).lock" "${PIP[@]}" install -q --no-deps -e "$ROOT"
else
  "${PIP[@]}" install -q --no-deps -e "$ROOT"
fi

rm -rf "$BUILT" "$VENV/.sdists.txt"  # installed now (300 MB)

# Byte-code is written as each module is first imported, into this venv, also where
# PYTHONDONTWRITEBYTECODE=1 is set (the shell of the machine these figures come from): a .pth
# line turns writing back on for this venv's interpreters, and for nothing else. Without
# either, every rank compiled TensorFlow's modules again on import (tried: the 18 suite ran
# far slower); compiling all of them up front (compileall on every core) cost 104 CPU-seconds
# on 18's venv (40,242 modules), where two tests that train, log and load a Keras model wrote
# the 5,503 they import for 22 CPU-seconds (docs/testing.md).
"$PY" - <<'PY'
import pathlib, sysconfig
pth = pathlib.Path(sysconfig.get_paths()["purelib"]) / "hvdrunner-write-bytecode.pth"
pth.write_text("import sys; sys.dont_write_bytecode = False\n")
PY

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
