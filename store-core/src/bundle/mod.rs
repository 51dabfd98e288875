//! Evidence bundles for automated responders: sections of evidence fitted
//! to a token budget, saying what was cut.
//!
//! Invariants: the emitted bundle's estimated size is within the budget
//! or no bundle is emitted ([`fit`] returns `None`); every dropped item is
//! counted in `cut` under its section; sections are cut lowest priority
//! first, and within a section from the end (items are ranked before);
//! no `grantToken` field survives ([`strip_grant_tokens`]).
//!
//! Token count: a documented estimate, one token per 4 bytes of compact
//! JSON, rounded up (JSON is denser in tokens than prose, so this
//! over-counts for typical BPE tokenizers rather than under-counts).

use serde_json::{Map, Value, json};

/// Estimated tokens of a JSON value.
pub fn estimate_tokens(v: &Value) -> usize {
    v.to_string().len().div_ceil(4)
}

/// A section: name and ranked items (most important first).
#[derive(Debug, Clone)]
pub struct Section {
    /// JSON key.
    pub name: &'static str,
    /// The objects the section sits in, outermost first (empty: at the top
    /// level; `["bundle", "autosre"]`: at `bundle.autosre.<name>`).
    pub parent: &'static [&'static str],
    /// Ranked items.
    pub items: Vec<Value>,
}

/// Put `v` at `parent.<name>` in `out`, making (or reusing) the parents.
fn place(out: &mut Map<String, Value>, parent: &[&str], name: &str, v: Value) {
    let mut at = out;
    for p in parent {
        let slot = at
            .entry(p.to_string())
            .or_insert_with(|| Value::Object(Map::new()));
        if !slot.is_object() {
            *slot = Value::Object(Map::new());
        }
        let Value::Object(m) = slot else { return };
        at = m;
    }
    at.insert(name.into(), v);
}

/// Remove every `grantToken` field, anywhere.
pub fn strip_grant_tokens(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.remove("grantToken");
            m.values_mut().for_each(strip_grant_tokens);
        }
        Value::Array(a) => a.iter_mut().for_each(strip_grant_tokens),
        _ => {}
    }
}

/// Fit `header` + `sections` (priority order: first is kept longest) into
/// `budget` tokens. `None`: even with every section empty it does not fit.
pub fn fit(header: Map<String, Value>, mut sections: Vec<Section>, budget: usize) -> Option<Value> {
    let mut cut: Vec<(usize, usize)> = vec![(0, 0); sections.len()];
    for s in &mut sections {
        s.items.iter_mut().for_each(strip_grant_tokens);
    }
    // Pre-drop by per-item estimates (each item serialized once), so the
    // exact check below runs a few times, not once per dropped item.
    let sizes: Vec<Vec<usize>> = sections
        .iter()
        .map(|s| s.items.iter().map(|i| i.to_string().len() + 1).collect())
        .collect();
    let fixed = Value::Object(header.clone()).to_string().len() + 200 * (sections.len() + 1);
    let mut bytes: usize = fixed + sizes.iter().flatten().sum::<usize>();
    while bytes.div_ceil(4) > budget {
        let Some(i) = sections.iter().rposition(|s| !s.items.is_empty()) else {
            break;
        };
        let n = sections[i].items.len() - 1;
        sections[i].items.pop();
        cut[i].0 += 1;
        cut[i].1 += sizes[i][n].div_ceil(4);
        bytes -= sizes[i][n];
    }
    loop {
        let mut out = header.clone();
        for s in &sections {
            place(&mut out, s.parent, s.name, Value::Array(s.items.clone()));
        }
        let cuts: Vec<Value> = sections
            .iter()
            .zip(&cut)
            .filter(|(_, c)| c.0 > 0)
            .map(|(s, c)| json!({"section": s.name, "dropped": c.0, "droppedTokens": c.1}))
            .collect();
        out.insert("cut".into(), Value::Array(cuts));
        out.insert("budgetTokens".into(), json!(budget));
        let mut v = Value::Object(out);
        let size = estimate_tokens(&v) + 12; // the estimatedTokens field itself
        if size <= budget {
            v["estimatedTokens"] = json!(size);
            return Some(v);
        }
        // Drop the last item of the lowest-priority non-empty section.
        let i = sections.iter().rposition(|s| !s.items.is_empty())?;
        if let Some(item) = sections[i].items.pop() {
            cut[i].0 += 1;
            cut[i].1 += estimate_tokens(&item);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sections(n: usize) -> Vec<Section> {
        vec![
            Section {
                name: "candidateChanges",
                parent: &[],
                items: (0..n).map(|i| json!({"id": format!("chg_{i}"), "pad": "x".repeat(200)})).collect(),
            },
            Section {
                name: "priorFindings",
                parent: &["bundle", "autosre"],
                items: (0..n).map(|i| json!({"id": format!("fnd_{i}"), "grantToken": "gt_secret", "pad": "y".repeat(200)})).collect(),
            },
        ]
    }

    #[test]
    fn stays_within_budget_and_says_what_it_cut() {
        // A section nested in an object the header already has.
        let header: Map<String, Value> = json!({
            "intent": "triage_incident",
            "bundle": {"autosre": {"faultLocus": {"entityId": "checkout-api"}}},
        })
        .as_object()
        .unwrap()
        .clone();
        for budget in [200, 500, 2000, 100_000] {
            let Some(b) = fit(header.clone(), sections(20), budget) else {
                assert!(budget < 100, "{budget} should fit something");
                continue;
            };
            assert!(
                estimate_tokens(&b) <= budget,
                "{budget}: {}",
                estimate_tokens(&b)
            );
            let kept = b["candidateChanges"].as_array().unwrap().len()
                + b["bundle"]["autosre"]["priorFindings"]
                    .as_array()
                    .unwrap()
                    .len();
            let dropped: u64 = b["cut"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["dropped"].as_u64().unwrap())
                .sum();
            assert_eq!(
                kept as u64 + dropped,
                40,
                "{budget}: every item is kept or counted as cut"
            );
            assert!(!b.to_string().contains("gt_secret"));
            assert_eq!(
                b["bundle"]["autosre"]["faultLocus"]["entityId"],
                "checkout-api"
            );
            if budget < 100_000 {
                // Lower priority goes first.
                assert!(
                    b["bundle"]["autosre"]["priorFindings"]
                        .as_array()
                        .unwrap()
                        .len()
                        <= b["candidateChanges"].as_array().unwrap().len()
                );
            }
        }
        assert!(fit(header, sections(1), 5).is_none());
    }
}
