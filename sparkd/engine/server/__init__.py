"""`sparkd-engine serve`: the OpenAI-compatible HTTP server around sparkd.engine.runtime.Engine."""
