"""Helpers the figures and the diagnostics share: fast upstreams, the relay floor, the host."""
