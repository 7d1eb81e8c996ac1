#!/usr/bin/env bash
# Build (or reuse) and install horovod 0.28.1 against the TensorFlow and/or PyTorch already
# installed in $PYTHON's environment (each one found gets its extension; at least one). The one horovod builder of the project: scripts/setup_stack.sh
# calls it for the local stacks, scripts/databricks/build_horovod_wheel.py (the bundle's wheel
# job) on a Databricks cluster.
#
#   PYTHON=/path/to/python  HVDRUNNER_WHEEL_CACHE=/dir  bash scripts/install_horovod.sh
#
# Environment:
#   PYTHON                  interpreter whose environment gets horovod (TF and/or torch there)
#   HVDRUNNER_WHEEL_CACHE   where built wheels are kept, one folder per key (default
#                           ~/.cache/hvdrunner/wheels); a later install with the same key
#                           takes seconds instead of minutes
#   HVDRUNNER_HOROVOD_GPU   none (default) | nccl | auto (nccl when nvidia-smi sees a GPU).
#                           nccl needs nvcc on PATH and NCCL (nccl.h + libnccl.so: found in
#                           HOROVOD_NCCL_HOME, /usr, /usr/local/cuda or the nvidia-nccl pip
#                           package) and fails naming what is missing; a GPU node is never
#                           given a CPU-only build unless `none` says so (with a warning)
#   HVDRUNNER_CUDA_ARCHS    GPU builds: compute capabilities to compile the CUDA kernels for
#                           (e.g. 90 or 80,90; the highest also as PTX for newer GPUs;
#                           `all`: every one nvcc knows, horovod's own default, ~10x the
#                           compile). Default: this node's GPUs (nvidia-smi), else nvcc's
#                           oldest (its PTX runs on any newer GPU). In the key as -smNN.MM
#   HVDRUNNER_HOROVOD_FRAMEWORKS
#                           all (default: each framework installed) | tensorflow | torch:
#                           which of the installed frameworks horovod is compiled for
#   --wheel                 always leave the wheel in the cache (build it if missing), even
#                           when a good horovod is already installed; then install it
#   --print-key             print the wheel cache key (horovod, TF, torch, Python, CUDA, flags)
#
#   HVDRUNNER_KEEP_INSTALLED_HOROVOD=1
#                           keep a horovod 0.28.1 that is already installed but lacks the
#                           patches every build carries (e.g. DBR 15.4 LTS ML's): a warning, no
#                           rebuild; hvdrunner then refuses multi-host jobs on hosts whose
#                           hostname resolves to loopback, before hvd.init()
#
# Flags: gloo, TensorFlow and/or PyTorch (whichever is installed), no MPI/MXNet/JAX.
# Patches (see each file for why):
#   patches/horovod-0.28.1-gloo-process-set-iface.patch  always (multi-host gloo)
#   patches/horovod-0.28.1-rendezvous-scopes.patch        always (hvd.init() after shutdown)
#   patches/horovod-0.28.1-no-xla-mpi-ops.patch           TensorFlow >= 2.16
#   patches/horovod-0.28.1-torch-cxx17.patch              torch >= 2.1
#   patches/horovod-0.28.1-torch-cxx20.patch              torch >= 2.14 (after the one above)
#   patches/horovod-0.28.1-idle-wait.patch                with PyTorch (HOROVOD_IDLE_WAIT_MS,
#                                                         which hvdrunner.torch.fit sets; opt-in)
# The wheel cache key carries a digest of the patches applied. The result is checked with
# horovod's own build facts (each extension imports, gloo_built(), the patches' markers);
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
RENDEZVOUS_PATCH="$ROOT/patches/horovod-$HOROVOD_VERSION-rendezvous-scopes.patch"
TORCH_PATCH="$ROOT/patches/horovod-$HOROVOD_VERSION-torch-cxx17.patch"
TORCH20_PATCH="$ROOT/patches/horovod-$HOROVOD_VERSION-torch-cxx20.patch"
IDLE_PATCH="$ROOT/patches/horovod-$HOROVOD_VERSION-idle-wait.patch"
PIP=("$PY" -m pip --disable-pip-version-check)

