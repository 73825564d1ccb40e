"""The connector test suite: one package, imported as `tests.<folder>.<module>`."""
