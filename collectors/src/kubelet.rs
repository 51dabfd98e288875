//! A pod's name, namespace and container name from the kubelet's pod list
//! (`GET /pods` on its read-only endpoint, a `v1.PodList`). Pure: the agent
//! fetches the bytes; this finds the pod by UID and the container by the ID
//! its cgroup path spelled. Nothing is inferred: a pod the list does not hold
//! is an error, a container ID no status names leaves `container_name` out.

use serde::{Deserialize, Serialize};

/// What the kubelet says about one pod and one of its containers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodFacts {
    /// `metadata.name`.
    pub pod_name: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.uid` (the key it was found by).
    pub pod_uid: String,
    /// `spec.nodeName`, when set.
    pub node_name: Option<String>,
    /// The container whose status carries the container ID (regular, init
    /// or ephemeral); `None` when none does (e.g. the pod sandbox itself).
    pub container_name: Option<String>,
}

/// Why the pod list did not give the pod.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PodLookupError {
    /// Not a `v1.PodList` (or not JSON).
    #[error("the kubelet's /pods answer is not a PodList: {0}")]
    NotPodList(String),
    /// No pod in the list has the UID.
    #[error("no pod with UID {0} in the kubelet's pod list (deleted, or another node's)")]
    NoSuchPod(String),
}

#[derive(Deserialize)]
struct PodList {
    kind: String,
    items: Vec<Pod>,
}

#[derive(Deserialize)]
struct Pod {
    metadata: Meta,
    #[serde(default)]
    spec: Spec,
    #[serde(default)]
    status: Status,
}

#[derive(Deserialize)]
struct Meta {
    name: String,
    #[serde(default)]
    namespace: String,
    uid: String,
}

#[derive(Deserialize, Default)]
struct Spec {
    #[serde(default, rename = "nodeName")]
    node_name: Option<String>,
}

#[derive(Deserialize, Default)]
struct Status {
    #[serde(default, rename = "containerStatuses")]
    containers: Vec<ContainerStatus>,
    #[serde(default, rename = "initContainerStatuses")]
    init: Vec<ContainerStatus>,
    #[serde(default, rename = "ephemeralContainerStatuses")]
    ephemeral: Vec<ContainerStatus>,
}

#[derive(Deserialize)]
struct ContainerStatus {
    name: String,
    #[serde(default, rename = "containerID")]
    container_id: Option<String>,
}

/// Find pod `pod_uid` in a PodList's JSON, and the container whose status ID
/// (`<runtime>://<id>`) is `container_id`.
pub fn find_pod(
    pod_list: &[u8],
    pod_uid: &str,
    container_id: &str,
) -> Result<PodFacts, PodLookupError> {
    let list: PodList =
        serde_json::from_slice(pod_list).map_err(|e| PodLookupError::NotPodList(e.to_string()))?;
    if list.kind != "PodList" {
        return Err(PodLookupError::NotPodList(format!("kind {:?}", list.kind)));
    }
    let pod = list
        .items
        .into_iter()
        .find(|p| p.metadata.uid == pod_uid)
        .ok_or_else(|| PodLookupError::NoSuchPod(pod_uid.to_string()))?;
    let container_name = [pod.status.containers, pod.status.init, pod.status.ephemeral]
        .into_iter()
        .flatten()
        .find(|c| {
            c.container_id
                .as_deref()
                .and_then(|id| id.split_once("://"))
                .is_some_and(|(_, id)| id == container_id)
        })
        .map(|c| c.name);
    Ok(PodFacts {
        pod_name: pod.metadata.name,
        namespace: pod.metadata.namespace,
        pod_uid: pod.metadata.uid,
        node_name: pod.spec.node_name,
        container_name,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae";

    fn list() -> String {
        format!(
            r#"{{"kind":"PodList","apiVersion":"v1","metadata":{{}},"items":[
              {{"metadata":{{"name":"other","namespace":"default","uid":"11111111-2222-4333-8444-555555555555"}},
                "spec":{{"nodeName":"node-a","containers":[{{"name":"x","image":"x"}}]}},
                "status":{{"phase":"Running","containerStatuses":[{{"name":"x","containerID":"containerd://{o}","ready":true}}]}}}},
              {{"metadata":{{"name":"web-0","namespace":"shop","uid":"d4735e3a-265e-4d6e-8f41-6b2c7c3a9e10","labels":{{"app":"web"}}}},
                "spec":{{"nodeName":"node-a","containers":[{{"name":"app","image":"nginx"}}]}},
                "status":{{"phase":"Running","podIP":"10.1.2.3",
                  "initContainerStatuses":[{{"name":"init-db","containerID":"containerd://{i}","ready":false}}],
                  "containerStatuses":[{{"name":"app","containerID":"containerd://{ID}","ready":true,"restartCount":0}}]}}}}]}}"#,
            o = "a".repeat(64),
            i = "b".repeat(64)
        )
    }

    #[test]
    fn finds_pod_and_container_by_ids() {
        let f = find_pod(
            list().as_bytes(),
            "d4735e3a-265e-4d6e-8f41-6b2c7c3a9e10",
            ID,
        )
        .unwrap();
        assert_eq!(f.pod_name, "web-0");
        assert_eq!(f.namespace, "shop");
        assert_eq!(f.node_name.as_deref(), Some("node-a"));
        assert_eq!(f.container_name.as_deref(), Some("app"));
        let init = find_pod(
            list().as_bytes(),
            "d4735e3a-265e-4d6e-8f41-6b2c7c3a9e10",
            &"b".repeat(64),
        )
        .unwrap();
        assert_eq!(init.container_name.as_deref(), Some("init-db"));
    }

    #[test]
    fn unknown_container_leaves_the_name_out_and_unknown_pod_is_an_error() {
        let f = find_pod(
            list().as_bytes(),
            "d4735e3a-265e-4d6e-8f41-6b2c7c3a9e10",
            &"c".repeat(64),
        )
        .unwrap();
        assert_eq!(f.container_name, None);
        assert_eq!(
            find_pod(
                list().as_bytes(),
                "00000000-0000-4000-8000-000000000000",
                ID
            ),
            Err(PodLookupError::NoSuchPod(
                "00000000-0000-4000-8000-000000000000".into()
            ))
        );
        assert!(matches!(
            find_pod(br#"{"kind":"Status","items":[]}"#, "x", ID),
            Err(PodLookupError::NotPodList(_))
        ));
        assert!(matches!(
            find_pod(b"<html>", "x", ID),
            Err(PodLookupError::NotPodList(_))
        ));
    }
}
