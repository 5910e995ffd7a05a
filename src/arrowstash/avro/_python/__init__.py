"""The pure-Python decoder and encoder: the twins of ``_native``, walking the same plans, used
where the extensions are not built or ``ARROWSTASH_AVRO_NATIVE=0``."""
