"""What every framework adapter (``hvdrunner.keras``, ``hvdrunner.torch``) shares.

No TensorFlow, no PyTorch, no Horovod import here: numbers, files, rules and the order of
``fit``'s steps.

- ``recipe``: the one ``fit`` recipe (init → build → restore → broadcast → feed → params →
  train → model → result); each adapter supplies its framework's parts.
- ``settings``: the settings both fits share (frozen, validated once) and ``FitResult``.
- ``checkpoint``: verified checkpoint folders (SHA-256, fsync, rename; fall back to the
  newest intact one); an adapter supplies how to write and read its model's files.
- ``sync``: the weight fingerprint and the verdict of the weight-sync check.
- ``schedule``: learning-rate scaling by the number of ranks and the warmup ramp.
- ``metrics``: the metric averaging both adapters use.
"""
