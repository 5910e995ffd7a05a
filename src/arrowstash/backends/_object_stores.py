"""obstore stores from our URLs: S3 (and S3-compatible servers), GCS, Azure, an in-memory store
shared by name within a process, and a local folder. Credentials come from the arguments or the
clouds' standard environment variables, and never appear in what this module returns as text."""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

#: Our URL schemes -> obstore's: s3, gs and az are the clouds' own; the two others name the
#: obstore stores for tests and single machines (``memory://`` and ``file://`` are taken by the
#: Memory and File backends).
CLOUD_SCHEMES = {"s3": "s3", "gs": "gs", "az": "az"}
MEMORY_SCHEME = "objstore+memory"
LOCAL_SCHEME = "objstore+file"

#: Query parameters that are ours, not the store's configuration.
OUR_OPTIONS = ("encrypt",)

_memory_stores: dict[str, Any] = {}
_memory_guard = threading.Lock()


def obstore_module() -> Any:
    """obstore, imported when a backend is made (it is the ``s3`` extra)."""
    try:
        import obstore
        import obstore.store
    except ImportError as exc:
        raise ImportError("ObjectStoreBackend needs obstore: pip install 'arrowstash[s3]'") \
            from exc
    return obstore


def split_url(url: str) -> tuple[str, str, str, dict[str, str]]:
    """(scheme, bucket or store name, prefix, query options) of an object-store URL."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in (*CLOUD_SCHEMES, MEMORY_SCHEME, LOCAL_SCHEME):
        raise ValueError(f"not an object-store URL (s3://, gs://, az://, {MEMORY_SCHEME}://, "
                         f"{LOCAL_SCHEME}://): {public_url(url)!r}")
    options = dict(parse_qsl(parts.query, keep_blank_values=True))
    path = unquote(parts.path)
    if scheme == LOCAL_SCHEME:
        if not path:
            raise ValueError(f"{LOCAL_SCHEME}:// URL names no folder: {public_url(url)!r}")
        return scheme, path, "", options
    bucket = unquote(parts.hostname or "") if scheme != MEMORY_SCHEME else parts.netloc
    if scheme in CLOUD_SCHEMES and not bucket:
        raise ValueError(f"object-store URL names no bucket: {public_url(url)!r}")
    return scheme, bucket, path.strip("/"), options


def public_url(url: str) -> str:
    """``url`` without user information or query values that could hold a secret (only the
    names of query options are kept): what reprs, logs and errors show."""
    parts = urlsplit(url)
    netloc = parts.hostname or ""
    if parts.port:
        netloc += f":{parts.port}"
    if parts.scheme.lower() == MEMORY_SCHEME:
        netloc = parts.netloc.rpartition("@")[2]
    shown = [name if _secret(name) else f"{name}={value}"
             for name, value in parse_qsl(parts.query, keep_blank_values=True)]
    return urlunsplit((parts.scheme, netloc, parts.path, "&".join(shown), ""))


def _secret(name: str) -> bool:
    lowered = name.lower()
    return any(word in lowered for word in ("secret", "key", "token", "password", "sas",
                                              "credential", "signature"))


def make_store(scheme: str, bucket: str, prefix: str, config: dict[str, Any],
               timeout: float, connect_timeout: float, retries: int) -> Any:
    """The obstore store for a split URL; ``config`` holds the store's own options
    (endpoint, region, credentials...)."""
    obstore = obstore_module()
    stores = obstore.store
    if scheme == MEMORY_SCHEME:
        with _memory_guard:
            store = _memory_stores.get(bucket)
            if store is None:
                store = _memory_stores[bucket] = stores.MemoryStore()
        return store
    if scheme == LOCAL_SCHEME:
        return stores.LocalStore(bucket, mkdir=True)
    client: dict[str, Any] = {"timeout": f"{timeout}s", "connect_timeout": f"{connect_timeout}s"}
    endpoint = str(config.get("endpoint", ""))
    if endpoint.startswith("http://"):
        client["allow_http"] = True  # an explicit http:// endpoint is what the user asked for
    retry = {"max_retries": retries, "retry_timeout": dt.timedelta(seconds=timeout),
             "backoff": {"init_backoff": dt.timedelta(milliseconds=50),
                         "max_backoff": dt.timedelta(seconds=1)}}
    if scheme == "s3":
        # SigV4 signs a SHA-256 of each request body unless the body is declared
        # UNSIGNED-PAYLOAD, as boto3 does over https: hashing a flights entry costs a store
        # about as much CPU as compressing a fifth of it. TLS (and S3's own MD5/CRC checks
        # where a client sends them) still guard the bytes; over plain http nothing does, and
        # the entry's own checksums catch damage on read. unsigned_payload=False signs them.
        config = {"unsigned_payload": True, **config}
    kinds = {"s3": stores.S3Store, "gs": stores.GCSStore, "az": stores.AzureStore}
    return kinds[scheme](bucket, prefix=prefix or None, client_options=client,
                         retry_config=retry, **config)
