"""The engine: the plan of stage tasks, their execution (doit or Dask), up-to-date checks, the shared cache.

It knows what a stage is (stage.py) but not which stages exist: its caller hands it the stage list. A
project's dodo.py uses `npubuild.dodo_namespace`, the stable entry, not a module here.
"""
