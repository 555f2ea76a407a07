"""trident: a Triton-compatible inference server on trio structured concurrency."""

__version__ = "0.1.0"
