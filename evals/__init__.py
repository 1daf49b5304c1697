"""The repairproxy study: τ²-bench Retail and Telecom, run by LLM agents through the proxy."""
