#!/usr/bin/env bash
# Build (or reuse) and install horovod 0.28.1 against the TensorFlow already installed in
# $PYTHON's environment. The one horovod builder of the project: scripts/setup_stack.sh
# calls it for the local stacks, scripts/databricks/install_horovod.sh on a cluster.
#
#   PYTHON=/path/to/python  HVDRUNNER_WHEEL_CACHE=/dir  bash scripts/install_horovod.sh
#
# Environment:
#   PYTHON                  interpreter whose environment gets horovod (TF must be there)
#   HVDRUNNER_WHEEL_CACHE   where built wheels are kept, one folder per key (default
#                           ~/.cache/hvdrunner/wheels); a later install with the same key
#                           takes seconds instead of minutes
#   HVDRUNNER_HOROVOD_GPU   none (default) | nccl | auto (nccl when nvidia-smi sees a GPU
#                           and nvcc is installed)
#   --print-key             print the wheel cache key (horovod, TF, Python, CUDA, flags) only
#
#   HVDRUNNER_KEEP_INSTALLED_HOROVOD=1
#                           keep a horovod 0.28.1 that is already installed but lacks the
#                           gloo interface patch (e.g. DBR 15.4 LTS ML's): a warning, no
#                           rebuild; hvdrunner then refuses multi-host jobs on hosts whose
#                           hostname resolves to loopback, before hvd.init()
#
# Flags: TensorFlow + gloo, no MPI/MXNet/PyTorch/JAX. Patches (see each file for why):
#   patches/horovod-0.28.1-gloo-process-set-iface.patch  always (multi-host gloo)
#   patches/horovod-0.28.1-no-xla-mpi-ops.patch           TensorFlow >= 2.16
# The wheel cache key carries a digest of the patches applied. The result is checked with
# horovod's own build facts (TF extension imports, gloo_built(), the patch's marker);
# anything missing fails loudly and the cached wheel is dropped.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
HOROVOD_VERSION="0.28.1"
PY="${PYTHON:?set PYTHON to the interpreter whose environment gets horovod}"
WHEEL_CACHE="${HVDRUNNER_WHEEL_CACHE:-$HOME/.cache/hvdrunner/wheels}"
GPU_MODE="${HVDRUNNER_HOROVOD_GPU:-none}"
XLA_PATCH="$ROOT/patches/horovod-$HOROVOD_VERSION-no-xla-mpi-ops.patch"
IFACE_PATCH="$ROOT/patches/horovod-$HOROVOD_VERSION-gloo-process-set-iface.patch"
PIP=("$PY" -m pip --disable-pip-version-check)

say() { printf '==> [horovod %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
die() { printf 'ERROR: %s\n' "$*" >&2; exit 1; }

horovod_ok() {
  # Ask horovod's own build checks, not the --check-build banner (it claims PyTorch even
  # when absent). Exit 3: usable, but without the gloo interface patch.
  "$PY" - <<'PY'
import importlib.util, sys
import horovod
from horovod.common.util import gloo_built
try:
    import horovod.tensorflow.mpi_ops  # noqa: F401  (raises when built without TF)
except Exception as exc:
    sys.exit(f"horovod {horovod.__version__} has no TensorFlow extension: {exc}")
if not gloo_built():
    sys.exit(f"horovod {horovod.__version__} was built without gloo")
if importlib.util.find_spec("horovod._hvdrunner_gloo_iface") is None:
    print(f"horovod {horovod.__version__}: TensorFlow [X] gloo [X] gloo-iface patch [ ]")
    sys.exit(3)
print(f"horovod {horovod.__version__}: TensorFlow [X] gloo [X] gloo-iface patch [X]")
PY
}

read -r TF_VERSION PYV NEEDS_PATCH < <("$PY" - <<'PY' 2>/dev/null
import importlib.metadata as m, sys
try:
    v = m.version("tensorflow")
except m.PackageNotFoundError:
    sys.exit(0)
major, minor = (int(x) for x in v.split(".")[:2])
print(v, f"{sys.version_info[0]}{sys.version_info[1]}", int((major, minor) >= (2, 16)))
PY
) || true
[ -n "${TF_VERSION:-}" ] || die "TensorFlow is not installed for $PY: install it first (horovod compiles against it)."

case "$GPU_MODE" in
  none) GPU_TAG="cpu" ;;
  nccl) GPU_TAG="cuda" ;;
  auto)
    GPU_MODE=none; GPU_TAG="cpu"
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
      if command -v nvcc >/dev/null 2>&1; then
        GPU_MODE=nccl; GPU_TAG="cuda"
      else
        say "WARNING: GPUs found but no nvcc (CUDA toolkit): building without NCCL; allreduce runs over gloo on host memory"
      fi
    fi ;;
  *) die "HVDRUNNER_HOROVOD_GPU must be none, nccl or auto (got '$GPU_MODE')" ;;
esac
if [ "$GPU_TAG" = "cuda" ]; then
  command -v nvcc >/dev/null 2>&1 || die "HOROVOD GPU build needs nvcc on PATH (CUDA toolkit)."
  GPU_TAG="cuda$(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
