#!/usr/bin/env bash
# Headless Chromium for the report's browser test (tests/report/test_report_browser.py).
# Debian's package only: the test never downloads a browser. Idempotent: a no-op when installed.
set -euo pipefail
if [ ! -x /usr/bin/chromium ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
