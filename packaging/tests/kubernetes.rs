//! `packaging/kubernetes/`: every manifest passes strict validation against
//! the Kubernetes OpenAPI schemas (the `kubernetes-validate` package, which
//! ships them; installed by scripts/setup.d/60-packaging.sh), the
//! kustomization lists exactly the manifests, no container is privileged
//! without a recorded reason, host namespaces carry their reason in a
//! comment, and the agent's capabilities are the systemd unit's bounding set.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

const VENV: &str = "/opt/pstack-kubernetes-validate/bin";
/// The oldest Kubernetes release the manifests promise to fit.
const KUBERNETES_VERSION: &str = "1.30.0";
/// Annotation a pod template must carry to run a privileged container.
const PRIVILEGED_REASON: &str = "pstack/privileged-reason";

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("kubernetes")
}

fn tool(name: &str) -> PathBuf {
    let p = Path::new(VENV).join(name);
    assert!(
        p.is_file(),
        "{} missing: run scripts/setup.d/60-packaging.sh (creates the venv with kubernetes-validate)",
        p.display()
    );
    p
}

fn manifests() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .filter(|p| p.file_name().unwrap() != "kustomization.yaml")
        .collect();
    v.sort();
    v
}

/// Every YAML document of `files`, as JSON (PyYAML's safe loader).
fn documents(files: &[PathBuf]) -> Vec<(String, Value)> {
    let out = Command::new(tool("python"))
        .args([
            "-c",
            "import sys, json, yaml\n\
             print(json.dumps([[f, d] for f in sys.argv[1:] for d in yaml.safe_load_all(open(f)) if d is not None]))",
        ])
        .args(files)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "YAML parse: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let docs: Vec<(String, Value)> = serde_json::from_slice(&out.stdout).unwrap();
    docs
}

#[test]
fn manifests_pass_strict_schema_validation() {
    let files = manifests();
    assert!(files.len() >= 5, "{files:?}");
    let out = Command::new(tool("kubernetes-validate"))
        .args(["--strict", "-k", KUBERNETES_VERSION])
        .args(&files)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "kubernetes-validate:\n{text}");
    // One "passed" line per resource, and nothing it could not check.
    let passed = text.lines().filter(|l| l.contains(" passed ")).count();
    assert_eq!(passed, documents(&files).len(), "{text}");
    assert!(!text.contains("WARN") && !text.contains("ERROR"), "{text}");
}

#[test]
fn validation_rejects_a_broken_manifest() {
    // The oracle can fail: a misspelt field under --strict is refused.
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    let ds = std::fs::read_to_string(self::dir().join("agent-daemonset.yaml")).unwrap();
    std::fs::write(&bad, ds.replace("hostPID: true", "hostPid: true")).unwrap();
    let out = Command::new(tool("kubernetes-validate"))
        .args(["--strict", "-k", KUBERNETES_VERSION])
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!out.status.success(), "a misspelt field passed validation");
}

#[test]
fn kustomization_lists_exactly_the_manifests() {
    let k = documents(&[dir().join("kustomization.yaml")]);
    let listed: BTreeSet<String> = k[0].1["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    let present: BTreeSet<String> = manifests()
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(listed, present);
}

/// The pod specs of workload documents, with their pod-template annotations.
fn pod_specs(docs: &[(String, Value)]) -> Vec<(String, Value, Value)> {
    docs.iter()
        .filter_map(|(file, d)| {
            let t = d.get("spec")?.get("template")?;
            Some((
                format!("{file}: {}/{}", d["kind"], d["metadata"]["name"]),
                t["spec"].clone(),
                t["metadata"]["annotations"].clone(),
            ))
        })
        .collect()
}

#[test]
fn no_container_is_privileged_without_a_recorded_reason() {
    let docs = documents(&manifests());
    let specs = pod_specs(&docs);
    assert!(specs.len() >= 2, "DaemonSet and Deployment: {specs:?}");
    for (what, spec, annotations) in specs {
        for list in ["containers", "initContainers"] {
            for c in spec[list].as_array().into_iter().flatten() {
                let privileged = c["securityContext"]["privileged"] == Value::Bool(true);
                let reason = annotations[PRIVILEGED_REASON].as_str().unwrap_or("");
                assert!(
                    !privileged || reason.len() > 20,
                    "{what}: container {} is privileged without a {PRIVILEGED_REASON} annotation",
                    c["name"]
                );
                assert_eq!(
                    c["securityContext"]["allowPrivilegeEscalation"],
                    Value::Bool(false),
                    "{what}: {}",
                    c["name"]
                );
                assert_eq!(
                    c["securityContext"]["capabilities"]["drop"],
                    serde_json::json!(["ALL"]),
                    "{what}: {}",
                    c["name"]
                );
            }
        }
    }
}

#[test]
fn host_namespaces_carry_their_reason_in_a_comment() {
    for file in manifests() {
        let text = std::fs::read_to_string(&file).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            let t = l.trim();
            if ["hostPID: true", "hostNetwork: true", "hostIPC: true"].contains(&t) {
                let above = i.checked_sub(1).map(|j| lines[j].trim()).unwrap_or("");
                assert!(
                    above.starts_with('#') && above.len() > 20,
                    "{}:{}: `{t}` without a reason in the comment above it",
                    file.display(),
                    i + 1
                );
            }
        }
    }
}

#[test]
fn agent_capabilities_are_the_units_bounding_set() {
    let unit = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../systemd/pstackd.service"),
    )
    .unwrap();
    let bounding: BTreeSet<String> = unit
        .lines()
        .find_map(|l| l.strip_prefix("CapabilityBoundingSet="))
        .unwrap()
        .split_whitespace()
        .map(|c| c.trim_start_matches("CAP_").to_string())
        .collect();
    let docs = documents(&[dir().join("agent-daemonset.yaml")]);
    let specs = pod_specs(&docs);
    let added: BTreeSet<String> =
        specs[0].1["containers"][0]["securityContext"]["capabilities"]["add"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect();
    assert_eq!(added, bounding);
}
