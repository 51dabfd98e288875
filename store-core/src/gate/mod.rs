//! The remediation gate (seed 000, scenario 5): before an automated
//! rollback, flag flip or config revert touches production, the store decides
//! whether the evidence allows it and hands out exactly one short-lived right
//! to do it.
//!
//! Pure rule modules — [`admission`] (a proposal → a plan or a typed
//! refusal), [`grant`] (approving, claiming, completing or failing a
//! grant → a plan or a typed refusal), [`policy`] (matrix, lowering,
//! statuses, windows), [`provenance`] (no tier resting on the acting key's own evidence),
//! [`keys`] (grant tokens, sealed callbacks), [`watchdog`] (checkpoint
//! verdicts), [`alertmanager`] (webhook payload v4) — plus [`shared_key`],
//! the start-up check that every replica holds the one gate key. Storage is
//! `crate::db::gate`; routes are `pstack_store::http::gate`; the one place
//! that sends a grant over the network is `pstack_store::webhook` (with its
//! SSRF guard `pstack_store::ssrf`), an HTTP client and so not in this
//! crate. The design choices where the seed is
//! silent are in `store/docs/gate.md`.

pub mod admission;
pub mod alertmanager;
pub mod grant;
pub mod keys;
pub mod policy;
pub mod provenance;
pub mod shared_key;
pub mod watchdog;

use std::sync::Arc;

/// The gate's configuration (from `pstack-store serve` flags / environment).
#[derive(Debug, Clone)]
pub struct GateConfig {
    /// Grant-hash and callback-sealing keys.
    pub keys: Arc<keys::GateKeys>,
    /// `ALERT_WEBHOOK_ALLOW_PRIVATE=true`: webhooks may reach private,
    /// loopback and other internal addresses.
    pub allow_private_webhooks: bool,
}

impl GateConfig {
    /// Defaults with these keys.
    pub fn with_keys(keys: keys::GateKeys) -> GateConfig {
        GateConfig {
            keys: Arc::new(keys),
            allow_private_webhooks: false,
        }
    }
}
