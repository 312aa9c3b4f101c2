"""The package's version, in a leaf of its own (the package and the command line both read it)."""

__version__ = "0.1.0"
