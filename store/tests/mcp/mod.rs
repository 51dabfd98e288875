//! The MCP server with a real MCP client (rmcp's client side) over stdio
//! (the `pstack-store mcp` binary as a child process) and over streamable
//! HTTP (`/mcp` on the store's port): initialize, list tools (exactly 10,
//! 14 with writes), call, and an error for a bad argument.

use pstack_store_core::db::{OpenOptions, Store};
use pstack_store_core::keys::ScopeSet;
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use serde_json::{Value, json};

mod proxy;
mod sdk;

use crate::runs::secrets::assert_clean;
use crate::support::{Db, Harness};

const READS: [&str; 10] = [
    "diff_envelopes",
    "get_change_blast_radius",
    "get_envelope_handoff",
    "get_evidence_bundle",
    "get_incident",
    "get_remediation_proposal",
    "list_incidents",
    "list_open_unknowns",
    "list_recent_changes",
    "search_similar_findings",
];
const WRITES: [&str; 4] = [
    "claim_remediation_grant",
    "open_incident",
    "propose_remediation_action",
    "record_investigation_finding",
];

fn args(v: Value) -> serde_json::Map<String, Value> {
    v.as_object().cloned().unwrap_or_default()
}

async fn call(
    c: &RunningService<RoleClient, ()>,
    tool: &'static str,
    a: Value,
) -> Result<rmcp::model::CallToolResult, rmcp::ServiceError> {
    c.call_tool(CallToolRequestParams::new(tool).with_arguments(args(a)))
        .await
}

