"""What runs on a host for an attempt (the runner, its preparation, the launch, the cage's
host side, the SSH host agent, the Ray job's entrypoint) and the attempt folder's format:
the standard library only, importing nothing of the package above it."""
