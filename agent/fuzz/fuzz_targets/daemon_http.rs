//! pstackd's HTTP request handling on hostile bytes: the real router (authorization,
//! routes, `POST /v1/captures` body parsing and validation, `/v1/status`, `/metrics`,
//! envelope lookups) behind hyper's HTTP/1 server, as `run.rs` serves it, fed the raw
//! bytes of one connection from an authorized (root) peer. Captures cannot run here
//! (no helper: they answer 503), so no process is touched. Properties: no panic, every
//! response is well-formed HTTP/1.1 and none is a 500. Bounded run: `scripts/fuzz 60`.
#![no_main]

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use libfuzzer_sys::fuzz_target;
use pstackd::api::router;
use pstackd::config::{Config, EbpfDaemonConfig, OverflowPolicy};
use pstackd::ebpf::DaemonEbpf;
use pstackd::peer::{AccessPolicy, PeerCred};
use pstackd::shipper::Shipper;
use pstackd::spool::{Spool, SpoolLimits};
use pstackd::state::{CaptureEngine, DaemonState};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tower::ServiceExt;

struct World {
    rt: tokio::runtime::Runtime,
    app: axum::Router,
}

fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let app = rt.block_on(async {
            let dir = std::env::temp_dir().join(format!("pstack-fuzz-spool-{}", std::process::id()));
            let spool = Arc::new(
                Spool::open(
                    &dir,
                    SpoolLimits {
                        max_bytes: 1 << 20,
                        max_files: 16,
                        overflow: OverflowPolicy::RefuseNew,
                    },
                )
                .expect("spool"),
            );
            let config = Config::default();
            let (tx, rx) = tokio::sync::watch::channel(config.shipper.clone());
            let shipper = Shipper::new(spool.clone(), rx);
            let ebpf = DaemonEbpf::start(&EbpfDaemonConfig {
                enabled: false,
                ..EbpfDaemonConfig::default()
            });
            let engine = CaptureEngine {
                supervisor: Err("no helper in the fuzz harness".into()),
                budget: None,
                ebpf,
            };
            let policy = AccessPolicy::resolve("pstack-fuzz-no-such-group", false).expect("policy");
            let state = Arc::new(DaemonState::new(
                config,
                policy,
                spool,
                shipper.stats.clone(),
                shipper.wake.clone(),
                tx,
                engine,
            ));
            router(state)
        });
        World { rt, app }
    })
}

fuzz_target!(|data: &[u8]| {
    let w = world();
    let out = w.rt.block_on(async {
        let (mut client, server) = tokio::io::duplex(1 << 16);
        let svc = w.app.clone().map_request(|mut req: axum::http::Request<hyper::body::Incoming>| {
            req.extensions_mut().insert(PeerCred {
                uid: 0,
                gid: 0,
                pid: None,
                supplementary_member: false,
            });
            req
        });
        let conn = hyper::server::conn::http1::Builder::new()
            .max_buf_size(16 << 10)
            .serve_connection(TokioIo::new(server), TowerToHyperService::new(svc));
        let task = tokio::spawn(conn);
        let _ = client.write_all(data).await;
        let _ = client.shutdown().await;
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(2), client.read_to_end(&mut out)).await;
        task.abort();
        out
    });
    let text = String::from_utf8_lossy(&out);
    // hyper answers in the request's version (HTTP/1.0 or HTTP/1.1).
    for (i, _) in text.match_indices("HTTP/1.") {
        let code = text.get(i + 9..i + 12).unwrap_or("");
        assert_ne!(code, "500", "a 500 for input {:?}:\n{text}", String::from_utf8_lossy(data));
    }
    assert!(out.is_empty() || text.starts_with("HTTP/1."), "not an HTTP/1.x response: {text}");
});
