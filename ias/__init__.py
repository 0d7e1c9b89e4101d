"""iAs: a self-hosted personal assistant daemon (WeChat + LLM + skills)."""
