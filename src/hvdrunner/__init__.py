"""hvdrunner."""
