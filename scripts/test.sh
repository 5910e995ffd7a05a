#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs the Redis and Memcached servers the tests
# start and libdeflate (Debian packages), creates .venv with arrowstash and its test
# dependencies, then runs ruff, mypy and pytest. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
command -v redis-cli >/dev/null || missing+=(redis-tools)
command -v memcached >/dev/null || missing+=(memcached)
# libdeflate: the native Avro decoder inflates deflate container files with it where it exists
/sbin/ldconfig -p 2>/dev/null | grep -q "libdeflate\.so\.0" || missing+=(libdeflate0)
if [ ${#missing[@]} -gt 0 ]; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet --group test -e .
.venv/bin/ruff check src tests benchmarks
.venv/bin/mypy
.venv/bin/pytest "$@"
