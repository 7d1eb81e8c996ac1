#!/usr/bin/env bash
# make gpu-check: the GPU path end to end, one script, on a machine with NVIDIA GPUs (< 10 min
# on one GPU once the gpu stack is set up):
#   1. the gpu stack (make env STACK=gpu): PyTorch's CUDA build, horovod built with CUDA + NCCL;
#   2. benchmarks/gpu_check.py under it: ranks pinned to GPUs by hvdrunner (one per GPU; NCCL
#      refuses two ranks on one GPU, so one GPU means one rank), NCCL allreduce on GPU tensors
#      (checked, then timed: bus bandwidth) and a timed hvdrunner.torch.fit on the GPUs, each
#      on hvdrunner's engine (torch.distributed) and on the compiled horovod.torch; and a
#      timed hvdrunner.keras.fit where the 18 replica is set up (TensorFlow's device is
#      reported: TF's pip build sees GPUs only with its CUDA libraries installed).
# Figures are printed and written to benchmarks/results/gpu_check.json.
# Without a GPU it stops at once (exit 2) and says what tests the GPU wheel here instead.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "make gpu-check needs an NVIDIA GPU, and nvidia-smi lists none on this machine." \
       "On a CPU machine, 'make test STACK=gpu' tests the CUDA + NCCL horovod wheel's CPU paths." >&2
  exit 2
fi
nvidia-smi -L
make env STACK=gpu
args=(--device cuda --out benchmarks/results/gpu_check.json)
[ ! -x .venv-18/bin/python ] || args+=(--keras-python .venv-18/bin/python)
timeout 540 .venv-gpu/bin/python benchmarks/gpu_check.py "${args[@]}" "$@"
