//! Shipping over TLS (rustls) to a collector whose certificate is signed by
//! a private CA named in `shipper.ca_file`; without that CA the handshake is
//! refused, classified, and nothing is deleted.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::collector::Collector;
use super::common::*;

fn openssl(dir: &Path, args: &[&str]) -> bool {
    Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// A CA and a server certificate for localhost / 127.0.0.1 (EC P-256).
fn make_certs(dir: &Path) -> bool {
    std::fs::write(
        dir.join("san.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n",
    )
    .unwrap();
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    openssl(
        dir,
        &[
            &["req", "-x509"][..],
            &ec,
            &[
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
                "-days",
                "2",
                "-subj",
                "/CN=pstack test CA",
            ],
        ]
        .concat(),
    ) && openssl(
        dir,
        &[
            &["req"][..],
            &ec,
            &[
                "-keyout",
                "srv.key",
                "-out",
                "srv.csr",
                "-subj",
                "/CN=localhost",
            ],
        ]
        .concat(),
    ) && openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "srv.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "srv.pem",
            "-days",
            "2",
            "-extfile",
            "san.ext",
        ],
    )
}

#[test]
fn shipping_over_rustls_to_a_collector_signed_by_the_configured_ca_and_refused_without_it() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    std::fs::create_dir_all(&certs).unwrap();
    pstack_testkit::require!(
        pstack_testkit::have_tool("openssl"),
        "openssl is not installed (scripts/setup.d/50-daemon.sh installs it) to mint test certificates"
    );
    assert!(
        make_certs(&certs),
        "openssl could not mint the test certificates"
    );
    let collector = Collector::start_tls(&certs.join("srv.pem"), &certs.join("srv.key"));
    let url = format!("https://localhost:{}", collector.addr.port());
    let spool = dir.path().join("spool");
    let items: Vec<_> = (0..3).map(|n| sealed_example(7_000 + n)).collect();
    for (d, b) in &items {
        write_spool_file(&spool, d, b);
    }
    // Without the CA: the handshake fails (unknown issuer); nothing deleted.
    let mut settings = Settings {
        collector_url: Some(url),
        backoff_initial_ms: 50,
        backoff_max_ms: 100,
        ..Settings::default()
    };
    let mut d = Daemon::start(dir.path(), &settings);
    let s = d.wait_status(Duration::from_secs(10), "a refused handshake", |s| {
        let f = &s["shipping"]["failures_total"];
        f["connect"].as_u64().unwrap_or(0) + f["transport"].as_u64().unwrap_or(0) >= 1
    });
    assert_eq!(s["spool"]["files"], 3, "nothing deleted without an ack");
    assert_eq!(collector.stored(), 0);
    let err = s["shipping"]["last_error"].as_str().unwrap_or("");
    assert!(
        err.to_lowercase().contains("certificate") || err.contains("UnknownIssuer"),
        "{err}"
    );
    let (st, _) = d.terminate(Duration::from_secs(10));
    assert_eq!(st.code(), Some(0));
    // With the CA configured: delivered over TLS.
    settings.extra_shipper = format!("ca_file = \"{}\"", certs.join("ca.pem").display());
    let d = Daemon::start(dir.path(), &settings);
    d.wait_status(Duration::from_secs(15), "spool drained over TLS", |s| {
        s["spool"]["files"] == 0
    });
    for (dg, _) in &items {
        assert!(collector.has(dg), "{dg} not delivered over TLS");
    }
    assert_eq!(collector.torn(), 0);
}
