#!/bin/bash
# Setup for pstack-store's approval-page test (store/tests/ui): Debian's
# headless Chromium driven over WebDriver by chromedriver, on loopback only.
# Sourced by scripts/test (uses apt_need).
apt_need chromium chromium-driver
