"""Screens and modals of the panel."""

from pathlib import Path

DIALOG_CSS = Path(__file__).resolve().parent.parent / "dialogs.tcss"
"""The dialogs' CSS: every modal screen's CSS_PATH. Textual reads it when the first of them
opens, so the main screen's first frame does not parse it (app.tcss is the main screen's)."""
