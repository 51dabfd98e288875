"""An agent and a runner written to seed 000, speaking to pstack-store only
through the official MCP Python SDK (`mcp` on PyPI, pinned by
scripts/setup.d/62-mcp-python.sh), over stdio or streamable HTTP.

Driven by store/tests/mcp/sdk.rs. The plan (JSON on stdin) names the
transport, the two keys (an agent key with the `analysis` + `read` scopes, a
runner key with `runner` only) and the records the test prepared over REST
(a deploy, eval runs written by a third key, two envelopes). Every tool is
called with the seed's argument names (`serviceName`, `webhookSecret`,
`operation`, `incident` / `change` / `finding` anchors); the answers are
checked against the seed's shapes (`data.finding`, `data.counterfactualError`,
`bundle.autosre`). The runner claims and completes one grant and fails
another over MCP alone. A grant webhook is received on a loopback port and
its `X-Obs-Signature-256` checked with the `webhookSecret`.

Prints one JSON report on stdout (ids for the test to check the store
with); any failed check exits non-zero naming it.
"""

import asyncio
import hashlib
import hmac
import http.server
import json
import sys
import threading

import httpx2
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

TOOLS = sorted(
    [
        "get_evidence_bundle",
        "list_recent_changes",
        "get_change_blast_radius",
        "search_similar_findings",
        "list_incidents",
        "get_incident",
        "get_remediation_proposal",
        "get_envelope_handoff",
        "diff_envelopes",
        "list_open_unknowns",
        "open_incident",
        "record_investigation_finding",
        "propose_remediation_action",
        "claim_remediation_grant",
    ]
)

CALLED = set()


class CheckFailed(Exception):
    pass


def check(cond, what, detail=None):
    if not cond:
        raise CheckFailed(f"{what}: {json.dumps(detail)[:2000] if detail is not None else ''}")


def result_json(r):
    """A tool result as JSON: the structured content, else the text."""
    if r.structured_content is not None:
        return r.structured_content
    text = "".join(getattr(c, "text", "") for c in r.content)
    try:
        return json.loads(text)
    except ValueError:
        return {"text": text}


async def ok(session, tool, args):
    CALLED.add(tool)
    r = await session.call_tool(tool, args)
    body = result_json(r)
    check(not r.is_error, f"{tool} succeeds", body)
    return body


async def tool_error(session, tool, args):
    """The route's typed error, as a tool error."""
    CALLED.add(tool)
    r = await session.call_tool(tool, args)
    body = result_json(r)
    check(r.is_error, f"{tool} is refused", body)
    return body.get("error", {})


async def protocol_error(session, tool, args):
    """A bad argument: a protocol error naming the field."""
    try:
        r = await session.call_tool(tool, args)
    except MCPError as e:
        return e
    raise CheckFailed(f"{tool} with {sorted(args)}: expected a protocol error, got {result_json(r)}")


def has_key(v, key):
    if isinstance(v, dict):
        return any(k == key and v[k] is not None or has_key(x, key) for k, x in v.items())
    if isinstance(v, list):
        return any(has_key(x, key) for x in v)
    return False


class Receiver:
    """A loopback HTTP receiver for the grant webhook."""

    def __init__(self):
        self.got = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                n = int(self.headers.get("content-length", "0"))
                body = self.rfile.read(n)
                outer.got.append((self.path, self.headers.get("x-obs-signature-256"), body))
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


