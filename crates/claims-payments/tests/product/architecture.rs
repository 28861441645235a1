//! The layers inside each crate, checked from its `use` lines: every module imports only
//! from layers below its own, so there is no import circle and nothing reaches up (a store
//! never knows the consumer, the consumer never knows HTTP). Between the crates Cargo
//! holds the rule: the engine (`crates/claims-payments-engine`) cannot name the product,
//! and names no web framework, driver, HTTP client or Azure SDK; the settings crate and
//! the store adapters (`crates/claims-payments-{settings,sqlite,postgres,cosmos}`) cannot
//! name the product either, nor one adapter another, so only the product's own modules and
//! the engine's are read here.
//!
//! A reference is any `crate::<module>` path outside the file's `#[cfg(test)]` tail;
//! references between a module and its own submodules stay inside one concern and are
//! not counted.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

type Layers = &'static [&'static [&'static str]];

/// The engine's modules, bottom to top. A module may use modules of lower layers only.
const ENGINE_LAYERS: Layers = &[
    // The vocabulary: the message contract and its domain types, time and randomness.
    &["domain", "ambient"],
    // The engine's counters: used everywhere, knows only the vocabulary.
    &["telemetry"],
    // The ports: the store, the bank.
    &["store", "bank"],
    // The lease on inbox records, and the processes behind leases.
    &["lease"],
    // The state machine that turns deliveries into one payment.
    &["consumer"],
    // The once-guard: consumers whose work on a message is one record.
    &["once"],
    // What one process's parts share.
    &["services"],
    // Settling what the bank's answers left unknown.
    &["reconcile"],
];

/// The product's modules, bottom to top.
const PRODUCT_LAYERS: Layers = &[
    // The engine's modules, named at their old paths (`lib.rs`): below everything here.
    &[
        "domain",
        "ambient",
        "lease",
        "consumer",
        "services",
        "reconcile",
    ],
    // The settings crate, named at its old paths (`lib.rs`): setting names and errors, the
    // Entra identity rule and the credentials every part that asks for a token shares.
    &["env_setting", "entra"],
    // Logs, counters, metrics and spans: used everywhere, knows only the engine.
    &["telemetry"],
    // The adapters: the stores (each a crate, composed and traced here), the bank's
    // transport, the broker.
    &["store", "bank", "servicebus"],
    // The other ways in: HTTP clients with an Idempotency-Key, the dead-letter tool.
    &["payments_api", "dead_letters"],
    // The wire edge: one module per function of the app, the router, the host's
    // protocol and the request limits.
    &["functions"],
    // Settings from the environment, composed from each module's own.
    &["configuration"],
    // Where a development build changes the composition's parts.
    &["hooks"],
    // The composition root, then the operator commands.
    &["startup"],
    &["cli"],
    // The development crate's only way in: the hooks and the lists of what it may name,
    // from every layer below.
    &["seams"],
];

fn engine_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../claims-payments-engine/src")
}

fn product_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn layer_of(layers: Layers, module: &str) -> Option<usize> {
    layers.iter().position(|layer| layer.contains(&module))
}

/// The node a module path belongs to: the longest entry of `layers` it starts with.
fn node_of(layers: Layers, path: &str) -> Option<&'static str> {
    layers
        .iter()
        .flat_map(|layer| layer.iter().copied())
        .filter(|node| path == *node || path.starts_with(&format!("{node}::")))
        .max_by_key(|node| node.len())
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src is readable") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module path of a source file, e.g. `store/cosmos/mod.rs` -> `store::cosmos`.
fn module_path(src: &Path, file: &Path) -> String {
    let rel = file
        .strip_prefix(src)
        .expect("under src")
        .with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts.join("::")
}

/// Every `crate::a::b` path the code (not its tests) names, brace groups expanded one
/// level (`crate::{a, b::c}`).
fn references(code: &str) -> BTreeSet<String> {
    let code = code.split("#[cfg(test)]").next().unwrap_or(code);
    let mut found = BTreeSet::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let item = item.trim();
                if !item.is_empty() {
                    found.insert(path_prefix(item));
                }
            }
        } else {
            found.insert(path_prefix(rest));
        }
    }
    found
}