/// The session every transport must pass. `writes`: whether the server
/// was started with writes enabled. Returns every response as text.
async fn exercise(
    c: &RunningService<RoleClient, ()>,
    writes: bool,
    incident: Option<&str>,
) -> String {
    let mut seen = String::new();
    let mut names: Vec<String> = c
        .list_all_tools()
        .await
        .expect("tools/list")
        .into_iter()
        .map(|t| {
            assert_eq!(
                t.input_schema.get("type"),
                Some(&json!("object")),
                "{}",
                t.name
            );
            t.name.to_string()
        })
        .collect();
    names.sort();
    let mut want: Vec<&str> = READS.to_vec();
    if writes {
        want.extend(WRITES);
        want.sort();
    }
    assert_eq!(names, want);
    // A call that works.
    let r = call(c, "list_incidents", json!({"limit": 5}))
        .await
        .expect("call");
    assert_ne!(r.is_error, Some(true), "{r:?}");
    let listed = r.structured_content.clone().expect("structured content");
    seen.push_str(&listed.to_string());
    if let Some(id) = incident {
        assert_eq!(listed["items"][0]["id"], id, "{listed}");
        let r = call(c, "get_incident", json!({"id": id}))
            .await
            .expect("call");
        assert_eq!(r.structured_content.as_ref().unwrap()["incident"]["id"], id);
    }
    // A bad argument: a protocol error naming the field, not the value.
    let e = call(c, "get_incident", json!({"id": 7})).await.unwrap_err();
    let text = format!("{e:?}");
    assert!(text.contains("id"), "{text}");
    let e = call(
        c,
        "get_incident",
        json!({"id": "x", "hunter2": "sk-live-1"}),
    )
    .await
    .unwrap_err();
    seen.push_str(&format!("{e:?}"));
    // An unknown id: the route's typed error, as a tool error.
    let r = call(c, "get_incident", json!({"id": "inc_hunter2"}))
        .await
        .expect("call");
    assert_eq!(r.is_error, Some(true));
    seen.push_str(&format!("{r:?}"));
    // A write tool without writes enabled does not exist.
    if !writes {
        assert!(call(c, "open_incident", json!({})).await.is_err());
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mcp_over_streamable_http_reads_and_writes() {
    for writes in [false, true] {
        let Some(h) =
            Harness::start_custom(Db::Sqlite, Default::default(), |s| s.mcp_writes = writes).await
        else {
            return;
        };
        let (st, inc) = crate::runs::post(
            &h,
            "/internal/incidents",
            &json!({"project": "p", "environment": "prod", "dedupKey": "k", "title": "disk"}),
        )
        .await;
        assert!(st.is_success(), "{inc}");
        let id = inc["incident"]["id"].as_str().unwrap().to_string();
        // Without the key, /mcp refuses before anything is read.
        let resp = h
            .client
            .post(h.url("/mcp"))
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), reqwest::StatusCode::UNAUTHORIZED);
        let transport = StreamableHttpClientTransport::from_config(
            StreamableHttpClientTransportConfig::with_uri(h.url("/mcp")).auth_header(h.key.clone()),
        );
        let client = ().serve(transport).await.expect("initialize over HTTP");
        let seen = exercise(&client, writes, Some(&id)).await;
        assert_clean("MCP responses", &seen);
        // Read tools take their routes' query types: every parameter the
        // route accepts, by the route's own names.
        let tools = client.list_all_tools().await.expect("tools/list");
        let props = |name: &str| -> Vec<String> {
            let t = tools.iter().find(|t| t.name == name).unwrap();
            let v = serde_json::to_value(&*t.input_schema).unwrap();
            let mut p: Vec<String> = v["properties"]
                .as_object()
                .unwrap()
                .keys()
                .cloned()
                .collect();
            p.sort();
            p
        };
        assert_eq!(
            props("get_change_blast_radius"),
            ["changeId", "metric", "minSample", "window"]
        );
        assert_eq!(
            props("search_similar_findings"),
            ["faultLocusEntityId", "fingerprint", "limit"]
        );
        assert_eq!(
            props("list_open_unknowns"),
            ["limit", "offset", "open", "owner"]
        );
        let e = call(
            &client,
            "get_change_blast_radius",
            json!({"changeId": "chg_x", "surprise": 1}),
        )
        .await
        .unwrap_err();
        assert!(format!("{e:?}").contains("surprise"), "{e:?}");
        let e = call(&client, "list_open_unknowns", json!({"open": false}))
            .await
            .unwrap_err();
        assert!(format!("{e:?}").contains("open"), "{e:?}");
        if writes {
            let r = call(
                &client,
                "open_incident",
                json!({"project": "p", "environment": "prod", "dedupKey": "k2", "title": "cpu"}),
            )
            .await
            .expect("open_incident");
            assert_ne!(r.is_error, Some(true), "{r:?}");
            let e = call(&client, "open_incident", json!({"project": "p"}))
                .await
                .unwrap_err();
            assert!(
                format!("{e:?}").contains("environment") || format!("{e:?}").contains("field"),
                "{e:?}"
            );
            // The body tools' input schemas are the HTTP bodies' own types:
            // the members of FindingRequest / ProposeRequest, required ones
            // required, and a member the route does not know is refused
            // before the route runs, named.
            let tools = client.list_all_tools().await.expect("tools/list");
            let schema = |name: &str| {
                let t = tools.iter().find(|t| t.name == name).unwrap();
                serde_json::to_value(&*t.input_schema).unwrap()
            };
            let finding = schema("record_investigation_finding");
            for member in [
                "environment",
                "faultLocusEntityId",
                "causalChain",
                "citedEvidenceIds",
                "idempotencyKey",
            ] {
                assert!(
                    finding["properties"].get(member).is_some(),
                    "{member}: {finding:#}"
                );
            }
            let required: Vec<&str> = finding["required"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(Value::as_str)
                .collect();
            assert!(
                required.contains(&"causalChain") && !required.contains(&"citedEvidenceIds"),
                "{finding:#}"
            );
            let propose = schema("propose_remediation_action");
            for member in [
                "incidentId",
                "findingId",
                "action",
                "target",
                "preMutationEnvelope",
            ] {
                assert!(
                    propose["properties"].get(member).is_some(),
                    "{member}: {propose:#}"
                );
            }
            let e = call(
                &client,
                "record_investigation_finding",
                json!({"environment": "prod", "faultLocusEntityId": "x", "causalChain": [], "idempotencyKey": "k", "surprise": 1}),
            )
            .await
            .unwrap_err();
            assert!(format!("{e:?}").contains("unknown argument"), "{e:?}");
        }
        client.cancel().await.ok();
        h.finish().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mcp_over_stdio_reads_and_writes() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("store.db");
    let db = db.to_str().unwrap().to_string();
    let store = Store::open(&db, &OpenOptions::default()).await.unwrap();
    let key = store
        .create_key("mcp-test", &ScopeSet::legacy())
        .await
        .unwrap()
        .plaintext;
    store.close().await;
    for writes in [false, true] {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_pstack-store"));
        cmd.args(["--db", &db, "mcp"])
            .env("PSTACK_STORE_API_KEY", &key)
            .env(
                "OBS_MCP_ENABLE_WRITES",
                if writes { "true" } else { "false" },
            )
            .stderr(std::process::Stdio::null());
        let transport = TokioChildProcess::new(cmd).expect("spawn pstack-store mcp");
        let client = ().serve(transport).await.expect("initialize over stdio");
        let seen = exercise(&client, writes, None).await;
        assert_clean("MCP responses", &seen);
        client.cancel().await.ok();
    }
    // A wrong key: every tool call is the route's 401, as a tool error.
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_pstack-store"));
    cmd.args(["--db", &db, "mcp"])
        .env("PSTACK_STORE_API_KEY", "psk_wrong")
        .stderr(std::process::Stdio::null());
    let client = ().serve(TokioChildProcess::new(cmd).unwrap()).await.unwrap();
    let r = call(&client, "list_incidents", json!({})).await.unwrap();
    assert_eq!(r.is_error, Some(true));
    client.cancel().await.ok();
}
