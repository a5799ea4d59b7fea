"""Comparisons of lab with a peer (vLLM) and oracles that run in the peer's venv: a folder of the
repository, not installed with lab (benchmarks/README.md)."""
