"""The Textual control panel. The only package of fleet-tui that imports Textual."""
