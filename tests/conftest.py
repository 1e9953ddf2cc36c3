"""pytest fixtures; the helpers themselves live in npbtest.py (importable: tests/ is on pythonpath)."""

from npbtest import project  # noqa: F401  (fixture)
