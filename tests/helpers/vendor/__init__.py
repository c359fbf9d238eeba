"""Third-party code used by the tests, kept as published (each file names its source and licence)."""
