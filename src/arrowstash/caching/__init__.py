"""The caching layer: ``@cache``, its options, the pipeline of a call and what it consults
(keys, L1, freshness, logs)."""
