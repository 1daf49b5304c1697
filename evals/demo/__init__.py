"""The demo: one τ²-bench episode through the proxy, told as a transcript."""