async def agent(session, plan, report):
    tools = (await session.list_tools()).tools
    names = sorted(t.name for t in tools)
    check(names == TOOLS, "the fourteen tools with writes enabled", names)
    schema = {t.name: t.input_schema for t in tools}
    props = lambda n: set(schema[n].get("properties", {}))
    check("serviceName" in props("list_recent_changes") and "service" not in props("list_recent_changes"),
          "list_recent_changes documents serviceName", schema["list_recent_changes"])
    check("webhookSecret" in props("propose_remediation_action") and "secret" not in props("propose_remediation_action"),
          "propose_remediation_action documents webhookSecret", schema["propose_remediation_action"])
    check({"incident", "change", "finding", "intent"} <= props("get_evidence_bundle"),
          "get_evidence_bundle takes the three anchors", schema["get_evidence_bundle"])
    check("operation" in props("claim_remediation_grant") and "operation" not in schema["claim_remediation_grant"].get("required", []),
          "claim_remediation_grant takes an optional operation", schema["claim_remediation_grant"])
    check("complete" in json.dumps(schema["claim_remediation_grant"]), "operation lists complete", schema["claim_remediation_grant"])

    change = plan["changeId"]
    # list_recent_changes, scoped by environment and serviceName.
    listed = await ok(session, "list_recent_changes", {"environment": "prod", "serviceName": "checkout-api"})
    check([c["id"] for c in listed["items"]] == [change], "serviceName scopes the changes", listed)
    other = await ok(session, "list_recent_changes", {"environment": "prod", "serviceName": "orders-api"})
    check(other["items"] == [], "another serviceName lists none", other)
    alias = await ok(session, "list_recent_changes", {"service": "checkout-api"})
    check([c["id"] for c in alias["items"]] == [change], "service stays an alias", alias)
    e = await protocol_error(session, "list_recent_changes", {"serviceName": "checkout-api", "surprise": 1})
    check("surprise" in str(e) or "argument" in str(e), "an unknown argument is named", str(e))

    radius = await ok(session, "get_change_blast_radius", {"changeId": change, "minSample": 50})
    check("verdict" in radius, "a blast radius has a verdict", radius)

    # open_incident, then the same symptom joins it.
    opened = await ok(session, "open_incident", {"project": "shop", "environment": "prod", "dedupKey": "checkout-5xx",
                                                 "title": "checkout 5xx after 2.4.1", "faultLocusEntityId": "checkout-api"})
    incident = opened["incident"]["id"]
    check(opened["deduplicated"] is False, "a new incident", opened)
    again = await ok(session, "open_incident", {"project": "shop", "environment": "prod", "dedupKey": "checkout-5xx",
                                                "title": "checkout 5xx again"})
    check(again["deduplicated"] is True and again["incident"]["id"] == incident, "the same symptom joins it", again)

    # record_investigation_finding with a verified counterfactual.
    chain = [
        {"subject": change, "relation": "degraded_after_change", "object": "checkout-api"},
        {"subject": change, "relation": "verified_by_counterfactual", "object": "checkout-api"},
    ]
    finding_args = {
        "environment": "prod",
        "incidentId": incident,
        "faultLocusEntityId": "checkout-api",
        "contributingChangeId": change,
        "causalChain": chain,
        "citedEvidenceIds": [plan["before"]],
        "fingerprintInput": plan["fingerprintInput"],
        "counterfactual": {"failingRunId": plan["failingRunId"], "passingRunIds": [plan["passingRunId"]], "requiredTrials": 1},
        "idempotencyKey": "sdk-verified",
    }
    rec = await ok(session, "record_investigation_finding", finding_args)
    finding = rec["data"]["finding"]
    check(finding["causalProofTier"] == "counterfactual_verified", "the tier is derived: counterfactual_verified", rec)
    check(finding["fingerprint"] == plan["fingerprint"], "the recurrence fingerprint", rec)
    check("counterfactualError" not in rec["data"], "a verified pairing has no error", rec)
    replay = await ok(session, "record_investigation_finding", finding_args)
    check(replay["data"]["finding"]["id"] == finding["id"] and replay.get("idempotentReplay") is True,
          "a retry returns the recorded finding", replay)
    # A pairing that fails after the finding is stored: data.finding +
    # data.counterfactualError, not an error hiding the finding id.
    bad = dict(finding_args, idempotencyKey="sdk-mismatch",
               counterfactual={"failingRunId": plan["failingRunId"], "passingRunIds": [plan["otherPayloadRunId"]], "requiredTrials": 1})
    rec2 = await ok(session, "record_investigation_finding", bad)
    check(rec2["data"]["finding"]["id"].startswith("fnd_"), "data.finding is the stored finding", rec2)
    check(rec2["data"]["counterfactualError"]["code"] == "payload_mismatch", "data.counterfactualError says why", rec2)
    check(rec2["data"]["finding"]["causalProofTier"] != "counterfactual_verified", "an unverified pairing earns nothing", rec2)
    # A missing eval run fails before anything is stored.
    missing = dict(finding_args, idempotencyKey="sdk-missing",
                   counterfactual={"failingRunId": "evr_ffffffffffffffff", "passingRunIds": [plan["passingRunId"]], "requiredTrials": 1})
    err = await tool_error(session, "record_investigation_finding", missing)
    check(err.get("field") == "counterfactual.failingRunId", "a missing run is named", err)

    similar = await ok(session, "search_similar_findings", {"fingerprint": plan["fingerprint"]})
    ids = sorted(f["id"] for f in similar["items"])
    check(ids == sorted([finding["id"], rec2["data"]["finding"]["id"]]), "findings by fingerprint", similar)

    incidents = await ok(session, "list_incidents", {"environment": "prod", "status": "open", "limit": 5})
    check([i["id"] for i in incidents["items"]] == [incident], "list_incidents by environment and status", incidents)
    detail = await ok(session, "get_incident", {"id": incident})
    check(len(detail["findings"]) == 2, "get_incident with its findings", detail)

    # get_evidence_bundle: the incident (intent triage_incident), the
    # change and the finding anchors, each with bundle.autosre.
    for args, kind in [
        ({"intent": "triage_incident", "incident": incident}, "incident"),
        ({"change": change, "budgetTokens": 100000}, "change"),
        ({"finding": finding["id"]}, "finding"),
    ]:
        b = await ok(session, "get_evidence_bundle", args)
        autosre = b.get("bundle", {}).get("autosre", {})
        check({"faultLocus", "candidateChanges", "contentionCandidates", "priorFindings"} <= set(autosre),
              f"bundle.autosre of a {kind} anchor", b)
        check(b["anchor"]["kind"] == kind, f"the {kind} anchor is named", b["anchor"])
        check(autosre["faultLocus"]["entityId"] == "checkout-api", f"the {kind} bundle's fault locus", autosre["faultLocus"])
        check(autosre["candidateChanges"][0]["change"]["id"] == change, f"the {kind} bundle ranks the change first", autosre)
    err = await tool_error(session, "get_evidence_bundle", {"incident": incident, "change": change})
    check(err.get("field") == "change", "two anchors are refused, named", err)

    handoff = await ok(session, "get_envelope_handoff", {"digest": plan["before"]})
    check("frontier" in handoff or "next_transition" in handoff, "a handoff", handoff)
    diff = await ok(session, "diff_envelopes", {"before": plan["before"], "after": plan["after"]})
    check(diff.get("before") == plan["before"], "a diff of the two envelopes", diff)
    unknowns = await ok(session, "list_open_unknowns", {"limit": 5})
    check("items" in unknowns, "open unknowns", unknowns)

    # propose_remediation_action with webhookUrl + webhookSecret: an
    # autonomous grant, delivered to the receiver, signed with the secret.
    rx = Receiver()
    try:
        secret = "sdk-hmac-secret-7"
        propose = {
            "incidentId": incident,
            "findingId": finding["id"],
            "action": "rollback_deploy",
            "target": {"service": "checkout-api", "environment": "prod"},
            "expectedCurrentState": {"version": "2.4.1", "commitSha": "8f3a1b2"},
            "idempotencyKey": "sdk-rollback",
            "webhookUrl": f"http://127.0.0.1:{rx.port}/grant-7f3?q=1",
            "webhookSecret": secret,
        }
        p = await ok(session, "propose_remediation_action", propose)
        check(p["proposal"]["status"] == "grant_issued", "counterfactual_verified rollback: an autonomous grant", p)
        token = p["grantToken"]
        check(token.startswith("rgt_"), "a grant token", p["proposal"])
        check(p["grantDelivery"]["delivered"] is True, "the grant was delivered", p["grantDelivery"])
        check(len(rx.got) == 1, "one delivery", len(rx.got))
        path, signature, body = rx.got[0]
        want = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
        check(signature == want, "X-Obs-Signature-256 is the HMAC of the body under webhookSecret", signature)
        sent = json.loads(body)
        check(sent["event"] == "autosre.remediation.grant_issued" and sent["grantToken"] == token,
              "the delivered grant", {k: sent.get(k) for k in ("event", "proposalId", "status")})
    finally:
        rx.close()
    proposal = p["proposal"]["id"]
    got = await ok(session, "get_remediation_proposal", {"id": proposal})
    check(got["proposal"]["status"] == "grant_issued" and not has_key(got, "grantToken"),
          "get_remediation_proposal never returns the token", got)
    check(secret not in json.dumps(got) and "grant-7f3" not in json.dumps(got), "nor the webhook secret or path", got)
    # The agent's key has no runner scope: the route refuses its claim.
    err = await tool_error(session, "claim_remediation_grant",
                           {"proposalId": proposal, "grantToken": token, "runnerId": "agent", "operation": "claim"})
    check(err.get("code") == "insufficient_scope", "claiming needs the runner scope", err)
    # A second grant, which the runner will fail.
    p2 = await ok(session, "propose_remediation_action",
                  dict(propose, idempotencyKey="sdk-rollback-2", webhookUrl=None, webhookSecret=None))
    check(p2["proposal"]["status"] == "grant_issued", "a second grant", p2)
    report.update(incidentId=incident, findingId=finding["id"], proposalId=proposal, failedProposalId=p2["proposal"]["id"])
    return token, p2["grantToken"]


