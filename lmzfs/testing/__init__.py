"""Helpers for testing code that uses lmzfs, shipped with the package (like trio.testing)."""
