#!/bin/bash
# Setup for pstack-store's TLS test (store/tests/tls_proxy.rs), sourced by
# scripts/test (uses apt_need): the store terminates TLS in a reverse proxy
# (docs/store-tls.md), tested with Debian's nginx on loopback, and openssl
# makes the test's throwaway CA and certificate.
# The package's own nginx.service is not used (the test runs its own
# instance with a private config); stop it if the package started one.
apt_need nginx openssl
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet nginx 2>/dev/null; then
    systemctl stop nginx || true
fi
