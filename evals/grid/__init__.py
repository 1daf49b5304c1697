"""The grid: its spec (arms, users, cells), the servers and proxies it starts, provenance."""