say() { printf '==> [horovod %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
die() { printf 'ERROR: %s\n' "$*" >&2; exit 1; }

horovod_ok() {
  # Ask horovod's own build checks, not the --check-build banner (it claims PyTorch even
  # when absent: import the extension itself). Exit 3: usable, but without the gloo
  # interface patch.
  # TF_CPP_MIN_LOG_LEVEL=3: TensorFlow's C++ start-up lines (cuDNN/cuFFT factories, CPU
  # features) are not news in a set-up's output.
  TF_CPP_MIN_LOG_LEVEL=3 HVDRUNNER_EXPECT_TF="$TF_VERSION" HVDRUNNER_EXPECT_TORCH="$TORCH_VERSION" "$PY" - <<'PY'
import importlib.util, os, sys
import horovod
from horovod.common.util import gloo_built, nccl_built
have = []
for name, want, module in (("TensorFlow", "HVDRUNNER_EXPECT_TF", "horovod.tensorflow.mpi_ops"),
                           ("PyTorch", "HVDRUNNER_EXPECT_TORCH", "horovod.torch.mpi_lib_v2")):
    if not os.environ.get(want):
        continue
    try:
        __import__(module)  # raises when built without this framework
    except Exception as exc:
        sys.exit(f"horovod {horovod.__version__} has no {name} extension: {exc}")
    have.append(name)
if not gloo_built():
    sys.exit(f"horovod {horovod.__version__} was built without gloo")
if os.environ.get("HVDRUNNER_EXPECT_NCCL") == "1":
    # Each framework extension's own build facts (horovod.common.util has no cuda_built).
    for name in have:
        ext = __import__({"TensorFlow": "horovod.tensorflow", "PyTorch": "horovod.torch"}[name],
                         fromlist=["cuda_built"])
        if not (ext.cuda_built() and ext.nccl_built()):
            sys.exit(f"horovod {horovod.__version__}'s {name} extension was built without CUDA/NCCL although a GPU build was asked for")
    have.append("CUDA + NCCL")
if os.environ.get("HVDRUNNER_EXPECT_TORCH"):
    try:  # VERSION 2: a single tensor's round gathers for one cycle (what HorovodRunner's default is for)
        from horovod._hvdrunner_idle_wait import VERSION as idle_wait
    except ImportError:
        idle_wait = 0
    if idle_wait < 2:
        sys.exit(f"horovod {horovod.__version__} lacks patches/horovod-0.28.1-idle-wait.patch's current version (PyTorch builds carry it)")
facts = " ".join(f"{n} [X]" for n in have) + " gloo [X]"
# The patches every build carries (their marker modules); exit 3: usable, but without them.
marks = {name: importlib.util.find_spec(f"horovod._hvdrunner_{module}") is not None
         for name, module in (("gloo-iface", "gloo_iface"), ("rendezvous-scopes", "rendezvous"))}
facts += "".join(f" {name} patch [{'X' if ok else ' '}]" for name, ok in marks.items())
print(f"horovod {horovod.__version__}: {facts}")
if not all(marks.values()):
    sys.exit(3)
PY
}

read -r TF_VERSION TORCH_VERSION PYV NEEDS_XLA_PATCH NEEDS_TORCH_PATCH NEEDS_TORCH20_PATCH < <("$PY" - <<'PY' 2>/dev/null
import importlib.metadata as m, sys
def version(name):
    try:
        return m.version(name)
    except m.PackageNotFoundError:
        return ""
def at_least(v, floor):
    return bool(v) and tuple(int(x) for x in v.split("+")[0].split(".")[:2]) >= floor
tf, torch = version("tensorflow"), version("torch")
print(tf or "-", torch or "-", f"{sys.version_info[0]}{sys.version_info[1]}",
      int(at_least(tf, (2, 16))), int(at_least(torch, (2, 1))), int(at_least(torch, (2, 14))))
PY
) || true
[ "${TF_VERSION:--}" = "-" ] && TF_VERSION=""
[ "${TORCH_VERSION:--}" = "-" ] && TORCH_VERSION=""
# A stack whose PyTorch runs on hvdrunner's engine compiles horovod for TensorFlow only.
case "${HVDRUNNER_HOROVOD_FRAMEWORKS:-all}" in
  all) ;;
  tensorflow) TORCH_VERSION=""; NEEDS_TORCH_PATCH=0; NEEDS_TORCH20_PATCH=0 ;;
  torch) TF_VERSION=""; NEEDS_XLA_PATCH=0 ;;
  *) die "HVDRUNNER_HOROVOD_FRAMEWORKS must be all, tensorflow or torch (got ${HVDRUNNER_HOROVOD_FRAMEWORKS})" ;;
