"""Tools for developing and measuring genq, apart from the runtime: a private redis-server for
tests, the demo and benchmarks, and the benchmark scenarios behind ``genq bench``."""
