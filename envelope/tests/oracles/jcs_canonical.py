#!/usr/bin/env python3
"""RFC 8785 canonical form of a pstack envelope *without* its "digest" member, written
to stdout. An independent implementation (Python's json module, not pstack's Rust
code) used as a test oracle: `jcs_canonical.py FILE | sha256sum` must give the digest
the envelope declares.

Integer-only JSON (the envelope forbids floats), so RFC 8785 reduces to: members sorted
by the UTF-16 code units of their names, no whitespace, integers in plain decimal, and
strings escaped like ECMAScript's JSON.stringify (Python's json with ensure_ascii=False
escapes exactly the same characters, with lowercase hex).
"""
import json
import sys


def refuse_float(text):
    raise SystemExit(f"jcs_canonical.py: float {text} (envelopes carry integers only)")


def canonical(value):
    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda kv: kv[0].encode("utf-16-be"))
        return "{" + ",".join(canonical(k) + ":" + canonical(v) for k, v in items) + "}"
    if isinstance(value, list):
        return "[" + ",".join(canonical(v) for v in value) + "]"
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    raise SystemExit(f"jcs_canonical.py: unexpected {type(value).__name__}")


def main():
    with open(sys.argv[1], "rb") as f:
        envelope = json.loads(f.read().decode("utf-8"), parse_float=refuse_float)
    envelope.pop("digest", None)
    sys.stdout.buffer.write(canonical(envelope).encode("utf-8"))


if __name__ == "__main__":
    main()