esac
[ -n "$TF_VERSION$TORCH_VERSION" ] || die "neither TensorFlow nor PyTorch is installed for $PY: install one first (horovod compiles against it)."
FW_TAG=""
[ -z "$TF_VERSION" ] || FW_TAG="tf$TF_VERSION"
# torch's local version (+cpu, +cu124) says which build it is: keep it in the key.
[ -z "$TORCH_VERSION" ] || FW_TAG="${FW_TAG:+$FW_TAG-}torch${TORCH_VERSION/+/}"
FW_NAMES="${TF_VERSION:+TensorFlow}"
[ -z "$TORCH_VERSION" ] || FW_NAMES="${FW_NAMES:+$FW_NAMES + }PyTorch"

has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }

find_nccl() {
  # NCCL's header and library: HOROVOD_NCCL_HOME, then the system (libnccl-dev), the CUDA
  # toolkit, then the pip package nvidia-nccl-cu* (what torch installs). Prints "INCLUDE LIB".
  # HVDRUNNER_NCCL_SEARCH replaces the folders searched after HOROVOD_NCCL_HOME (all of them).
  local d pip_nccl
  pip_nccl="$("$PY" -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null || true)"
  for d in "${HOROVOD_NCCL_HOME:-}" ${HVDRUNNER_NCCL_SEARCH:-/usr /usr/local/cuda /usr/local/nccl $pip_nccl}; do
    [ -n "$d" ] && [ -f "$d/include/nccl.h" ] || continue
    for lib in "$d/lib" "$d/lib64" "$d/lib/$(uname -m)-linux-gnu" "/usr/lib/$(uname -m)-linux-gnu"; do
      if ls "$lib"/libnccl.so* >/dev/null 2>&1; then echo "$d/include $lib"; return 0; fi
    done
  done
  return 1
}

STAGE=""
cleanup() { rm -rf "${STAGE:-}" "${tmp:-}"; }
trap cleanup EXIT
stage() {  # stage NAME: a build-time folder of links (removed on exit)
  [ -n "$STAGE" ] || STAGE="$(mktemp -d)"
  mkdir -p "$STAGE/$1" && echo "$STAGE/$1"
}

pip_cuda_home() {
  # The registry's CUDA toolkit in $PY's environment (cuda-toolkit[nvcc]: nvidia/cuXX/bin/nvcc).
  "$PY" - <<'PY' 2>/dev/null
import glob, os, nvidia
homes = [os.path.dirname(os.path.dirname(n)) for b in nvidia.__path__
         for n in glob.glob(os.path.join(b, "cu*", "bin", "nvcc"))]
print(max(homes, key=lambda h: int(os.path.basename(h)[2:] or 0)) if homes else "")
PY
}

