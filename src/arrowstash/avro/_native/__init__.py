"""The native Avro decoder and encoder (C extensions ``_cdecode`` and ``_cencode``), built
where a C compiler exists; ``arrowstash.avro`` falls back to ``_python`` without them."""
