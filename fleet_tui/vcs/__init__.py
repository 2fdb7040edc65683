"""git in the main repository: worktrees, diffs, the secret scan, merges, updates, pushes;
the repository lock and the test gate."""
