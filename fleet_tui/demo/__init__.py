"""The built-in demo: its project, its scripts and the scripted endpoint it runs on."""
