"""What every framework adapter (``hvdrunner.keras``, later ``hvdrunner.torch``) shares.

No TensorFlow, no PyTorch, no Horovod import here: numbers, files and rules.

- ``checkpoint``: verified checkpoint folders (SHA-256, fsync, rename; fall back to the
  newest intact one); an adapter supplies how to write and read its model's files.
- ``sync``: the weight fingerprint and the verdict of the weight-sync check.
- ``schedule``: learning-rate scaling by the number of ranks and the warmup ramp.
"""
