"""The Ethos-U55/U65 machine: its run loop (machine), op execution (ops) and output scaling (scaling)."""
