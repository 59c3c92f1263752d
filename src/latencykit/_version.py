"""The version, in a module of its own: the package and its telemetry both name it."""

__version__ = "0.1.0.dev0"
