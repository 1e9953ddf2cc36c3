"""tosa."""
