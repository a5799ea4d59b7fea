"""Speculative decoding: the `speculative` config group (see base.py)."""
