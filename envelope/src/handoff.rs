//! The compact agent handoff: everything a newcomer needs to act on an
//! envelope without reading it — subject, completeness, the first missing edge
//! (or the unknown blocking the next transition) with its probe, the open
//! unknowns, the live hypotheses with their falsifiers, the next transition and
//! the digest that names the evidence. Small enough to paste into a chat.

use serde::Serialize;

use crate::model::{ClaimKind, Completeness, Envelope, NextTransition, SurfaceStatus};

/// A compact, actionable summary of one envelope.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Handoff {
    /// Always `pstack.handoff/v1`.
    pub schema: &'static str,
    /// Subject kind.
    pub kind: &'static str,
    /// Subject, described in one line.
    pub subject: String,
    /// Completeness of the evidence.
    pub completeness: Completeness,
    /// First thing missing, if anything is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frontier: Option<Frontier>,
    /// Open unknowns: question, what it blocks, owner, probe.
    pub open_unknowns: Vec<OpenUnknown>,
    /// Live hypotheses with the observation that would kill each.
    pub hypotheses: Vec<LiveHypothesis>,
    /// The one legal next action.
    pub next_transition: NextTransition,
    /// Digest of the envelope this summarizes.
    pub digest: String,
}

/// The first missing edge of an envelope.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Frontier {
    /// `surface` (a surface that did not succeed) or `unknown` (a question).
    pub edge: &'static str,
    /// Surface id or unknown question.
    pub what: String,
    /// Surface status, when the edge is a surface.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<SurfaceStatus>,
    /// The probe that would close it, when one is known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probe: Option<String>,
}

/// An open unknown in a handoff.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OpenUnknown {
    /// The question.
    pub question: String,
    /// The transition it blocks.
    pub blocks: String,
    /// Who answers it.
    pub owner: String,
    /// How.
    pub probe: String,
}

/// A hypothesis still standing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LiveHypothesis {
    /// Claim code.
    pub code: String,
    /// The claim in words.
    pub statement: String,
    /// What would kill it.
    pub falsifier: String,
}

/// Build the handoff of an envelope.
pub fn handoff(env: &Envelope) -> Handoff {
    let failed = env.surfaces.iter().find(|s| s.status != SurfaceStatus::Ok);
    let frontier = if let Some(s) = failed {
        let probe = env
            .unknowns
            .iter()
            .find(|u| u.surface.as_deref() == Some(s.id.as_str()))
            .map(|u| u.probe.clone());
        Some(Frontier {
            edge: "surface",
            what: s.id.clone(),
            status: Some(s.status),
            probe,
        })
    } else {
        env.unknowns
            .iter()
            .find(|u| u.blocks == env.next_transition.action)
            .or_else(|| env.unknowns.first())
            .map(|u| Frontier {
                edge: "unknown",
                what: u.question.clone(),
                status: None,
                probe: Some(u.probe.clone()),
            })
    };
    Handoff {
        schema: "pstack.handoff/v1",
        kind: env.subject.kind(),
        subject: env.subject.describe(),
        completeness: env.completeness,
        frontier,
        open_unknowns: env
            .unknowns
            .iter()
            .map(|u| OpenUnknown {
                question: u.question.clone(),
                blocks: u.blocks.clone(),
                owner: u.owner.clone(),
                probe: u.probe.clone(),
            })
            .collect(),
        hypotheses: env
            .claims
            .iter()
            .filter(|c| c.kind == ClaimKind::Hypothesis)
            .map(|c| LiveHypothesis {
                code: c.code.clone(),
                statement: c.statement.clone(),
                falsifier: c.falsifier.clone().unwrap_or_default(),
            })
            .collect(),
        next_transition: env.next_transition.clone(),
        digest: env.digest.clone(),
    }
}

impl Handoff {
    /// Plain text for a chat message or terminal.
    pub fn render(&self) -> String {
        let mut out = format!(
            "subject: {}\ncompleteness: {}\n",
            self.subject,
            self.completeness.as_str()
        );
        match &self.frontier {
            Some(f) => {
                out.push_str(&format!("frontier: {} {}", f.edge, f.what));
                if let Some(s) = f.status {
                    out.push_str(&format!(" ({s})"));
                }
                out.push('\n');
                if let Some(p) = &f.probe {
                    out.push_str(&format!("  probe: {p}\n"));
                }
            }
            None => out.push_str("frontier: none (every surface ok, no open unknown)\n"),
        }
        for u in &self.open_unknowns {
            out.push_str(&format!(
                "unknown: {} [blocks {}; owner {}]\n  probe: {}\n",
                u.question, u.blocks, u.owner, u.probe
            ));
        }
        for h in &self.hypotheses {
            out.push_str(&format!(
                "hypothesis {}: {}\n  falsifier: {}\n",
                h.code, h.statement, h.falsifier
            ));
        }
        out.push_str(&format!(
            "next: {} (receipt: {})\n",
            self.next_transition.action, self.next_transition.success_receipt
        ));
        for a in &self.next_transition.abort_conditions {
            out.push_str(&format!("  abort if: {a}\n"));
        }
        out.push_str(&format!("digest: {}\n", self.digest));
        out
    }
}
