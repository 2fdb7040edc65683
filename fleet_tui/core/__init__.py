"""Pure rules and formats, no I/O beyond what a caller hands in: the state table, policy,
outcomes, the stream parser, provider tables, errors, titles, durations, redaction."""
