#!/usr/bin/env bash
# The native Avro decoder and encoder built with AddressSanitizer and UndefinedBehaviorSanitizer
# into a scratch copy of src/, then the Avro tests (and the garbage fuzz, scaled up) run against
# them. Not part of CI: it needs gcc's libasan and takes minutes. Usage:
#   bash scripts/asan.sh                 # the native tests, skips, encoder and fuzz
#   bash scripts/asan.sh tests/test_x.py # other tests, same build
# ARROWSTASH_FUZZ_EXAMPLES sets the fuzz's examples per test (default here: 2000).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cp -r src "$scratch/src"
include=$("$py" -c "import sysconfig; print(sysconfig.get_path('include'))")
suffix=$("$py" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
flags=(-shared -fPIC -g -O1 -pthread -fno-omit-frame-pointer -fsanitize=address,undefined
       -fno-sanitize-recover=undefined -Wall -Wno-missing-field-initializers -I"$include")
gcc "${flags[@]}" src/arrowstash/avro/_native/_cdecode*.c -o "$scratch/src/arrowstash/avro/_native/_cdecode$suffix"
gcc "${flags[@]}" src/arrowstash/avro/_native/_encode*.c -o "$scratch/src/arrowstash/avro/_native/_cencode$suffix"
# Python itself is not instrumented: the ASan runtime must be loaded first; CPython's own
# allocations are not leaks to report.
export LD_PRELOAD="$(gcc -print-file-name=libasan.so)"
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export PYTHONPATH="$scratch/src" ARROWSTASH_FUZZ_EXAMPLES=${ARROWSTASH_FUZZ_EXAMPLES:-2000}
"$py" -c "import arrowstash.avro._native._cdecode as d, sys; assert d.__file__.startswith('$scratch'), d"
if [ $# -eq 0 ]; then
    set -- tests/avro/test_avro_native.py tests/avro/test_avro_skip.py tests/avro/test_avro_encode.py \
        tests/avro/test_avro_encode_defaults.py tests/avro/test_avro_fuzz.py tests/avro/test_avro_ocf.py
fi
# blocks come from malloc under ASan (it checks them), not from huge-page mappings
"$py" -m pytest -q -p no:cacheprovider -k "not huge_pages" "$@"
