"""The engine: Fleet (the one API of the panel and the CLI), the supervisor, the follower
that turns attempt folders into task states, and landing."""