fn path_prefix(text: &str) -> String {
    text.chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
        .collect::<String>()
        .trim_end_matches(':')
        .to_owned()
}

/// The modules of the crate at `src` that are missing from `layers`, and the imports
/// that do not go down them.
fn misplaced(src: &Path, layers: Layers) -> (Vec<String>, Vec<String>) {
    let mut files = Vec::new();
    sources(src, &mut files);
    let mut unplaced = Vec::new();
    let mut upward = Vec::new();
    for file in &files {
        let module = module_path(src, file);
        if module == "lib" || module == "main" {
            continue;
        }
        let Some(from) = node_of(layers, &module) else {
            unplaced.push(module);
            continue;
        };
        let code = std::fs::read_to_string(file).expect("readable");
        for reference in references(&code) {
            let Some(to) = node_of(layers, &reference) else {
                unplaced.push(format!("{reference} (used by {module})"));
                continue;
            };
            if to == from {
                continue;
            }
            let (below, above) = (layer_of(layers, to), layer_of(layers, from));
            if below >= above {
                upward.push(format!("{module} uses {reference}"));
            }
        }
    }
    (unplaced, upward)
}

#[test]
fn every_module_imports_only_from_the_layers_below_it() {
    for (src, layers) in [
        (engine_src(), ENGINE_LAYERS),
        (product_src(), PRODUCT_LAYERS),
    ] {
        let (unplaced, upward) = misplaced(&src, layers);
        assert!(
            unplaced.is_empty(),
            "{}: modules missing from the layers: {unplaced:?}",
            src.display()
        );
        assert!(
            upward.is_empty(),
            "{}: imports that do not go down the layers:\n{}",
            src.display(),
            upward.join("\n")
        );
    }
}
#[test]
fn the_reference_reader_sees_groups_and_paths() {
    let code = "use crate::store::{A, B};\nuse crate::{message, config::names};\nlet x = crate::bank::pay();\n#[cfg(test)]\nuse crate::cli;";
    let found: Vec<String> = references(code).into_iter().collect();
    assert_eq!(found, ["bank::pay", "config::names", "message", "store"]);
    assert_eq!(
        node_of(PRODUCT_LAYERS, "env_setting::names"),
        Some("env_setting")
    );
    assert_eq!(
        node_of(PRODUCT_LAYERS, "configuration::Settings"),
        Some("configuration")
    );
    assert_eq!(
        node_of(PRODUCT_LAYERS, "store::cosmos::settings"),
        Some("store")
    );
    assert_eq!(node_of(ENGINE_LAYERS, "lease::liveness"), Some("lease"));
}

/// The inbox retention has one owner, the documented one: the `Purge` timer function
/// (`PURGE_SCHEDULE`), and `claims-payments purge` for an operator on demand. Nothing else
/// in the product or the engine (`serve`'s start-up, a consumer, another function) calls
/// the store's purge; the stores themselves and their decorators (`store/`) only implement
/// or forward it.
#[test]
fn only_the_purge_function_and_the_purge_command_purge() {
    let mut files = Vec::new();
    for src in [engine_src(), product_src()] {
        let mut found = Vec::new();
        sources(&src, &mut found);
        files.extend(found.into_iter().map(|file| (src.clone(), file)));
    }
    let mut callers: Vec<String> = files
        .iter()
        .filter(|(src, file)| !module_path(src, file).starts_with("store"))
        .filter(|(_, file)| {
            let code = std::fs::read_to_string(file).expect("readable");
            let code = code
                .split("#[cfg(test)]")
                .next()
                .unwrap_or(&code)
                .to_owned();
            code.contains(".purge_expired(")
        })
        .map(|(src, file)| module_path(src, file))
        .collect();
    callers.sort();
    assert_eq!(callers, ["cli", "functions::purge"]);
}
