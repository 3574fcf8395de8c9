#!/usr/bin/env bash
# The dashboard page's screenshots (docs/dashboard/*.png): the dashboard's browser tests take
# them, each page as the test left it. Needs Debian's chromium (apt-get install chromium).
set -euo pipefail
cd "$(dirname "$0")/.."
DASHBOARD_SCREENSHOTS_DIR="$PWD/docs/dashboard" .venv/bin/python -m pytest -q tests/test_dashboard.py
ls -l docs/dashboard
