//! The kustomize component deploy/kubernetes/sidecar/ (issue 46, item 8):
//! weir, its ConfigMap and its PodMonitor added to a Deployment someone
//! already has. Neither kubectl nor kustomize is installed where the tests
//! run, so this file does what `kubectl kustomize` does with it — reads the
//! component, applies its strategic merge patch to a plain Deployment
//! (maps merged, lists of named items merged by `name`, other lists
//! replaced) — and checks the result: the application untouched, the
//! sidecar the demo's, the volume naming the component's ConfigMap, the
//! PodMonitor selecting the pod and scraping the sidecar's admin port, the
//! config valid.
#![allow(clippy::unwrap_used)]

use serde_yaml_ng::{Mapping, Value as Yaml};
use std::path::{Path, PathBuf};

const COMPONENT: &str = "deploy/kubernetes/sidecar";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn yaml_text(src: &str, label: &str) -> Yaml {
    serde_yaml_ng::from_str(src).unwrap_or_else(|e| panic!("{label} is not valid YAML: {e}"))
}

fn yaml(rel: &str) -> Yaml {
    let src = std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
    yaml_text(&src, rel)
}

fn at<'a>(v: &'a Yaml, path: &[&str]) -> &'a Yaml {
    let mut cur = v;
    for (i, k) in path.iter().enumerate() {
        cur = cur
            .get(*k)
            .unwrap_or_else(|| panic!("missing `{}`", path[..=i].join(".")));
    }
    cur
}

fn s(v: &Yaml) -> &str {
    v.as_str()
        .unwrap_or_else(|| panic!("expected a string, got {v:?}"))
}

/// The item of a list of named items called `name`.
fn named<'a>(list: &'a Yaml, name: &str) -> &'a Yaml {
    list.as_sequence()
        .unwrap_or_else(|| panic!("expected a list, got {list:?}"))
        .iter()
        .find(|i| i.get("name").and_then(Yaml::as_str) == Some(name))
        .unwrap_or_else(|| panic!("no item named {name:?} in {list:?}"))
}

