#!/usr/bin/env bash
# The code sandbox's seccomp filter (src/rollwise/sandbox/_launcher.py) is compiled by libseccomp, loaded
# through ctypes: Debian's libseccomp2 only (no Python binding needed, any interpreter works). Without it,
# isolation "required" (the default for code rewards) refuses to run. Idempotent: a no-op when installed.
set -euo pipefail
if ! ldconfig -p 2>/dev/null | grep -q 'libseccomp\.so\.2'; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libseccomp2 >/dev/null
fi
