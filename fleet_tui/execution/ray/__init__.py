"""The Ray host: each attempt one Ray job (execution/ray/host.py, job.py)."""
