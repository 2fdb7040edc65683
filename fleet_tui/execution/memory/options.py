"""The memory kind has no options of `fleet-tui host add` (it is not added: it is built in code)
and no columns of its own in `host ls`."""

from __future__ import annotations

from fleet_tui.settings.kinds import NoOptions

OPTIONS = NoOptions(key_shown="here")
