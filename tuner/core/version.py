"""The version of mpt-tuner, importable without torch."""

__version__ = "0.1.0"
