"""Emit spans through the OpenTelemetry Python SDK and its real OTLP/HTTP
protobuf exporter (opentelemetry-exporter-otlp-proto-http), for the store's
blast-radius tests (store/tests/analysis/otel_sdk.rs).

Reads a JSON plan on stdin:

    {"endpoint": "http://127.0.0.1:PORT/v1/traces", "apiKey": "psk_...",
     "resources": [{"attributes": {"service.name": ..., ...},
                    "spans": [{"name": ..., "startNs": ..., "endNs": ...,
                               "error": false, "attributes": {...},
                               "events": [{"name": ..., "attributes": {...}}]}]}]}

One TracerProvider per resource (as one process per version would have),
each with a BatchSpanProcessor over the SDK's exporter. The SDK stamps span
ids, trace ids and the protobuf encoding itself; the plan only places spans
in time (explicit start_time / end_time). Prints {"exported": n} and exits
0 only when every span was accepted by the store.
"""

import json
import sys

from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExportResult
from opentelemetry.trace import SpanKind, Status, StatusCode


class CheckedExporter(OTLPSpanExporter):
    """The SDK's exporter, counting what the store accepted."""

    exported = 0
    failed_batches = 0

    def export(self, spans):
        result = super().export(spans)
        if result == SpanExportResult.SUCCESS:
            CheckedExporter.exported += len(spans)
        else:
            CheckedExporter.failed_batches += 1
        return result


def main():
    plan = json.load(sys.stdin)
    planned = 0
    for res in plan["resources"]:
        exporter = CheckedExporter(
            endpoint=plan["endpoint"],
            headers={"authorization": "Bearer " + plan["apiKey"]},
            timeout=60,
            compression=Compression.Gzip if plan.get("gzip") else Compression.NoCompression,
        )
        provider = TracerProvider(resource=Resource.create(res["attributes"]))
        # A queue large enough that no span is dropped before export.
        provider.add_span_processor(
            BatchSpanProcessor(
                exporter,
                max_queue_size=1_000_000,
                max_export_batch_size=512,
                schedule_delay_millis=100,
            )
        )
        tracer = provider.get_tracer("pstack-store-tests")
        for s in res["spans"]:
            span = tracer.start_span(
                s["name"],
                kind=SpanKind.SERVER,
                start_time=s["startNs"],
                attributes=s.get("attributes") or {},
            )
            for e in s.get("events") or []:
                span.add_event(e["name"], e.get("attributes") or {}, timestamp=s["startNs"])
            if s.get("error"):
                span.set_status(Status(StatusCode.ERROR, "request failed"))
            span.end(end_time=s["endNs"])
            planned += 1
        if not provider.force_flush(120_000):
            print("force_flush timed out", file=sys.stderr)
            sys.exit(1)
        provider.shutdown()
    print(json.dumps({"exported": CheckedExporter.exported, "planned": planned}))
    if CheckedExporter.failed_batches or CheckedExporter.exported != planned:
        print(
            f"export failed: {CheckedExporter.failed_batches} batches refused, "
            f"{CheckedExporter.exported} of {planned} spans accepted",
            file=sys.stderr,
        )
        sys.exit(1)


if __name__ == "__main__":
    main()
