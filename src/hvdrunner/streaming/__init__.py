"""Mosaic Streaming under HorovodRunner: a Spark DataFrame as MDS shards, read by every rank.

Databricks names Mosaic Streaming (``mosaicml-streaming``, in the ML runtimes 15.4 to 18 LTS)
the successor of petastorm. hvdrunner writes the shards and checks the world Streaming reads;
Streaming does the reading:

- ``write_mds`` (driver): the DataFrame's columns as MDS shards in a folder every rank sees
  (a Unity Catalog volume), nulls refused first, the folder whole or absent. Returns
  :class:`MdsData`.
- :class:`MdsData` (ranks): what ``hvdrunner.torch.fit`` and ``hvdrunner.keras.fit`` (on
  PyTorch) take as ``data``, with equal steps on every rank; ``.transformed(TransformSpec)``
  decodes on the ranks; ``.dataset()`` is the ``StreamingDataset`` for a loop of your own.
- ``world``: the checks that keep Streaming from misreading the job (uneven hosts, a launcher
  without torch's variables).

Example:
    >>> from hvdrunner.streaming import write_mds
    >>> data = write_mds(df, "/Volumes/<catalog>/<schema>/hvdrunner/digits-mds",    # doctest: +SKIP
    ...                  features="pixels", label="label")
"""

from hvdrunner.streaming.handle import MdsData
from hvdrunner.streaming.write import write_mds

__all__ = ["MdsData", "write_mds"]
