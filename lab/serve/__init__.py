"""An OpenAI-compatible HTTP server over AsyncLLM (`lab serve`; lab/serve/api_server.py)."""
