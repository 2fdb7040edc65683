"""Settings: config.toml and FLEET_WORKER_* (config_core: the import-light merge the
drop-in scripts use), the repository's .fleet-tui.toml."""
