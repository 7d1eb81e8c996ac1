# hvdrunner: two user commands. Each first brings .venv up to date (a no-op when nothing
# changed), then runs. See README.md.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.hvdrunner-env-stamp
# Anything that changes what gets installed re-runs the (idempotent) setup.
ENV_INPUTS := scripts/setup_env.sh requirements/stack-1-tensorflow.txt \
              requirements/stack-3-spark.txt pyproject.toml

export PYSPARK_PYTHON := $(abspath $(PY))
export PYSPARK_DRIVER_PYTHON := $(abspath $(PY))
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: demo test env doctor lint bench clean-env

demo: $(STAMP)        ## the main job: 2 Horovod ranks on local Spark, MLflow in ./mlflow.db
	$(PY) -m hvdrunner demo

test: $(STAMP)        ## the whole test suite
	$(PY) -m pytest

env: $(STAMP)

$(STAMP): $(ENV_INPUTS)
	bash scripts/setup_env.sh
	@touch $@

doctor: $(STAMP)
	$(PY) -m hvdrunner doctor --master 'local[2]'

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks
	$(VENV)/bin/mypy

bench: $(STAMP)
	$(PY) benchmarks/launch_overhead.py

clean-env:
	rm -rf $(VENV)
