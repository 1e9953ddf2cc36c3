"""npubuild's version, at the ground so that the engine's cache keys and the command line read it without
importing the package's entry (npubuild/__init__.py, which reaches the engine and the stages)."""

__version__ = "0.1.0"
