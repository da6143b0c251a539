"""The built-in Engram-shaped workload (table maker, readers, runner, scenarios)."""
