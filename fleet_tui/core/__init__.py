"""The domain model (model.py: tasks, attempts, the endpoints' state) and pure rules and
formats over it, no I/O beyond what a caller hands in: the state table, policy, outcomes,
the stream parser, provider tables, errors, titles, durations, redaction."""
