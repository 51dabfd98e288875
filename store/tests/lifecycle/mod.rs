//! Graceful shutdown: a request in flight when shutdown begins completes and
//! is stored; new connections are refused afterwards.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::on_both_backends;
use crate::support::{Db, Harness, array, sealed};

on_both_backends!(shutdown_drains_the_request_in_flight);

async fn shutdown_drains_the_request_in_flight(db: Db) {
    let Some(mut h) = Harness::start(db).await else {
        return;
    };
    let addr = h.base.trim_start_matches("http://").to_string();
    let items: Vec<Vec<u8>> = (0..10).map(|i| sealed("node-a", 4242, i).1).collect();
    let body = array(&items);
    let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "POST /v1/envelopes HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        h.key,
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let half = body.len() / 2;
    s.write_all(&body[..half]).await.unwrap();
    // Let the server parse the head and start reading the body.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let server = h.begin_shutdown();
    tokio::time::sleep(Duration::from_millis(200)).await;
    s.write_all(&body[half..]).await.unwrap();
    let mut resp = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut resp))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&resp);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("server stops")
        .unwrap()
        .unwrap();
    assert_eq!(h.count().await, 10, "the drained request was stored");
    assert!(
        tokio::net::TcpStream::connect(&addr).await.is_err(),
        "no longer accepting"
    );
    h.finish().await;
}
