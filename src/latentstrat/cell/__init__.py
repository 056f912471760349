"""The per-cell stages: the shared step-0 validation, training (with its validation),
evaluation on the test split, the probes and the cell's metrics row."""
