# shellcheck shell=bash
# The OpenTelemetry Python SDK as an outside client of pstack-store (sourced by
# scripts/test; uses apt_need).
#
# - python3-venv: a venv at /opt/pstack-otel-python-<version> with the SDK
#   (opentelemetry-sdk) and its real OTLP/HTTP protobuf exporter
#   (opentelemetry-exporter-otlp-proto-http), pinned. The blast-radius tests in
#   store/tests/analysis/otel_sdk.rs drive the store through it (env
#   PSTACK_OTEL_PYTHON overrides the interpreter).

apt_need python3-venv

pstack_otel_version=1.45.2
pstack_otel_venv=/opt/pstack-otel-python-$pstack_otel_version
if [ ! -x "$pstack_otel_venv/bin/python" ] \
    || ! "$pstack_otel_venv/bin/python" -c 'import opentelemetry.exporter.otlp.proto.http.trace_exporter' 2>/dev/null; then
    /usr/bin/python3 -m venv "$pstack_otel_venv"
    "$pstack_otel_venv/bin/pip" install --quiet --disable-pip-version-check \
        "opentelemetry-sdk==$pstack_otel_version" \
        "opentelemetry-exporter-otlp-proto-http==$pstack_otel_version"
fi