fi
PATCHES=("$IFACE_PATCH"); PATCH_TAG=""
if [ "$NEEDS_PATCH" = "1" ]; then PATCHES+=("$XLA_PATCH"); PATCH_TAG="-noxla"; fi
for p in "${PATCHES[@]}"; do [ -f "$p" ] || die "the horovod patch $p is missing"; done
# The patches' own bytes are in the key: an edited patch is a different binary.
PATCH_SUM="$(cat "${PATCHES[@]}" | sha256sum | cut -c1-10)"
KEY="horovod-$HOROVOD_VERSION-tf$TF_VERSION-py$PYV-$GPU_TAG-gloo-nompi$PATCH_TAG-p$PATCH_SUM-$(uname -m)"
DIR="$WHEEL_CACHE/$KEY"
if [ "${1:-}" = "--print-key" ]; then echo "$KEY"; exit 0; fi
mkdir -p "$DIR" || die "cannot create the wheel cache $DIR (set HVDRUNNER_WHEEL_CACHE)"

installed="$("$PY" -c 'import importlib.metadata as m; print(m.version("horovod"))' 2>/dev/null || true)"
if [ "$installed" = "$HOROVOD_VERSION" ]; then
  rc=0; horovod_ok >/dev/null 2>&1 || rc=$?
  if [ "$rc" = 0 ]; then
    say "horovod $HOROVOD_VERSION already installed with TensorFlow, gloo and hvdrunner's patches"
    exit 0
  elif [ "$rc" = 3 ] && [ "${HVDRUNNER_KEEP_INSTALLED_HOROVOD:-0}" = 1 ]; then
    say "WARNING: keeping the installed horovod $HOROVOD_VERSION, which lacks $(basename "$IFACE_PATCH"): multi-host jobs need every host's name to resolve to its cluster address (hvdrunner checks before hvd.init())"
    exit 0
  elif [ "$rc" = 3 ]; then
    say "the installed horovod $HOROVOD_VERSION lacks $(basename "$IFACE_PATCH") (multi-host gloo): replacing it"
  fi
fi
"${PIP[@]}" install -q cloudpickle psutil pyyaml packaging cffi
if ls "$DIR"/horovod-*.whl >/dev/null 2>&1; then
  say "reusing cached wheel $DIR"
else
  command -v cmake >/dev/null 2>&1 || die "cmake is needed to build horovod (apt-get install cmake)."
  command -v g++ >/dev/null 2>&1 || die "a C++ compiler is needed to build horovod (apt-get install g++)."
  cmake_major="$(cmake --version | sed -n 's/^cmake version \([0-9]*\).*/\1/p')"
  [ "${cmake_major:-3}" -lt 4 ] || die "cmake $(cmake --version | head -1) rejects horovod 0.28.1's CMake files; put cmake 3.x first on PATH (e.g. pip install 'cmake<4')."
  export HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
         HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_JAX=1 \
         MAKEFLAGS="${MAKEFLAGS:--j$(nproc)}"
  [ "$GPU_MODE" = "nccl" ] && export HOROVOD_GPU_OPERATIONS=NCCL
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  say "downloading the horovod $HOROVOD_VERSION sdist"
  "${PIP[@]}" download -q --no-binary :all: --no-deps -d "$tmp" "horovod==$HOROVOD_VERSION"
  tar -xzf "$tmp"/horovod-"$HOROVOD_VERSION".tar.gz -C "$tmp"
  src="$tmp/horovod-$HOROVOD_VERSION"
  for p in "${PATCHES[@]}"; do
    say "applying $(basename "$p")"
    (cd "$src" && patch -p1 --forward --quiet < "$p") || die "the horovod patch $(basename "$p") did not apply"
  done
  say "building $KEY (minutes: ~3 on 2 cores for TF 2.15, ~10-15 for TF 2.21); log: $DIR/build.log"
  # A heartbeat while the compiler runs, so a long build never looks hung.
  ( while sleep 60; do say "... still compiling horovod"; done ) &
  beat=$!
  if ! "${PIP[@]}" wheel --no-build-isolation --no-cache-dir --no-deps -w "$tmp/wheel" "$src" \
        >"$DIR/build.log" 2>&1; then
    kill "$beat" 2>/dev/null || true
    tail -n 40 "$DIR/build.log" >&2
    die "horovod build failed (full log: $DIR/build.log)"
  fi
  kill "$beat" 2>/dev/null || true
  # Copy then rename: a cluster killed mid-copy never leaves a half wheel in a shared cache.
  whl="$(ls "$tmp"/wheel/horovod-*.whl)"
  cp "$whl" "$DIR/.partial" && mv "$DIR/.partial" "$DIR/$(basename "$whl")"
fi
"${PIP[@]}" install -q --force-reinstall --no-deps "$DIR"/horovod-*.whl
if ! horovod_ok; then
  rm -f "$DIR"/horovod-*.whl   # never reuse a wheel that failed the check
  die "horovod is installed but unusable (see above); the cached wheel was removed, rerun to rebuild"
fi
