"""Runtime targets: what each runtime (and release) loads, kept as data."""
