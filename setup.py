"""Build of the optional native Avro decoder and encoder, of the string-lengths helper of
cache keys and of the dictionary codes of compressed frames' string columns; everything else
is configured in pyproject.toml.

``optional=True``: where no C compiler (or no pthreads) exists, the install still succeeds,
``arrowstash.avro`` uses its pure-Python decoder and encoder, keys use the helper's NumPy twin
and frames Arrow's dictionary_encode.
An extension's header is in ``depends``, so that a change to it rebuilds the extension.
"""

from setuptools import Extension, setup

NATIVE = "src/arrowstash/avro/_native"

setup(
    ext_modules=[
        Extension(
            "arrowstash.avro._native._cdecode",
            [
                f"{NATIVE}/_cdecode.c",
                f"{NATIVE}/_cdecode_values.c",
                f"{NATIVE}/_cdecode_batch.c",
                f"{NATIVE}/_cdecode_blocks.c",
                f"{NATIVE}/_cdecode_export.c",
            ],
            depends=[f"{NATIVE}/_cdecode.h", f"{NATIVE}/_pool.h", f"{NATIVE}/_reuse.h",
                     f"{NATIVE}/_utf8.h", f"{NATIVE}/_arrow_c.h"],
            extra_compile_args=["-O3", "-pthread", "-Wall", "-Wno-missing-field-initializers"],
            extra_link_args=["-pthread"],
            libraries=["dl"],  # dlopen: libdeflate, where the system has it
            optional=True,
        ),
        Extension(
            "arrowstash.avro._native._cencode",
            [
                f"{NATIVE}/_encode.c",
                f"{NATIVE}/_encode_rows.c",
                f"{NATIVE}/_encode_bind.c",
            ],
            depends=[f"{NATIVE}/_encode.h", f"{NATIVE}/_pool.h", f"{NATIVE}/_reuse.h",
                     f"{NATIVE}/_arrow_c.h"],
            extra_compile_args=["-O3", "-pthread", "-Wall", "-Wno-missing-field-initializers"],
            extra_link_args=["-pthread"],
            optional=True,
        ),
        Extension(
            "arrowstash.caching._lengths",
            ["src/arrowstash/caching/_lengths.c"],
            extra_compile_args=["-O3", "-Wall"],
            optional=True,
        ),
        Extension(
            "arrowstash.serializers._arrow._codes",
            ["src/arrowstash/serializers/_arrow/_codes.c"],
            extra_compile_args=["-O3", "-Wall"],
            optional=True,
        ),
    ],
)
