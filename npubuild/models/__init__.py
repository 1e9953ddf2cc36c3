"""Example models built by npubuild's own code (no downloads), for configs/, tests and benchmarks."""
