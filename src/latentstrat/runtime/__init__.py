"""How a job runs on its machine: the host's threads, device and precision (host), the entangle
stage's worker processes (parallel), a running job's progress file (progress)."""
