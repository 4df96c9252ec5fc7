"""Routed experts streamed from disk under a memory budget (plan, arena, reader, cache, store)."""
