"""hvdrunner's version, written once (CHANGELOG.md: the release notes of each version); a
module of its own so that any module can read it without importing the package's face."""

__version__ = "0.2.0"
