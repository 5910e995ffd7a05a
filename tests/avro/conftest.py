"""Fixtures the Avro tests share."""

from __future__ import annotations

import pytest

from arrowstash.avro.writer_decoder import native_inflate_available


@pytest.fixture(params=["native", "python"])
def inflate(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Deflate blocks inflated inside the native decoder (libdeflate) or by Python."""
    monkeypatch.setenv("ARROWSTASH_AVRO_LIBDEFLATE", "1" if request.param == "native" else "0")
    if request.param == "native" and not native_inflate_available():
        pytest.skip("the native decoder is not built or the system has no libdeflate")
    return str(request.param)
