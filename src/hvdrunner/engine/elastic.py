"""Horovod's elastic API on the engine (placeholder until its module lands)."""
