"""STAND-IN keyring backend for tests.

No OS keyring daemon (Secret Service over D-Bus) runs on the CI machine, so tests select
this file-backed backend through PYTHON_KEYRING_BACKEND. fleet-tui itself talks to it
only through the keyring library's public API, exactly as it would to a real backend.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from keyring.backend import KeyringBackend
from keyring.errors import PasswordDeleteError


class FileKeyring(KeyringBackend):
    priority = 1  # type: ignore[assignment]

    def _path(self) -> Path:
        return Path(os.environ["FLEET_TEST_KEYRING_FILE"])

    def _load(self) -> dict[str, str]:
        try:
            return dict(json.loads(self._path().read_text()))
        except FileNotFoundError:
            return {}

    def _save(self, data: dict[str, str]) -> None:
        self._path().write_text(json.dumps(data))

    def get_password(self, service: str, username: str) -> str | None:
        return self._load().get(f"{service}\0{username}")

    def set_password(self, service: str, username: str, password: str) -> None:
        data = self._load()
        data[f"{service}\0{username}"] = password
        self._save(data)

    def delete_password(self, service: str, username: str) -> None:
        data = self._load()
        if data.pop(f"{service}\0{username}", None) is None:
            raise PasswordDeleteError("not found")
        self._save(data)