use_cuda_home() {
  # A CUDA toolkit laid out as the registry's wheels are (lib/ only, no unversioned
  # libcudart.so, no lib64/ where nvcc and CMake look) is staged as a /usr/local/cuda-like
  # folder of links; a system toolkit is used as it is. Either way its bin/ goes first on PATH.
  local home="$1" s f
  if [ ! -e "$home/lib64" ] && [ -f "$home/lib/libcudart_static.a" ]; then
    s="$(stage cuda)"
    mkdir -p "$s/bin" "$s/lib64"
    for f in "$home"/bin/*; do ln -s "$f" "$s/bin/"; done  # nvcc finds its libraries at bin/..
    for f in "$home"/lib/*; do ln -s "$f" "$s/lib64/"; done
    for f in "$home"/lib/libcudart.so.*; do ln -sf "$f" "$s/lib64/libcudart.so"; done
    ln -s "$home/include" "$s/include"
    [ ! -d "$home/nvvm" ] || ln -s "$home/nvvm" "$s/nvvm"
    say "using the registry's CUDA toolkit $home (staged in $s)" >&2
    home="$s"
  fi
  export PATH="$home/bin:$PATH" CUDA_HOME="$home" HOROVOD_CUDA_HOME="$home"
}

gpu_fix="install the CUDA compiler and NCCL headers matching the node's CUDA (Databricks' Horovod page: apt-get install cuda-nvcc-<major>-<minor> libnccl-dev; or pip install nvidia-nccl-cu12 and set HOROVOD_NCCL_HOME), or choose a CPU-only build explicitly with HVDRUNNER_HOROVOD_GPU=none (allreduce then runs over gloo in host memory, much slower on GPUs)"
case "$GPU_MODE" in
  none)
    GPU_TAG="cpu"
    if has_gpu; then
      say "WARNING: this node has GPUs but HVDRUNNER_HOROVOD_GPU=none: building horovod without NCCL, as asked; allreduce will copy tensors to host memory and run over gloo"
    fi ;;
  nccl) GPU_TAG="cuda" ;;
  auto)
    # GPUs decide; a GPU node never silently gets a CPU-only build.
    if has_gpu; then GPU_MODE=nccl; GPU_TAG="cuda"; else GPU_MODE=none; GPU_TAG="cpu"; fi ;;
  *) die "HVDRUNNER_HOROVOD_GPU must be none, nccl or auto (got '$GPU_MODE')" ;;
esac
nvcc_home() {
  # The toolkit folder of the nvcc on PATH, also through a wrapper script: nvcc's own TOP.
  local top
  top="$(nvcc --dryrun -x cu -c /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -1)"
  if [ -n "$top" ] && [ -d "$top" ]; then (cd "$top" && pwd); else (cd "$(dirname "$(command -v nvcc)")/.." && pwd); fi
}

nvcc_archs() {  # the architectures this nvcc compiles for, ascending ("75 80 86 ...")
  nvcc --list-gpu-arch 2>/dev/null | sed -n 's/^compute_\([0-9]*\)$/\1/p' | sort -n | tr '\n' ' '
}

cuda_archs() {
  # Which GPU architectures the CUDA kernels are compiled for (comma list, ascending), and why.
  # Unnarrowed, horovod compiles for every architecture nvcc knows (a dozen, most of a GPU
  # build's time) although a node runs one. HVDRUNNER_CUDA_ARCHS wins; else the GPUs this
  # node has (nvidia-smi's compute capability: a Databricks build node is the kind its jobs
  # run on); else, with no GPU (CI), the oldest architecture nvcc supports: its PTX is then
  # compiled by the driver for whatever GPU loads it.
  local archs="" known
  known="$(nvcc_archs)"
  if [ "${HVDRUNNER_CUDA_ARCHS:-}" = all ]; then
    archs="$(printf '%s' "$known" | tr ' ' ',' | sed 's/,$//')"
    [ -n "$archs" ] || die "nvcc --list-gpu-arch listed no architecture; set HVDRUNNER_CUDA_ARCHS (e.g. 90)"
    say "CUDA architectures: every one nvcc knows, $archs (HVDRUNNER_CUDA_ARCHS=all: one wheel for mixed GPU generations)" >&2
  elif [ -n "${HVDRUNNER_CUDA_ARCHS:-}" ]; then
    archs="$(printf '%s' "$HVDRUNNER_CUDA_ARCHS" | tr -d ' .')"
    printf '%s' "$archs" | grep -Eq '^[0-9]+(,[0-9]+)*$' \
      || die "HVDRUNNER_CUDA_ARCHS must list compute capabilities like 80,90 or 8.0,9.0 (got '$HVDRUNNER_CUDA_ARCHS')"
    say "CUDA architectures: $archs (HVDRUNNER_CUDA_ARCHS)" >&2
  elif has_gpu && archs="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | tr -d ' .' | grep -E '^[0-9]+$' | sort -un | paste -sd, -)" && [ -n "$archs" ]; then
    say "CUDA architectures: $archs (this node's GPUs, nvidia-smi), with PTX for newer GPUs; HVDRUNNER_CUDA_ARCHS overrides" >&2
  else
    archs="${known%% *}"
    [ -n "$archs" ] || die "nvcc --list-gpu-arch listed no architecture; set HVDRUNNER_CUDA_ARCHS (e.g. 90)"
    local why="no GPU on this node"
    ! has_gpu || why="nvidia-smi reported no compute capability"
    say "CUDA architectures: $archs ($why: nvcc's oldest, whose PTX any newer GPU compiles at load time); HVDRUNNER_CUDA_ARCHS overrides" >&2
  fi
  local cc
  for cc in ${archs//,/ }; do
    [ -z "$known" ] || [[ " $known " == *" $cc "* ]] \
      || die "this nvcc cannot compile for compute capability $cc (it knows: $known); set HVDRUNNER_CUDA_ARCHS to ones it knows"
  done
  printf '%s\n' "$(printf '%s\n' ${archs//,/ } | sort -un | paste -sd, -)"
}

if [ "$GPU_TAG" = "cuda" ]; then
  # The registry's toolkit installed beside the framework (the gpu stack: the CUDA torch was
  # built for) wins over another nvcc on PATH; HOROVOD_CUDA_HOME wins over both.
  if [ -n "${HOROVOD_CUDA_HOME:-}" ]; then
    use_cuda_home "$HOROVOD_CUDA_HOME"
  elif pip_home="$(pip_cuda_home)" && [ -n "$pip_home" ]; then
    use_cuda_home "$pip_home"
  elif command -v nvcc >/dev/null 2>&1; then
    use_cuda_home "$(nvcc_home)"
  fi
  command -v nvcc >/dev/null 2>&1 || die "a GPU (NCCL) build of horovod needs nvcc on PATH (or the registry's cuda-toolkit[nvcc] for CUDA >= 13), which this node lacks: $gpu_fix."
  read -r NCCL_INCLUDE NCCL_LIB < <(find_nccl) || die "a GPU (NCCL) build of horovod needs nccl.h and libnccl.so, found in none of HOROVOD_NCCL_HOME, /usr, /usr/local/cuda, the nvidia-nccl pip package: $gpu_fix."
  if [ ! -e "$NCCL_LIB/libnccl.so" ] && [ ! -e "$NCCL_LIB/libnccl_static.a" ]; then
    # The pip package ships only libnccl.so.2; horovod's FindNCCL.cmake wants libnccl.so.
    so="$(ls "$NCCL_LIB"/libnccl.so.* | head -1)"
    NCCL_LIB="$(stage nccl-lib)"
    ln -s "$so" "$NCCL_LIB/libnccl.so"
  fi
  export HOROVOD_NCCL_INCLUDE="$NCCL_INCLUDE" HOROVOD_NCCL_LIB="$NCCL_LIB" HVDRUNNER_EXPECT_NCCL=1
  nccl_version="$(sed -n 's/^#define NCCL_\(MAJOR\|MINOR\|PATCH\) *\([0-9]*\).*/\2/p' "$NCCL_INCLUDE/nccl.h" | head -3 | paste -sd. -)"
  CUDA_ARCHS="$(cuda_archs)" || exit 1
  # Horovod's build (cmake/build_utils.py) compiles its kernels for exactly this list and
  # adds PTX for the highest entry, which newer GPUs compile at load time.
  export HOROVOD_BUILD_CUDA_CC_LIST="$CUDA_ARCHS"
  GPU_TAG="cuda$(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')-nccl${nccl_version:-unknown}-sm${CUDA_ARCHS//,/.}"
fi
PATCHES=("$IFACE_PATCH" "$RENDEZVOUS_PATCH"); PATCH_TAG=""
if [ "$NEEDS_XLA_PATCH" = "1" ]; then PATCHES+=("$XLA_PATCH"); PATCH_TAG="-noxla"; fi
if [ "$NEEDS_TORCH_PATCH" = "1" ]; then PATCHES+=("$TORCH_PATCH"); PATCH_TAG="$PATCH_TAG-torchcxx17"; fi
if [ "$NEEDS_TORCH20_PATCH" = "1" ]; then PATCHES+=("$TORCH20_PATCH"); PATCH_TAG="$PATCH_TAG-torchcxx20"; fi
# Framework-neutral code, applied where it is measured: PyTorch builds (torch fit's buckets).
if [ -n "$TORCH_VERSION" ]; then PATCHES+=("$IDLE_PATCH"); PATCH_TAG="$PATCH_TAG-idlewait"; fi
for p in "${PATCHES[@]}"; do [ -f "$p" ] || die "the horovod patch $p is missing"; done
# The patches' own bytes are in the key: an edited patch is a different binary.
PATCH_SUM="$(cat "${PATCHES[@]}" | sha256sum | cut -c1-10)"
KEY="horovod-$HOROVOD_VERSION-$FW_TAG-py$PYV-$GPU_TAG-gloo-nompi$PATCH_TAG-p$PATCH_SUM-$(uname -m)"
DIR="$WHEEL_CACHE/$KEY"
WANT_WHEEL=0
case "${1:-}" in
  --print-key) echo "$KEY"; exit 0 ;;
  --wheel) WANT_WHEEL=1 ;;
  "") ;;
  *) die "unknown argument '$1' (expected --print-key or --wheel)" ;;
