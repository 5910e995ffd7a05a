"""Build of the optional native Avro decoder and encoder; everything else is configured in
pyproject.toml.

``optional=True``: where no C compiler (or no pthreads) exists, the install still succeeds and
``arrowstash.avro`` uses its pure-Python decoder and encoder. An extension's header is in
``depends``, so that a change to it rebuilds the extension.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "arrowstash.avro._cdecode",
            [
                "src/arrowstash/avro/_cdecode.c",
                "src/arrowstash/avro/_cdecode_values.c",
                "src/arrowstash/avro/_cdecode_batch.c",
                "src/arrowstash/avro/_cdecode_blocks.c",
            ],
            depends=["src/arrowstash/avro/_cdecode.h", "src/arrowstash/avro/_pool.h",
                     "src/arrowstash/avro/_reuse.h"],
            extra_compile_args=["-O3", "-pthread", "-Wall", "-Wno-missing-field-initializers"],
            extra_link_args=["-pthread"],
            libraries=["dl"],  # dlopen: libdeflate, where the system has it
            optional=True,
        ),
        Extension(
            "arrowstash.avro._cencode",
            [
                "src/arrowstash/avro/_encode.c",
                "src/arrowstash/avro/_encode_rows.c",
                "src/arrowstash/avro/_encode_bind.c",
            ],
            depends=["src/arrowstash/avro/_encode.h", "src/arrowstash/avro/_pool.h",
                     "src/arrowstash/avro/_reuse.h"],
            extra_compile_args=["-O3", "-pthread", "-Wall", "-Wno-missing-field-initializers"],
            extra_link_args=["-pthread"],
            optional=True,
        ),
    ],
)
