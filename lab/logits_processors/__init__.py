"""Logits processors: the `logits_processors` config group (see base.py)."""

# The built-in processors (lab/conf/logits_processors/<name>.yaml, module lab.logits_processors.<name>)
# in the order vLLM applies them: the masks first (allowed tokens, bad words, min_tokens), then
# logit_bias, then penalties.
BUILTINS = ("allowed_token_ids", "bad_words", "min_tokens", "logit_bias", "penalties")
