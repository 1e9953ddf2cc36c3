"""Stages: one module per stage, each a pure function (input files, resolved config) -> output files + metrics.

What runs them (the completion record, the shared cache, error records) is npubuild.build.execute.
"""
