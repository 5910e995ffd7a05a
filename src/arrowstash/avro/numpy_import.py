"""NumPy, which framing, resolution and container files use for whole-column arithmetic."""

try:
    import numpy
except ImportError as exc:  # pyarrow >= 16 installs without it
    raise ImportError(
        "Avro framing, schema resolution and container files need NumPy: "
        "pip install 'arrowstash[avro]'"
    ) from exc

__all__ = ["numpy"]
