# hvdrunner: two user commands, `make demo` and `make test`. Each first brings the stack's
# venv up to date (a no-op when nothing changed), then runs. See README.md.
#
# STACK names a Databricks ML runtime, replicated from Databricks' own package list
# (requirements/<runtime>/runtime.txt, docs/stacks.md), or the gpu stack:
# STACK=18 (default): 18 LTS ML - Python 3.12, TF 2.20 / Keras 3.12, torch 2.9.0, pyspark
#                     4.1.0. Nothing compiled: TensorFlow runs on hvdrunner's engine. Its
#                     tests add the compiled horovod (for TensorFlow), the parity reference
#                     (tests/test_engine_tf.py; a cached wheel when built).
# STACK=15.4:         15.4 LTS ML - Python 3.11, TF 2.16.1 / Keras 3.2.1 (+ tf-keras 2.16.0),
#                     torch 2.3.1, pyspark 3.5.0, pyarrow 14, petastorm 0.12.1, mlflow-skinny
#                     2.13.1, horovod 0.28.1 for TensorFlow (the runtime ships one).
# STACK=19:           19 ML - Python 3.12, torch 2.12.0, pyspark 4.2.0, no TensorFlow and no
#                     horovod (nothing compiled): the PyTorch tests (marker `torch`) on
#                     hvdrunner's engine and `make demo FRAMEWORK=torch`.
# STACK=16.4, 17.3:   16.4 and 17.3 LTS ML (Python 3.12; TF 2.17 / 2.19, torch 2.6 / 2.7, Spark
#                     3.5.2 / 4.0.0, MLflow 2.21.3 / 3.0.1): `make test` runs each runtime's
#                     smoke tests (the replica, the doctor, 2-rank Keras and PyTorch jobs).
# STACK=gpu:          Python 3.11, torch 2.14 (CUDA 13.0) and horovod built with CUDA + NCCL
#                     from registry packages (no GPU needed to build): the compiled
#                     horovod.torch's tests on its CPU paths (marker `stacks("gpu")`);
#                     on a GPU machine `make gpu-check`.
# make demo FRAMEWORK=torch: the PyTorch chain (on STACK=19 unless STACK says otherwise).
FRAMEWORK ?= keras
ifeq ($(FRAMEWORK),torch)
STACK  ?= 19
endif
STACK  ?= 18
# 19 and gpu have Keras 3 and no TensorFlow: Keras runs on PyTorch there
# (`make demo STACK=19` trains the Keras notebook on it).
ifneq ($(filter 19 gpu,$(STACK)),)
export KERAS_BACKEND ?= torch
endif
VENV   ?= .venv-$(STACK)
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.hvdrunner-env-stamp
# Anything that changes what gets installed re-runs the (idempotent) setup.
ENV_INPUTS := scripts/setup_stack.sh scripts/install_horovod.sh \
              requirements/$(STACK)/framework.txt requirements/$(STACK)/stack.txt \
              requirements/dev.txt $(wildcard patches/*.patch) pyproject.toml \
              $(wildcard requirements/$(STACK)/runtime.txt requirements/$(STACK)/differences.txt) \
              scripts/runtime_pins.py

export STACK
export PYSPARK_PYTHON := $(abspath $(PY))
export PYSPARK_DRIVER_PYTHON := $(abspath $(PY))
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: demo demo-images test test-all test-tf-keras docs env doctor lint bench gpu-check release clean-env

demo: $(STAMP)        ## the main job: 2 Horovod ranks on local Spark, MLflow in ./mlflow.db
	$(PY) -m hvdrunner demo --framework $(FRAMEWORK)

demo-images: $(STAMP) ## images: JPEG files -> a table -> decoded on 2 ranks -> a CNN -> scored (notebooks/04_images.py)
	MLFLOW_TRACKING_URI=$${MLFLOW_TRACKING_URI:-sqlite:///mlflow.db} $(PY) -m hvdrunner.notebook run notebooks/04_images.py --task-values .hvdrunner/images_task_values.json

# 18's set-up compiles nothing; its tests add the compiled horovod beside the engine.
ifeq ($(STACK),18)
TEST_ENV := $(VENV)/.hvdrunner-horovod-stamp
else
TEST_ENV := $(STAMP)
endif

$(VENV)/.hvdrunner-horovod-stamp: $(STAMP) scripts/install_horovod.sh $(wildcard patches/*.patch)
	PYTHON=$(abspath $(PY)) HVDRUNNER_HOROVOD_FRAMEWORKS=tensorflow bash scripts/install_horovod.sh
	@touch $@

test: $(TEST_ENV)     ## the tests that $(STACK) adds information to (tests/conftest.py); CI runs every stack
	$(PY) -m pytest $(PYTEST_ARGS)

test-all: $(TEST_ENV) ## every test $(STACK)'s frameworks can run, framework-independent ones too
	HVDRUNNER_TESTS=all $(PY) -m pytest $(PYTEST_ARGS)

test-tf-keras: $(TEST_ENV)  ## 18 only: the mode-specific Keras tests in tf_keras mode (TF_USE_LEGACY_KERAS=1)
	@[ "$(STACK)" = 18 ] || { echo "test-tf-keras needs STACK=18 (tf_keras mode is TF >= 2.16)"; exit 2; }
	TF_USE_LEGACY_KERAS=1 $(PY) -m pytest -m keras_mode $(PYTEST_ARGS)

docs: $(STAMP)        ## the docs site, built strictly (mkdocs.yml) into .hvdrunner/site
	$(PY) -m mkdocs build --strict

env: $(STAMP)

$(STAMP): $(ENV_INPUTS)
	STACK=$(STACK) VENV=$(abspath $(VENV)) bash scripts/setup_stack.sh
	@touch $@

doctor: $(STAMP)
	$(PY) -m hvdrunner doctor --master 'local[2]'

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks scripts
	$(VENV)/bin/ruff format --check src tests benchmarks scripts
	$(VENV)/bin/mypy

bench: $(TEST_ENV)     ## every benchmark on $(STACK); results in benchmarks/results/*-$(STACK).json
ifeq ($(STACK),19)
	$(PY) benchmarks/torch_comparison.py   # fit vs bare horovod.torch; vs TorchDistributor (DDP)
	$(PY) benchmarks/epoch_wall.py         # whole epochs and whole jobs: fit, Keras, bare, DDP, horovod.spark.run
	$(PY) benchmarks/synthetic_resnet50.py # Horovod's ResNet-50 protocol: HorovodRunner, horovodrun, DDP
	$(PY) benchmarks/bare_recipe_knobs.py --model resnet50 --reps 5  # the unchanged recipe: HorovodRunner's default vs stock rounds vs DDP
	$(PY) benchmarks/bare_recipe_knobs.py --model mlp
	$(PY) benchmarks/chaos.py              # needs root: faults on two hosts, max_restarts
	$(PY) benchmarks/elastic_commit.py     # Horovod elastic commits kept across restarts
	$(PY) benchmarks/engine_latency.py     # one small allreduce: the engine vs dist.all_reduce
	$(PY) benchmarks/engine_launch.py      # a job's launch and hvd.init()'s share: HorovodRunner vs TorchDistributor
else
	$(PY) benchmarks/launch_overhead.py
	$(PY) benchmarks/data_throughput.py
	$(PY) benchmarks/scaling.py
	$(PY) benchmarks/knobs_accuracy.py
	$(PY) benchmarks/multihost.py      # needs root: two hosts in network namespaces
	$(PY) benchmarks/synthetic_resnet50.py  # Horovod's ResNet-50 protocol: HorovodRunner, horovodrun
	$(PY) benchmarks/image_feed.py      # images decoded on the ranks; vs real petastorm on 15.4
ifeq ($(STACK),18)
	$(PY) benchmarks/tf_distribute_comparison.py  # Keras: fit (engine, compiled), the recipe, MirroredStrategyRunner
	$(PY) benchmarks/tf_engine_latency.py        # one small allreduce in tf.function: the engine vs the compiled op
	$(PY) benchmarks/ring_model.py --hosts 3  # needs root: 4..32 hosts on paper, checked on 3 netns hosts
	$(PY) benchmarks/streaming_feed.py  # images/s per rank: hvdrunner's feed vs Mosaic Streaming vs the drop-in
endif
endif

release: $(STAMP)     ## the package for an index: sdist + wheel into dist/, metadata checked (docs/install.md)
	rm -rf dist
	$(PY) -m build --no-isolation --outdir dist .
	$(PY) -m twine check --strict dist/*

gpu-check:            ## on a GPU machine: NCCL wheel, ranks pinned to GPUs, NCCL allreduce, timed fits (< 10 min)
	bash scripts/gpu_check.sh

clean-env:
	rm -rf $(VENV)
