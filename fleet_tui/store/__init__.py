"""The store: one SQLite database of tasks, attempts and the endpoint's state."""
