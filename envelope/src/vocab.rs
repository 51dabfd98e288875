//! The evidence vocabulary shared by the engines that write envelopes and
//! the store that reads them: claim codes and surface ids per subject kind
//! (the facts the store reads are typed in [`crate::facts`]).
//!
//! Invariants:
//! - **One spelling.** A claim code, surface id or fact key the store reads
//!   is written here once; engines emit these items and the store matches on
//!   them, so renaming one is a change to this file that both sides follow
//!   (and renaming a [`ClaimCode`] variant breaks the build on both sides).
//! - **Open on the wire.** [`Claim::code`](crate::Claim) stays a string: an
//!   envelope with a code this build does not know still parses, seals and
//!   verifies; [`ClaimCode::parse`] says `None` for it and readers skip it.
//! - **Same bytes.** Every string here is the one engines wrote before this
//!   module existed; [`ClaimCode::as_str`] equals its serde name (tested).

use serde::{Deserialize, Serialize};

macro_rules! claim_codes {
    ($( $(#[$doc:meta])* $variant:ident = $wire:literal, )+) => {
        /// Every claim code a pstack engine writes.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum ClaimCode {
            $( $(#[$doc])* $variant, )+
        }

        impl ClaimCode {
            /// Every code, in declaration order.
            pub const ALL: &'static [ClaimCode] = &[$(ClaimCode::$variant),+];

            /// The code as envelopes carry it.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $( ClaimCode::$variant => $wire, )+
                }
            }

            /// The code of a claim as carried; `None` for a code this build
            /// does not know.
            pub fn parse(s: &str) -> Option<ClaimCode> {
                match s {
                    $( $wire => Some(ClaimCode::$variant), )+
                    _ => None,
                }
            }
        }
    };
}

claim_codes! {
    // Process and thread captures (capture/src/process).
    /// Fact: threads in state R.
    ThreadsInStateRunning = "threads_in_state_running",
    /// Fact: threads in state S.
    ThreadsInStateSleeping = "threads_in_state_sleeping",
    /// Fact: threads in state D.
    ThreadsInStateUninterruptible = "threads_in_state_uninterruptible",
    /// Fact: threads in state Z.
    ThreadsInStateZombie = "threads_in_state_zombie",
    /// Fact: threads in state T.
    ThreadsInStateStopped = "threads_in_state_stopped",
    /// Fact: threads in state t.
    ThreadsInStateTracingStop = "threads_in_state_tracing_stop",
    /// Fact: threads in state X.
    ThreadsInStateDead = "threads_in_state_dead",
    /// Fact: threads in state I.
    ThreadsInStateIdle = "threads_in_state_idle",
    /// Fact: threads in state P.
    ThreadsInStateParked = "threads_in_state_parked",
    /// Fact: one thread is in D, with its wait.
    ThreadInDState = "thread_in_d_state",
    /// Hypothesis: the FUSE server of a mount is not answering.
    FuseServerNotAnswering = "fuse_server_not_answering",
    /// Hypothesis: a D thread waits in the freezer: its cgroup is frozen.
    CgroupFrozen = "cgroup_frozen",
    /// Inference: a D thread's cgroup is frozen (the freezer says so).
    DStateFromCgroupFreezer = "d_state_from_cgroup_freezer",
    /// Fact (universal): no thread is in D.
    NoThreadInDState = "no_thread_in_d_state",
    /// Fact: off-CPU time by state in the window.
    OffcpuTimeInWindow = "offcpu_time_in_window",
    /// Fact: one D episode in the window.
    DStateEpisode = "d_state_episode",
    /// Fact (universal): no D episode in the window.
    NoDStateEpisodeInWindow = "no_d_state_episode_in_window",
    /// Fact: a host's threads counted by state.
    ThreadStateCounts = "thread_state_counts",

    // Host TCP traces (capture/src/tcp_trace.rs).
    /// Fact: a flow retransmitted in the traced window.
    TcpRetransmitsObserved = "tcp_retransmits_observed",
    /// Fact: which end sent a RST.
    TcpResetSender = "tcp_reset_sender",

    // Transport (`network_stream`) captures and pstackd's flight recorder.
    /// Fact: the flow retransmitted in the window.
    FlowRetransmits = "flow_retransmits",
    /// Fact: the retransmission timer fired on the flow.
    FlowRtoTimeouts = "flow_rto_timeouts",
    /// Fact: the peer advertised a zero receive window.
    PeerZeroWindow = "peer_zero_window",
    /// Fact: sending stalled on this side.
    SendStalledLocally = "send_stalled_locally",
    /// Fact: this side advertised a zero receive window.
    LocalZeroWindow = "local_zero_window",
    /// Fact: the flow left ESTABLISHED in the window.
    FlowLeftEstablished = "flow_left_established",
    /// Fact: a RST came from the peer.
    RstReceivedFromPeer = "rst_received_from_peer",
    /// Fact: this side sent a RST.
    RstSentByLocal = "rst_sent_by_local",
    /// Inference: the peer reset the flow (no RST was seen).
    ResetByPeerInferred = "reset_by_peer_inferred",
    /// Fact: the netns's TCP fault counters moved.
    NetnsTcpFaultCountersMoved = "netns_tcp_fault_counters_moved",
    /// Fact: the two ends disagree about the MTU.
    MtuMismatch = "mtu_mismatch",
    /// Hypothesis: full-size segments are lost on the path.
    PmtuBlackHole = "pmtu_black_hole",
    /// Fact: the flow made no progress in the window.
    FlowStalled = "flow_stalled",
    /// Fact: the egress link dropped packets.
    LinkDrops = "link_drops",
    /// Fact: conntrack is near its limit.
    ConntrackPressure = "conntrack_pressure",
    /// Hypothesis: the CPU starved the flow's processes.
    CpuStarvation = "cpu_starvation",
    /// Fact (universal): no fault on the flow in a complete window.
    NoFaultObserved = "no_fault_observed",
    /// Fact: no flow matched the request.
    NoMatchingFlow = "no_matching_flow",

    // Longhorn (`storage_transfer`) captures.
    /// Fact: streams shorter than the window.
    LonghornShortLivedStreams = "longhorn_short_lived_streams",
    /// Fact: no stream envelope was linked.
    NoStreamLinked = "no_stream_linked",
    /// Fact: stream envelopes were linked.
    StreamsLinked = "streams_linked",
    /// Fact: flows were excluded from the transfer.
    LonghornFlowsExcluded = "longhorn_flows_excluded",
    /// Fact: the Longhorn topology was resolved.
    LonghornTopologyResolved = "longhorn_topology_resolved",
    /// Fact: what the flows were selected on.
    LonghornFlowsSelectedOn = "longhorn_flows_selected_on",
    /// Fact: the request's flags disagree with the topology.
    LonghornFlagMismatch = "longhorn_flag_mismatch",
    /// Fact: an object's identity changed over the window.
    LonghornIdentityChanged = "longhorn_identity_changed",
    /// Fact: longhorn-manager reports a rebuild.
    LonghornManagerReportsRebuild = "longhorn_manager_reports_rebuild",
    /// Fact: an error text names a linked stream.
    LonghornErrorNamesStream = "longhorn_error_names_stream",
    /// Fact: an error text names a connection no stream links.
    LonghornErrorNamesUnlinkedConnection = "longhorn_error_names_unlinked_connection",
    /// Fact: a Longhorn setting bounds the failures.
    LonghornSettingsBoundFailures = "longhorn_settings_bound_failures",
    /// Fact: an engine Event in the window.
    LonghornEngineEvent = "longhorn_engine_event",
    /// Fact: an error text names a short-lived flow.
    LonghornErrorNamesShortLivedFlow = "longhorn_error_names_short_lived_flow",
    /// Fact: the rebuild failed.
    LonghornRebuildFailed = "longhorn_rebuild_failed",
    /// Fact: the rebuild completed.
    LonghornRebuildComplete = "longhorn_rebuild_complete",
    /// Fact: the replica or volume was removed on purpose.
    LonghornRebuildRemoved = "longhorn_rebuild_removed",
    /// Fact: the rebuild's outcome is not known.
    LonghornRebuildUnresolved = "longhorn_rebuild_unresolved",
    /// Fact: the rebuild was retried.
    LonghornRebuildRetries = "longhorn_rebuild_retries",
    /// Fact: the rebuild's source replicas.
    LonghornRebuildSources = "longhorn_rebuild_sources",
    /// Fact: the rebuild's status entry disappeared.
    LonghornRebuildEntryGone = "longhorn_rebuild_entry_gone",
    /// Fact: a FailedRebuilding Event.
    LonghornFailedRebuildingEvent = "longhorn_failed_rebuilding_event",
    /// Fact: Events were watched and none was FailedRebuilding.
    KubernetesEventsWithoutFailedRebuilding = "kubernetes_events_without_failed_rebuilding",
    /// Hypothesis: the control channel's user timeout is below the keepalive retry (#13703).
    ControlChannelUserTimeoutBelowKeepaliveRetry = "control_channel_user_timeout_below_keepalive_retry",
    /// Fact: the control channel keeps the OS keepalive.
    ControlChannelKeepaliveNotHazardous = "control_channel_keepalive_not_hazardous",
    /// Fact: this end is the control channel's client.
    ControlChannelClientSide = "control_channel_client_side",
    /// Fact: Hubble reports drops.
    HubbleReportsDrops = "hubble_reports_drops",
    /// Fact: Hubble reports no drops.
    HubbleReportsNoDrops = "hubble_reports_no_drops",
}

impl std::fmt::Display for ClaimCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<ClaimCode> for String {
    fn from(c: ClaimCode) -> String {
        c.as_str().to_string()
    }
}

impl PartialEq<ClaimCode> for String {
    fn eq(&self, other: &ClaimCode) -> bool {
        self == other.as_str()
    }
}

impl PartialEq<ClaimCode> for str {
    fn eq(&self, other: &ClaimCode) -> bool {
        self == other.as_str()
    }
}

impl PartialEq<ClaimCode> for &str {
    fn eq(&self, other: &ClaimCode) -> bool {
        *self == other.as_str()
    }
}

impl crate::Claim {
    /// The claim's code, when this build knows it.
    pub fn claim_code(&self) -> Option<ClaimCode> {
        ClaimCode::parse(&self.code)
    }
}

/// Surface ids, per subject kind of the envelope that carries them.
pub mod surface_id {
    /// Surfaces of a `network_stream` envelope (a transport capture, or
    /// pstackd's flight record of a flow).
    pub mod network_stream {
        /// The flow's socket at window start (sock_diag).
        pub const TCP_START: &str = "tcp/start";
        /// The flow's socket at window end.
        pub const TCP_END: &str = "tcp/end";
        /// TCP_USER_TIMEOUT and keepalive of the socket, read from its owner.
        pub const TCP_SOCKOPT: &str = "tcp/sockopt";
        /// The eBPF TCP events of the flow's cookie.
        pub const EBPF_TCP: &str = "ebpf/tcp";
        /// The netns's snmp/netstat counter deltas.
        pub const NETSTAT: &str = "netstat";
        /// The veth peer of the egress link.
        pub const LINK_PEER: &str = "link/peer";
        /// The egress link.
        pub const LINK: &str = "link";
        /// The route to the peer.
        pub const ROUTE: &str = "route";
        /// Conntrack occupancy and stat deltas.
        pub const CONNTRACK: &str = "conntrack";
        /// CPU load and pressure: bears hypotheses only.
        pub const HOST_CPU: &str = "host/cpu";
        /// pstackd's flight record of a flow a watch rule fired on.
        pub const FLIGHT_RECORDER: &str = "ebpf/flight_recorder";
    }

    /// Surfaces of a `storage_transfer` envelope (a Longhorn capture).
    pub mod storage_transfer {
        /// The transfer's links to its stream envelopes.
        pub const STREAMS: &str = "streams";
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn every_code_serializes_as_its_wire_string_and_parses_back() {
        for &c in ClaimCode::ALL {
            assert_eq!(
                serde_json::to_value(c).unwrap(),
                Value::String(c.as_str().into())
            );
            assert_eq!(ClaimCode::parse(c.as_str()), Some(c));
            let back: ClaimCode = serde_json::from_str(&format!("\"{c}\"")).unwrap();
            assert_eq!(back, c);
        }
        assert_eq!(ClaimCode::parse("flow_rto_timeout"), None);
        assert_eq!(ClaimCode::parse(""), None);
    }
}