async def runner(session, plan, report, token, token2):
    proposal, failed = report["proposalId"], report["failedProposalId"]
    # The runner key holds the runner scope only: reads are refused.
    err = await tool_error(session, "list_incidents", {})
    check(err.get("code") == "insufficient_scope", "a runner key reads nothing", err)
    base = {"proposalId": proposal, "grantToken": token, "runnerId": "runner-sdk-1"}
    c = await ok(session, "claim_remediation_grant", dict(base, operation="claim"))
    check(c["proposal"]["status"] == "claimed_executing", "claimed", c)
    err = await tool_error(session, "claim_remediation_grant", dict(base, operation="claim"))
    check(err.get("code") == "grant_already_claimed", "a grant is single-use", err)
    err = await tool_error(session, "claim_remediation_grant", dict(base, runnerId="runner-sdk-2", operation="complete"))
    check(err.get("code") == "not_claiming_runner", "only the claiming runner completes", err)
    done = await ok(session, "claim_remediation_grant",
                    dict(base, operation="complete", result={"rolledBackTo": "2.4.0"}))
    check(done["proposal"]["status"] == "completed", "completed over MCP", done)
    check(done["proposal"]["recoveryStatus"] == "monitoring", "completion arms the watchdog", done["proposal"])
    err = await tool_error(session, "claim_remediation_grant", dict(base, operation="fail"))
    check(err.get("code") == "invalid_status", "a completed grant cannot fail", err)
    # The second grant: claimed with the default operation, then failed.
    b2 = {"proposalId": failed, "grantToken": token2, "runnerId": "runner-sdk-1"}
    c2 = await ok(session, "claim_remediation_grant", b2)
    check(c2["proposal"]["status"] == "claimed_executing", "claim is the default operation", c2)
    f2 = await ok(session, "claim_remediation_grant", dict(b2, operation="fail", result={"error": "helm timed out"}))
    check(f2["proposal"]["status"] == "failed_execution", "failed over MCP", f2)
    e = await protocol_error(session, "claim_remediation_grant", dict(b2, operation="abandon"))
    check("operation" in str(e), "an unknown operation is named", str(e))


async def session_over(plan, key, body):
    if plan["transport"] == "stdio":
        env = dict(plan["env"], PSTACK_STORE_API_KEY=key)
        params = StdioServerParameters(command=plan["command"], args=plan["args"], env=env)
        async with stdio_client(params, errlog=sys.stderr) as (read, write):
            async with ClientSession(read, write) as s:
                await s.initialize()
                return await body(s)
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=60) as http:
        async with streamable_http_client(plan["url"], http_client=http) as (read, write):
            async with ClientSession(read, write) as s:
                await s.initialize()
                return await body(s)


async def main():
    plan = json.load(sys.stdin)
    report = {"transport": plan["transport"]}
    tokens = await session_over(plan, plan["agentKey"], lambda s: agent(s, plan, report))
    await session_over(plan, plan["runnerKey"], lambda s: runner(s, plan, report, *tokens))
    report["toolsCalled"] = sorted(CALLED)
    print(json.dumps(report))


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except CheckFailed as e:
        print(f"check failed: {e}", file=sys.stderr)
        sys.exit(1)