esac
mkdir -p "$DIR" || die "cannot create the wheel cache $DIR (set HVDRUNNER_WHEEL_CACHE)"

installed="$("$PY" -c 'import importlib.metadata as m; print(m.version("horovod"))' 2>/dev/null || true)"
if [ "$installed" = "$HOROVOD_VERSION" ] && [ "$WANT_WHEEL" = 0 ]; then
  rc=0; horovod_ok >/dev/null 2>&1 || rc=$?
  if [ "$rc" = 0 ]; then
    say "horovod $HOROVOD_VERSION already installed with $FW_NAMES, gloo and hvdrunner's patches"
    exit 0
  elif [ "$rc" = 3 ] && [ "${HVDRUNNER_KEEP_INSTALLED_HOROVOD:-0}" = 1 ]; then
    say "WARNING: keeping the installed horovod $HOROVOD_VERSION, which lacks hvdrunner's patches $(basename "$IFACE_PATCH") and $(basename "$RENDEZVOUS_PATCH"): multi-host jobs need every host's name to resolve to its cluster address (hvdrunner checks before hvd.init()); HorovodRunner serves its own fixed rendezvous, horovodrun does not"
    exit 0
  elif [ "$rc" = 3 ]; then
    say "the installed horovod $HOROVOD_VERSION lacks hvdrunner's patches (gloo interface, rendezvous scopes): replacing it"
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
  export HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_MXNET=1 \
         HOROVOD_WITHOUT_JAX=1 MAKEFLAGS="${MAKEFLAGS:--j$(nproc)}"
  # WITH_x makes horovod's build fail rather than skip a framework it cannot build.
  if [ -n "$TF_VERSION" ]; then export HOROVOD_WITH_TENSORFLOW=1; else export HOROVOD_WITHOUT_TENSORFLOW=1; fi
  if [ -n "$TORCH_VERSION" ]; then export HOROVOD_WITH_PYTORCH=1; else export HOROVOD_WITHOUT_PYTORCH=1; fi
  if [ "$GPU_MODE" = "nccl" ]; then export HOROVOD_GPU_OPERATIONS=NCCL; fi
  tmp="$(mktemp -d)"  # removed by cleanup on exit
  say "downloading the horovod $HOROVOD_VERSION sdist"
  "${PIP[@]}" download -q --no-binary :all: --no-deps -d "$tmp" "horovod==$HOROVOD_VERSION"
  tar -xzf "$tmp"/horovod-"$HOROVOD_VERSION".tar.gz -C "$tmp"
  src="$tmp/horovod-$HOROVOD_VERSION"
  for p in "${PATCHES[@]}"; do
    say "applying $(basename "$p")"
    (cd "$src" && patch -p1 --forward --quiet < "$p") || die "the horovod patch $(basename "$p") did not apply"
  done
  say "building $KEY (minutes on 2 idle cores, measured: ~3 for TF 2.15, ~4 for TF 2.21 and torch 2.13, ~3 for CUDA 13); log: $DIR/build.log"
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