/// A strategic merge patch as kustomize applies one to a Deployment:
/// maps merge key by key, a list whose items are all maps with a `name`
/// merges item by item on it (new items first, as kustomize puts them),
/// any other value is
/// replaced. (Enough for the fields a pod template's patch touches:
/// containers, initContainers, volumes, ports, env, volumeMounts.)
fn merge(base: &mut Yaml, patch: &Yaml) {
    match (base, patch) {
        (Yaml::Mapping(b), Yaml::Mapping(p)) => {
            for (k, v) in p {
                match b.get_mut(k) {
                    Some(existing) => merge(existing, v),
                    None => {
                        b.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (Yaml::Sequence(b), Yaml::Sequence(p)) if by_name(b) && by_name(p) => {
            let mut new = Vec::new();
            for item in p {
                let name = item.get("name").cloned();
                match b.iter_mut().find(|i| i.get("name").cloned() == name) {
                    Some(existing) => merge(existing, item),
                    None => new.push(item.clone()),
                }
            }
            // kustomize puts the patch's new items first.
            b.splice(0..0, new);
        }
        (b, p) => *b = p.clone(),
    }
}

fn by_name(items: &[Yaml]) -> bool {
    items
        .iter()
        .all(|i| i.get("name").is_some_and(|n| n.is_string()))
}

/// The component: its resources by kind, and each patch with its target.
struct Component {
    resources: Vec<Yaml>,
    patches: Vec<(Yaml, Mapping)>,
}

fn component() -> Component {
    let k = yaml(&format!("{COMPONENT}/kustomization.yaml"));
    assert_eq!(
        s(at(&k, &["apiVersion"])),
        "kustomize.config.k8s.io/v1alpha1"
    );
    assert_eq!(s(at(&k, &["kind"])), "Component");
    let file = |p: &Yaml| yaml(&format!("{COMPONENT}/{}", s(p)));
    let resources = at(&k, &["resources"])
        .as_sequence()
        .unwrap()
        .iter()
        .map(file)
        .collect();
    let patches = at(&k, &["patches"])
        .as_sequence()
        .unwrap()
        .iter()
        .map(|p| {
            let target = at(p, &["target"]).as_mapping().unwrap().clone();
            (file(at(p, &["path"])), target)
        })
        .collect();
    Component { resources, patches }
}

fn of_kind<'a>(c: &'a Component, kind: &str) -> &'a Yaml {
    let found: Vec<&Yaml> = c
        .resources
        .iter()
        .filter(|r| r.get("kind").and_then(Yaml::as_str) == Some(kind))
        .collect();
    assert_eq!(found.len(), 1, "one {kind} in the component");
    found[0]
}

/// A Deployment as someone might already have, knowing nothing of weir.
const PLAIN: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: shop
  labels: {app: shop}
spec:
  replicas: 3
  selector:
    matchLabels: {app: shop}
  template:
    metadata:
      labels: {app: shop, tier: web}
    spec:
      containers:
        - name: shop
          image: shop:1.2.3
          ports: [{name: http, containerPort: 8080}]
          volumeMounts: [{name: cache, mountPath: /cache}]
      volumes:
        - name: cache
          emptyDir: {}
"#;

/// `kubectl kustomize` of a kustomization with PLAIN as its resource and
/// the component: PLAIN with each patch that targets a Deployment applied
/// (the patch's placeholder name replaced by the Deployment's own, as
/// kustomize does for a patch with a target).
fn rendered(c: &Component) -> Yaml {
    let mut d = yaml_text(PLAIN, "PLAIN");
    for (patch, target) in &c.patches {
        assert_eq!(
            target.get("kind").and_then(Yaml::as_str),
            Some("Deployment"),
            "{target:?}"
        );
        assert!(
            target.get("name").is_none(),
            "the target names no Deployment, so it fits any: {target:?}"
        );
        assert_eq!(s(at(patch, &["kind"])), "Deployment");
        let mut patch = patch.clone();
        patch["metadata"]["name"] = d["metadata"]["name"].clone();
        merge(&mut d, &patch);
    }
    d
}

#[test]
fn the_component_adds_weir_to_a_plain_deployment() {
    let c = component();
    let d = rendered(&c);
    let plain = yaml_text(PLAIN, "PLAIN");

    // The application, its name, replicas, selector and volume: untouched.
    assert_eq!(d["metadata"], plain["metadata"]);
    assert_eq!(d["spec"]["replicas"], plain["spec"]["replicas"]);
    assert_eq!(d["spec"]["selector"], plain["spec"]["selector"]);
    let pod = &d["spec"]["template"];
    assert_eq!(
        pod["spec"]["containers"], plain["spec"]["template"]["spec"]["containers"],
        "the application's containers are as they were"
    );
    assert_eq!(pod["metadata"]["labels"]["app"], "shop");
    assert_eq!(pod["metadata"]["labels"]["tier"], "web");
    named(&pod["spec"]["volumes"], "cache");

    // weir: a native sidecar, the same container as the demo's.
    let inits = pod["spec"]["initContainers"].as_sequence().unwrap();
    assert_eq!(inits.len(), 1, "{inits:?}");
    let weir = named(&pod["spec"]["initContainers"], "weir");
    assert_eq!(s(at(weir, &["restartPolicy"])), "Always");
    let demo = yaml("deploy/kubernetes/deployment.yaml");
    assert_eq!(
        weir,
        named(
            at(&demo, &["spec", "template", "spec", "initContainers"]),
            "weir"
        ),
        "the component's sidecar and deploy/kubernetes/deployment.yaml's have drifted apart"
    );
    // Issue 58, item 4: Pod Security's `restricted` profile (and the
    // RuntimeDefault seccomp profile docs/guide/sidecar.md promises) on the
    // sidecar container itself: a pod it is added to may set none of it —
    // PLAIN's sets no securityContext — and only the demo's pod did.
    assert!(pod["spec"].get("securityContext").is_none());
    let sc = at(weir, &["securityContext"]);
    assert_eq!(s(at(sc, &["seccompProfile", "type"])), "RuntimeDefault");
    assert_eq!(at(sc, &["runAsNonRoot"]).as_bool(), Some(true));
    assert_eq!(at(sc, &["allowPrivilegeEscalation"]).as_bool(), Some(false));
    assert_eq!(at(sc, &["readOnlyRootFilesystem"]).as_bool(), Some(true));
    assert_eq!(
        at(sc, &["capabilities", "drop"]),
        &yaml_text("[ALL]", "drop ALL")
    );
    assert_eq!(
        at(sc, &["runAsUser"]).as_u64(),
        Some(65532),
        "the image's USER (distroless nonroot)"
    );

    // Its config: the component's ConfigMap, mounted as a directory.
    let cm = of_kind(&c, "ConfigMap");
    let mount = named(at(weir, &["volumeMounts"]), "weir-config");
    assert_eq!(s(at(mount, &["mountPath"])), "/etc/weir");
    assert!(
        mount.get("subPath").is_none(),
        "a subPath mount never updates"
    );
    let volume = named(&pod["spec"]["volumes"], "weir-config");
    assert_eq!(
        at(volume, &["configMap", "name"]),
        at(cm, &["metadata", "name"])
    );
    let toml = s(at(cm, &["data", "weir.toml"]));
    let config = weir::config::Config::parse(Path::new("configmap.yaml"), toml)
        .unwrap_or_else(|e| panic!("the component's weir.toml:\n{e}"));
    let admin_port = config.server.admin.tcp().unwrap().port();
    let admin = named(at(weir, &["ports"]), "admin");
    assert_eq!(
        at(admin, &["containerPort"]).as_u64(),
        Some(u64::from(admin_port))
    );
    assert!(
        config.server.admin.tcp().unwrap().ip().is_unspecified(),
        "probes and Prometheus reach the admin listener from outside the pod"
    );
    for probe in ["startupProbe", "readinessProbe", "livenessProbe"] {
        assert_eq!(s(at(weir, &[probe, "httpGet", "port"])), "admin");
    }
    assert_eq!(
        s(at(&pod["metadata"], &["annotations", "prometheus.io/port"])),
        admin_port.to_string()
    );

    // The PodMonitor: selects the pod the patch labelled, scrapes the
    // sidecar's admin port.
    let pm = of_kind(&c, "PodMonitor");
    let selector = at(pm, &["spec", "selector", "matchLabels"])
        .as_mapping()
        .unwrap();
    assert!(!selector.is_empty());
    for (k, v) in selector {
        assert_eq!(
            pod["metadata"]["labels"].get(k),
            Some(v),
            "the PodMonitor selects {k:?}, which the pod does not carry"
        );
    }
    let endpoint = &at(pm, &["spec", "podMetricsEndpoints"])[0];
    assert_eq!(s(at(endpoint, &["port"])), "admin");
    assert_eq!(s(at(endpoint, &["path"])), "/metrics");
}

/// Applying the component to a Deployment that already has it changes
/// nothing (a second `kubectl apply -k` is a no-op).
#[test]
fn the_component_applied_twice_is_applied_once() {
    let c = component();
    let once = rendered(&c);
    let mut twice = once.clone();
    for (patch, _) in &c.patches {
        let mut patch = patch.clone();
        patch["metadata"]["name"] = once["metadata"]["name"].clone();
        merge(&mut twice, &patch);
    }
    assert_eq!(once, twice);
}

/// Where kubectl is installed (it needs no cluster): `kubectl kustomize`
/// of a kustomization with PLAIN and the component makes the Deployment
/// this file's reader makes, the ConfigMap and the PodMonitor.
#[test]
fn kubectl_kustomize_renders_the_component_as_this_file_does() {
    if !std::process::Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_ok_and(|o| o.status.success())
    {
        eprintln!("SKIPPED: kubectl is not installed");
        return;
    }
    // The component copied beside the kustomization: kustomize refuses
    // an absolute path to it, and a relative one would depend on where
    // the temporary directory is.
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("sidecar");
    std::fs::create_dir(&copy).unwrap();
    for e in std::fs::read_dir(root().join(COMPONENT)).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, copy.join(p.file_name().unwrap())).unwrap();
    }
    std::fs::write(dir.path().join("deployment.yaml"), PLAIN).unwrap();
    std::fs::write(
        dir.path().join("kustomization.yaml"),
        "resources: [deployment.yaml]\ncomponents: [sidecar]\n",
    )
    .unwrap();
    let out = std::process::Command::new("kubectl")
        .arg("kustomize")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let docs: Vec<Yaml> = serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect();
    let kinds = |k: &str| {
        docs.iter()
            .filter(|d| d.get("kind").and_then(Yaml::as_str) == Some(k))
            .count()
    };
    assert_eq!((kinds("ConfigMap"), kinds("PodMonitor")), (1, 1), "{text}");
    let deployment = docs
        .iter()
        .find(|d| d.get("kind").and_then(Yaml::as_str) == Some("Deployment"))
        .unwrap();
    assert_eq!(deployment, &rendered(&component()), "{text}");
}
