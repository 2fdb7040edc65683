"""Where attempts run. The host seam is this folder's top; local/ is the first host (this
machine: the detached runner, the launcher, the attempt folder)."""
