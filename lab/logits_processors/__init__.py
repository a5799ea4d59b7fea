"""Logits processors: the `logits_processors` config group (see base.py)."""
