"""The engine: the plan of stage tasks, their execution (doit or Dask), up-to-date checks, the shared cache.

It knows what a stage is (stage.py) but not which stages exist, nor what a report holds: its caller hands it
the stage list and a reporter (report/run.py), and gets back the run's outcome (engine/run.py). A project's
dodo.py uses `npubuild.dodo_namespace`, the stable entry, not a module here.
"""
