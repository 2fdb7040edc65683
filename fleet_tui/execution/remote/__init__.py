"""What the remote kinds (ssh, ray) share, neither importing the other.

Controller side: base.py (`RemoteHost`, `RemoteRun`: a task's worktree, config dir and
attempt folder under a data dir there, mirrored here), forwarding.py (what of the engine's
environment a host's runner gets). What runs on the host (its runs, worktrees, update and
follow frames) is in execution/worker/, with the rest of the worker's own code.
"""
