"""The Ray host (issue 21): each attempt one Ray job (execution/ray/host.py, job.py)."""
