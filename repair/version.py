"""The package version, in the bottom layer so every stage can name it in what it writes."""

__version__ = "0.1.0"
