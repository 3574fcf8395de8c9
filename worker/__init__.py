"""The genq worker: reads requests from Redis Streams, batches them under a token budget, runs
them through an engine and writes each result back. Start one with ``genq worker``."""
