"""The SSH host: attempts run on another machine over the user\x27s own ssh."""
