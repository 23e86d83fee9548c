"""Built-in recipe files (TOML); this folder is installed as the package `repair.recipes`."""
