"""Investigations kept for their method: each answered one question once (see its docstring)."""
