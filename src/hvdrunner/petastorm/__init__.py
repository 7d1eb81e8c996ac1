"""Petastorm's Spark converter API on every stack: Databricks' HorovodRunner + Petastorm
notebooks run with one changed import.

    from petastorm.spark import SparkDatasetConverter, make_spark_converter           # before
    from hvdrunner.petastorm.spark import SparkDatasetConverter, make_spark_converter # after
    from petastorm import TransformSpec                                               # before
    from hvdrunner.petastorm import TransformSpec                                     # after

petastorm 0.13.1 works only with pyarrow < 15 (no runtime after DBR 15.4 LTS ML), and it
shards by row group, so ranks can get unequal row counts and, with a finite ``num_epochs``,
stop at different steps (Horovod then hangs). This converter writes through
:func:`hvdrunner.data.prepare` and reads through :class:`hvdrunner.data.PreparedData`: every
rank gets ``ceil(N / shard_count)`` rows and the same number of full batches, the cache is
reused only while the input is unchanged, and damaged files fail loudly. Arguments it cannot
honour are refused by name (:data:`hvdrunner.petastorm.options.NOT_OFFERED`).

Modules: ``spark`` (the converter), ``options`` (the reader arguments, checked),
``tf_dataset`` and ``torch_loader`` (the two feeds; each imports its framework only).
"""

from hvdrunner.data.transform import TransformSpec

__all__ = ["TransformSpec"]
