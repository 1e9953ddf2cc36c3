"""Configuration: YAML loading with positions, the pydantic schema, resolution of specs and profiles."""
