"""Benchmarks: `make bench` runs every bench/<name>.py; each prints one JSON line per result."""
