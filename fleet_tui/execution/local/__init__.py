"""The local host: attempts as detached runner processes on this machine."""
