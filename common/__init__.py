"""Shared pieces of genq: request/result models, settings, the Redis key layout, errors.

Nothing here imports torch or transformers; the client library and the worker both use it.
"""
