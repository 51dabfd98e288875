//! Shared by the pstack-store benchmarks: open a fresh store on either backend,
//! drop it again, and measure (process CPU time, latency percentiles). Invariant:
//! every PostgreSQL target lives in its own random schema, which `close`
//! drops, so runs never see each other's rows.

use std::time::Duration;

use pstack_store_core::db::{OpenOptions, Store};

/// One opened backend; the tempdir / schema go away with `close`.
pub struct Target {
    pub name: &'static str,
    pub store: Store,
    _dir: Option<tempfile::TempDir>,
    pg: Option<(String, String)>,
}

/// `backend` is `"sqlite"` (a fresh file in a tempdir) or anything else for
/// PostgreSQL at `PSTACK_BENCH_PG_URL` in a fresh schema.
pub async fn open(backend: &str) -> anyhow::Result<Target> {
    if backend == "sqlite" {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("bench.db");
        let store = Store::open(path.to_str().unwrap_or_default(), &OpenOptions::default()).await?;
        Ok(Target {
            name: "sqlite",
            store,
            _dir: Some(dir),
            pg: None,
        })
    } else {
        let url = pg_url();
        let schema = random_schema()?;
        let opts = OpenOptions {
            pg_schema: Some(schema.clone()),
            pg_max_connections: 16,
            ..OpenOptions::default()
        };
        let store = Store::open(&url, &opts).await?;
        Ok(Target {
            name: "postgres",
            store,
            _dir: None,
            pg: Some((url, schema)),
        })
    }
}

pub fn pg_url() -> String {
    std::env::var("PSTACK_BENCH_PG_URL")
        .unwrap_or_else(|_| "postgres://pstack:pstack@127.0.0.1:5432/pstack_bench".into())
}

pub fn random_schema() -> anyhow::Result<String> {
    let mut b = [0u8; 4];
    getrandom::fill(&mut b).map_err(|e| anyhow::anyhow!("random: {e}"))?;
    Ok(format!("bench_{}", hex::encode(b)))
}

/// Drops a bench schema (best effort: a bench that cannot drop its schema
/// still reports its numbers).
pub async fn drop_pg_schema(url: &str, schema: &str) {
    use sqlx::Connection;
    if let Ok(mut c) = sqlx::PgConnection::connect(url).await {
        let _ = sqlx::query(&format!("DROP SCHEMA {schema} CASCADE"))
            .execute(&mut c)
            .await;
    }
}

/// Closes the store and drops the PostgreSQL schema.
pub async fn close(t: Target) {
    t.store.close().await;
    if let Some((url, schema)) = t.pg {
        drop_pg_schema(&url, &schema).await;
    }
}

/// CPU time (user + system) this process has used, from /proc/self/stat.
pub fn cpu_time() -> Duration {
    cpu_time_of("self")
}

/// CPU time (user + system) of a process, from /proc/<pid>/stat.
pub fn cpu_time_of(pid: &str) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the parenthesized comm: state is field 3; utime 14, stime 15.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        f.get(i - 3)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // USER_HZ is 100 on Linux.
    Duration::from_millis((ticks(14) + ticks(15)) * 10)
}

/// The `p` quantile (0..=1) of sorted durations; zero for none.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}
