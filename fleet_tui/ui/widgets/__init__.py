"""Widgets of the panel: task table, stream view, diff view, status line."""
