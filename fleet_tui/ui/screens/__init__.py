"""Screens and modals of the panel."""
