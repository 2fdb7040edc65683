"""fleet-tui: run a fleet of headless Claude Code workers and land their work safely."""

from __future__ import annotations

__version__ = "0.1.0"

# The Claude Code CLI version our tests and the demo are pinned to.
CLAUDE_CODE_VERSION = "2.1.197"

# The newest CLI the tests also run against where its behaviour differs (e.g. how it answers
# SIGTERM during a Bash step); scripts/test installs it into .claude-cli-newest/.
CLAUDE_CODE_NEWEST_VERSION = "2.1.332"
