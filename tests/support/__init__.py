"""Test support: a scripted OpenAI-compatible upstream and a proxy server on loopback."""
