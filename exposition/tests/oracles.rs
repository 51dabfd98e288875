//! The writer against Prometheus's own code (Debian `prometheus`, installed by
//! `scripts/setup.d/60-oracles.sh`): `promtool check metrics` must accept every
//! hostile label value and HELP text, and a real Prometheus server scraping the
//! text over loopback must read back every label value exactly as given.

use pstack_exposition::{CONTENT_TYPE, Exposition, Family, HistogramSample};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const HOSTILE: Family = Family::counter(
    "t_hostile_total",
    "Label values a caller could send: \"quotes\", C:\\back\\slashes\nand a second line.",
);
const LATENCY: Family = Family::histogram("t_hostile_seconds", "Latency, by \"route\".");

/// Values that would break a hand-written line, every printable-or-not ASCII
/// character alone, and non-ASCII text. None is empty (Prometheus drops a label
/// whose value is empty).
fn hostile_values() -> Vec<String> {
    let mut v: Vec<String> = [
        "a\"b",
        "back\\slash",
        "two\nlines",
        "\\\"",
        "\\n",
        "\"",
        "\\",
        "} 1\nforged_total 9",
        "\",forged=\"x",
        "Grüße, 東京 🚀",
        "\u{feff}bom",
        "trailing\\",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for b in 1u8..=127 {
        v.push(format!("c{}", b as char));
    }
    v
}

fn exposition(values: &[String]) -> String {
    let mut e = Exposition::new();
    for (i, value) in values.iter().enumerate() {
        let i = i.to_string();
        e.sample(HOSTILE, &[("route", value), ("i", &i)], 1u64);
        e.histogram(
            LATENCY,
            &[("route", value), ("i", &i)],
            HistogramSample {
                bounds: &[0.1, 1.0],
                cumulative: &[1, 2],
                count: 3,
                sum: 2.5,
            },
        );
    }
    e.render()
}

fn have_promtool() -> bool {
    pstack_testkit::precondition(
        pstack_testkit::have_tool("promtool"),
        "promtool is not installed (scripts/setup.d/60-oracles.sh installs Debian's prometheus)",
    )
}

/// Escaping is what promtool's parser expects: every hostile value passes.
#[test]
fn promtool_accepts_hostile_label_values_and_help() {
    if !have_promtool() {
        return;
    }
    let text = exposition(&hostile_values());
    if let Err(said) = pstack_testkit::promtool_check_metrics(&text) {
        panic!("promtool check metrics:\n{said}\n---\n{text}");
    }
}

/// The oracle can tell: the same values written unescaped (as the hand-written
/// lines did) are refused, one by one.
#[test]
fn promtool_refuses_the_same_values_unescaped() {
    if !have_promtool() {
        return;
    }
    for value in ["a\"b", "back\\slash", "two\nlines", "} 1\nforged_total 9"] {
        let text = format!(
            "# HELP t_hostile_total Hostile.\n# TYPE t_hostile_total counter\nt_hostile_total{{route=\"{value}\"}} 1\n"
        );
        assert!(
            pstack_testkit::promtool_check_metrics(&text).is_err(),
            "promtool accepted unescaped {value:?}"
        );
    }
}

/// Kills and reaps the Prometheus server this test started.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_loopback_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind a loopback port")
}

/// `GET path` on loopback with HTTP/1.0 (the body runs to the close): the body.
fn http_get(port: u16, path: &str) -> std::io::Result<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut raw = String::new();
    s.read_to_string(&mut raw)?;
    Ok(raw
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default())
}

/// A real Prometheus scrapes the exposition from a loopback endpoint and its
/// series API returns each `route` value exactly as the caller gave it: the
/// escaping is not only well-formed but means what it should.
#[test]
fn prometheus_reads_back_every_hostile_label_value() {
    if !pstack_testkit::precondition(
        pstack_testkit::have_tool("prometheus"),
        "prometheus is not installed (scripts/setup.d/60-oracles.sh installs Debian's prometheus)",
    ) {
        return;
    }
    let values = hostile_values();
    let text = exposition(&values);

    // The scrape target: every request answered with the exposition.
    let target = TcpListener::bind("127.0.0.1:0").expect("bind the target");
    let target_port = target.local_addr().expect("target address").port();
    std::thread::spawn(move || {
        for conn in target.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf);
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Type: {CONTENT_TYPE}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
                text.len()
            );
        }
    });

    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: hostile\n    static_configs:\n      - targets: ['127.0.0.1:{target_port}']\n"
        ),
    )
    .expect("write the config");
    let web_port = free_loopback_port();
    let log = dir.path().join("prometheus.log");
    let mut server = Server(
        Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{web_port}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("create the server log"))
            .spawn()
            .expect("start prometheus"),
    );

    // Wait until a scrape has landed every series (or say what it saw).
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut got, mut last) = (Vec::<String>::new(), String::new());
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
        if let Ok(Some(exit)) = server.0.try_wait() {
            panic!(
                "prometheus exited ({exit}):\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        let Ok(body) = http_get(web_port, "/api/v1/series?match%5B%5D=t_hostile_total") else {
            continue;
        };
        let Ok(doc) = serde_json::from_str::<serde_json::Value>(&body) else {
            last = body;
            continue;
        };
        got = doc["data"]
            .as_array()
            .map(|series| {
                series
                    .iter()
                    .filter_map(|s| s["route"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        if got.len() >= values.len() {
            break;
        }
        last = body;
    }
    let mut want = values.clone();
    want.sort();
    got.sort();
    let targets = http_get(web_port, "/api/v1/targets").unwrap_or_default();
    assert_eq!(
        got, want,
        "the route values Prometheus read back (last answer: {last}; targets: {targets})"
    );
}
