"""What ``hvdrunner migrate`` rewrites and what it reports: one table per kind.

Imports are matched on Python's own parse of each cell (engine: migrate.cells), so every way
of writing one is seen: aliases, parentheses over several lines, trailing comments,
statements after ``;``. Installs and the uses that need a hand are matched on lines.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hvdrunner import workspace

#: The install lines users type, one line each (hvdrunner.workspace writes them).
_WHEEL_PIP = workspace.wheel_cell().splitlines()[0]
_COMPILED_PIP = workspace.compiled_cell().splitlines()[0]


@dataclass(frozen=True)
class DropIn:
    """A module with a drop-in: ``from <module> import ...`` becomes ``from <to> import ...``
    (only when every name imported is in ``names``, where given)."""

    to: str
    what: str
    fix: str
    names: frozenset[str] | None = None


_SPARKDL = (
    "sparkdl.HorovodRunner (absent after DBR 15.4 LTS ML)",
    "hvdrunner's HorovodRunner: the same np, driver_log_verbosity and run(main, **kwargs)",
)
_KERAS = (
    "Horovod's Keras layer (under Keras 3 it does not average gradients: ranks train apart "
    "without an error)",
    "hvdrunner.hvd_keras: the same names (init, DistributedOptimizer, callbacks, ...) on "
    "Keras 2 and 3",
)
_TORCH = (
    "horovod.torch (a horovod compiled for this torch: 0.28.1 does not build for torch >= 2.1 "
    "unpatched)",
    "hvdrunner.hvd_torch: Horovod's PyTorch API on torch.distributed (gloo, NCCL), the same "
    "names, nothing compiled",
)
_TF = (
    "horovod.tensorflow (a horovod compiled for this TensorFlow: 0.28.1 does not build for "
    "TF >= 2.16 unpatched)",
    "hvdrunner.hvd_tensorflow: Horovod's TensorFlow API on hvdrunner's engine "
    "(torch.distributed), the same names, nothing compiled",
)
_SPEC = (
    "petastorm.TransformSpec (decoding on the ranks)",
    "hvdrunner.petastorm.TransformSpec: the same arguments, honoured by make_tf_dataset and "
    "make_torch_dataloader",
)
_PETASTORM = (
    "petastorm.spark (petastorm 0.13.1 needs pyarrow < 15; runtimes after 15.4 have newer)",
    "hvdrunner.petastorm.spark: make_spark_converter, SparkDatasetConverter",
)

#: ``from <module> import ...`` with a drop-in.
FROM: dict[str, DropIn] = {
    "sparkdl": DropIn("hvdrunner", *_SPARKDL, frozenset({"HorovodRunner", "log_to_driver"})),
    "sparkdl.horovod": DropIn(
        "hvdrunner", *_SPARKDL, frozenset({"HorovodRunner", "log_to_driver"})
    ),  # fmt: skip
    "horovod.tensorflow.keras": DropIn("hvdrunner.hvd_keras", *_KERAS),
    "horovod.keras": DropIn("hvdrunner.hvd_keras", *_KERAS),
    "horovod.tensorflow": DropIn("hvdrunner.hvd_tensorflow", *_TF),
    "horovod.torch": DropIn("hvdrunner.hvd_torch", *_TORCH),
    "horovod.torch.elastic": DropIn("hvdrunner.hvd_torch.elastic", *_TORCH),
    "petastorm": DropIn("hvdrunner.petastorm", *_SPEC, frozenset({"TransformSpec"})),
    "petastorm.transform": DropIn("hvdrunner.petastorm", *_SPEC, frozenset({"TransformSpec"})),
    "petastorm.spark": DropIn("hvdrunner.petastorm.spark", *_PETASTORM),
}
#: ``import <module> as <alias>`` with a drop-in (without an alias the code names the
#: module itself, which a rewrite would break: reported instead).
IMPORT_AS: dict[str, DropIn] = {
    "horovod.tensorflow.keras": DropIn("hvdrunner.hvd_keras", *_KERAS),
    "horovod.keras": DropIn("hvdrunner.hvd_keras", *_KERAS),
    "horovod.tensorflow": DropIn("hvdrunner.hvd_tensorflow", *_TF),
    "horovod.torch": DropIn("hvdrunner.hvd_torch", *_TORCH),
}


def no_drop_in(module: str) -> tuple[str, str]:
    """``(what, fix)`` for an import of sparkdl or horovod that is not rewritten."""
    if module.split(".")[0] == "sparkdl":
        return (
            f"an import of {module} that has no drop-in as written (sparkdl is absent after "
            f"DBR 15.4 LTS ML)",
            "from hvdrunner import HorovodRunner (and log_to_driver), then call "
            "HorovodRunner(...) where the code says sparkdl.HorovodRunner(...)",
        )
    if module.startswith(("horovod.tensorflow.keras", "horovod.keras")):
        return (_KERAS[0], "import hvdrunner.hvd_keras as hvd, and call hvd.<name> where the "
                "code names horovod's module")  # fmt: skip
    if module.startswith("horovod.tensorflow"):
        return (_TF[0], "import hvdrunner.hvd_tensorflow as hvd, and call hvd.<name> where the "
                "code names horovod's module")  # fmt: skip
    if module.startswith("horovod.torch"):
        return (_TORCH[0], "import hvdrunner.hvd_torch as hvd, and call hvd.<name> where the "
                "code names horovod's module")  # fmt: skip
    if module.startswith("horovod.spark"):
        return (
            "horovod.spark (horovod.spark.run, Horovod's Spark estimators)",
            "HorovodRunner(np=N).run(fn, **kwargs); for the estimators, hvdrunner.keras.fit / "
            "hvdrunner.torch.fit on hvdrunner.data.prepare(df)",
        )
    return (
        f"{module}: the compiled horovod (kept as it is: it runs on the horovod hvdrunner's "
        f"build job publishes)",
        f"build it ({workspace.build_command()}) and install it with `{_COMPILED_PIP}` (hvdrunner's "
        "install page); or use hvdrunner.hvd_tensorflow, hvdrunner.hvd_keras or "
        "hvdrunner.hvd_torch (nothing compiled)",
    )


def reported(module: str) -> bool:
    """Whether an import of ``module`` without a drop-in is reported: every one of sparkdl
    and horovod (petastorm's other names are left to the line rules: its readers)."""
    return module.split(".")[0] in ("sparkdl", "horovod")


@dataclass(frozen=True)
class Rule:
    """A line pattern reported with ``fix`` (never rewritten)."""

    pattern: re.Pattern[str]
    what: str
    fix: str


def _rule(pattern: str, what: str, fix: str) -> Rule:
    return Rule(re.compile(pattern), what, fix)


#: Every way a notebook installs a package, naming horovod or sparkdl.
INSTALL = _rule(
    r"(?:\b(?:pip3?|conda|mamba|uv\s+pip)\s+install\b|\bdbutils\.library\.install\w*\s*\()"
    r".*\b(?:horovod|sparkdl)\b",
    "installs horovod or sparkdl from PyPI (horovod 0.28.1 does not build for current "
    "runtimes' TensorFlow and PyTorch unpatched; sparkdl has no HorovodRunner after 15.4)",
    f"install hvdrunner instead (hvdrunner's install page): `{_WHEEL_PIP}`, that is all for Keras, "
    f"TensorFlow and PyTorch (nothing compiled); a compiled horovod, for HVDRUNNER_ENGINE=horovod: "
    f"`{_COMPILED_PIP}` (the build job, {workspace.build_command()}, publishes it)",
)

#: Uses with no drop-in, in the code: reported with the fix, never rewritten.
MANUAL: tuple[Rule, ...] = (
    _rule(
        r"\bhorovod\.spark\.run\s*\(|\bfrom horovod\.spark import run\b|\bhvd_spark\.run\s*\(",
        "horovod.spark.run(fn, args=..., num_proc=N)",
        "HorovodRunner(np=N).run(fn, **kwargs): keyword arguments instead of args=(...), "
        "rank 0's value instead of a list of every rank's",
    ),  # fmt: skip
    _rule(
        r"\bhorovod\.spark\.(?:keras|torch|lightning)\b|\b(?:KerasEstimator|TorchEstimator|LightningEstimator)\b",
        "Horovod's Spark estimators",
        "not provided: hvdrunner.keras.fit / hvdrunner.torch.fit on hvdrunner.data.prepare(df) "
        "under HorovodRunner",
    ),  # fmt: skip
    _rule(
        r"\bhvd\.elastic\b|\bhorovod\.\w+(?:\.keras)?\.elastic\b",
        "Horovod elastic",
        "unchanged @hvd.elastic.run code (PyTorch, TensorFlow, Keras on TensorFlow) resumes "
        "from its last state.commit() after a restart with HorovodRunner(max_restarts=N); "
        "ranks never join a running job. Or hvdrunner.keras.fit(checkpoint_dir=...) with "
        "max_restarts",
    ),  # fmt: skip
    _rule(
        r"\b(?:make_batch_reader|make_reader|make_petastorm_dataset)\b",
        "petastorm's readers",
        "the converter API (hvdrunner.petastorm.spark) or hvdrunner.data.prepare(df)",
    ),  # fmt: skip
    _rule(
        r"\bmpirun\b|\bhvd\.mpi_\w+\(|HOROVOD_MPI|\bmpi4py\b",
        "MPI",
        "hvdrunner runs Horovod over gloo only (no MPI): remove the MPI-specific code",
    ),  # fmt: skip
)


_MDS = "hvdrunner.streaming.write_mds(df, '/Volumes/<catalog>/<schema>/<volume>/<name>', features=..., label=...)"

#: petastorm's uses, each with its Mosaic Streaming equivalent (Databricks' successor to
#: petastorm): reported beside the drop-in, which keeps working; never rewritten.
STREAMING: tuple[Rule, ...] = (
    _rule(
        r"\bmake_spark_converter\s*\(",
        "petastorm's make_spark_converter (a DataFrame cached as Parquet)",
        f"{_MDS}: the DataFrame as MDS shards in a volume (Streaming's own converter is "
        "streaming.base.converters.dataframe_to_mds)",
    ),  # fmt: skip
    _rule(
        r"\.make_torch_dataloader\s*\(",
        "petastorm's make_torch_dataloader",
        "pass the MdsData to hvdrunner.torch.fit(data=...), or for a loop of your own "
        "data.batches(batch_size) (equal steps on every rank) or "
        "streaming.StreamingDataLoader(data.dataset(batch_size), batch_size=batch_size)",
    ),  # fmt: skip
    _rule(
        r"\.make_tf_dataset\s*\(",
        "petastorm's make_tf_dataset",
        "pass the MdsData to hvdrunner.keras.fit(data=...), or `with data.tf_dataset(batch_size) "
        "as ds:` (the same batches as tf.data)",
    ),  # fmt: skip
    _rule(
        r"\bTransformSpec\s*\(",
        "petastorm's TransformSpec (decoding on the ranks)",
        "data.transformed(TransformSpec(...), features=..., label=...) on the MdsData: the same "
        "TransformSpec, run in each rank's DataLoader worker processes",
    ),  # fmt: skip
    _rule(
        r"\b(?:make_batch_reader|make_reader)\s*\(",
        "petastorm's readers",
        f"{_MDS}, then data.dataset(batch_size): a streaming.StreamingDataset over the shards",
    ),  # fmt: skip
)
