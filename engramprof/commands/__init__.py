"""CLI command modules; each has register(app) and stays thin."""
