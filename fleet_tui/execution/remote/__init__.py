"""What the remote kinds (ssh, ray) share, neither importing the other.

Controller side: base.py (`RemoteHost`, `RemoteRun`: a task's worktree, config dir and
attempt folder under a data dir there, mirrored here), forwarding.py (what of the engine's
environment a host's runner gets). Host side, standard library only (run there under
`python3 -I -S`): runs.py, worktrees.py, update.py, frames.py. This file imports nothing:
the host side must not pull the controller side in.
"""
