//! The container definition, written once here, and provisioning against it.
//!
//! [`container_definition`] is the Cosmos REST JSON of the container; `infra/cosmos-container.json`
//! and the Bicep carry the same content, and a test keeps them equal. [`container_properties`]
//! is that JSON read into the SDK's type, so the provisioned container cannot drift from it.
//!
//! A unique key policy cannot be changed after a container is created, and the guard depends
//! on it. So provisioning does not only create: it reads an existing container back and
//! refuses to run against one whose partition key, unique keys or default TTL differ. The
//! indexing policy can be changed in place: provisioning with a key replaces an outdated
//! one, and everything else (Entra ID, `serve` at start) warns about it.

use std::fmt;

use azure_data_cosmos::models::{
    ContainerProperties, IndexingMode, IndexingPolicy, PartitionKeyKind, PartitionKeyVersion,
    TimeToLive,
};
use azure_data_cosmos::{ContainerClient, CosmosClient};

use super::errors::describe;
use super::settings::{CosmosAuth, CosmosSettings};
// Where they were first defined; settings own them so that settings do not depend on this module.
pub use super::settings::{DEFAULT_CONTAINER, DEFAULT_DATABASE};

pub const PARTITION_KEY_PATH: &str = "/claimId";
pub const UNIQUE_KEY_PATHS: [&str; 2] = ["/docType", "/dedupKey"];

/// The container's Cosmos REST definition under the name `name`.
///
/// - partition key `/claimId` (Hash, version 2): a claim's documents share one logical
///   partition, the scope of transactional batches and unique keys;
/// - `defaultTtl: -1`: TTL on without a default, so only documents with `ttl` (inbox) expire;
/// - unique key `(/docType, /dedupKey)`: one inbox per (consumer, message) and one payment
///   per purpose in each claim, whatever the documents' ids;
/// - indexing: only [`INDEXED_PATHS`], everything else excluded with `/*` (see there).
pub fn container_definition(name: &str) -> serde_json::Value {
    let included: Vec<serde_json::Value> = INDEXED_PATHS
        .iter()
        .map(|(path, _why)| serde_json::json!({ "path": path }))
        .collect();
    serde_json::json!({
        "id": name,
        "partitionKey": { "paths": [PARTITION_KEY_PATH], "kind": "Hash", "version": 2 },
        "defaultTtl": -1,
        "uniqueKeyPolicy": { "uniqueKeys": [ { "paths": UNIQUE_KEY_PATHS } ] },
        "indexingPolicy": {
            "indexingMode": "consistent",
            "automatic": true,
            "includedPaths": included,
            "excludedPaths": [ { "path": "/*" }, { "path": ETAG_PATH } ]
        }
    })
}

/// The paths the container indexes, and why. Every indexed value costs request units on
/// each write (Microsoft's published rule: about 0.2 RU per indexed term on a create, 0.4
/// per changed term on a replace), so only what a query filters or sorts on, or the unique
/// key relies on, is indexed; `/*` is excluded. `id` and `_ts` are always indexed by the
/// service in consistent mode. Indexing mode `none` is not an option: it is incompatible
/// with TTL, which the inbox documents need.
///
/// **A new query must add the paths it filters or sorts on here** (and in
/// `infra/cosmos-container.json` and the Bicep, which a test and CI keep equal to this): on
/// Azure, `ORDER BY` on an excluded path is refused (400) and a filter on one scans every
/// document the rest of the query selects. The SDK's in-process emulator ignores the
/// indexing policy altogether, so only the test `queried_paths_are_indexed` (which reads
/// the query strings of this crate's `src/`) catches a missing path before Azure does.
pub const INDEXED_PATHS: [(&str, &str); 4] = [
    (
        "/docType/?",
        "unique key path; the operator listings filter on it",
    ),
    (
        "/dedupKey/?",
        "unique key path (whether a unique key works without its paths indexed is \
         not documented; Microsoft's own SDK tests always index them)",
    ),
    (
        "/createdAt/?",
        "the listings sort on it (ORDER BY c.createdAt)",
    ),
    (
        "/status/?",
        "reconcile lists the payments left in_progress or needs_reconciliation",
    ),
];

/// `_etag` is never indexed; the service adds this exclusion itself if it is missing.
const ETAG_PATH: &str = "/\"_etag\"/?";

/// [`container_definition`] for the default container name, as the JSON text Bicep and
/// `infra/cosmos-container.json` carry.
pub fn container_definition_json() -> String {
    container_definition(DEFAULT_CONTAINER).to_string()
}

/// The SDK properties of the container, read from [`container_definition`]. The indexing
/// policy is included: the SDK serializes it and both the service and the in-process
/// emulator accept it at creation.
pub fn container_properties(name: &str) -> ContainerProperties {
    // The definition is a constant the SDK type models field for field; a failure here is
    // a programming error that the unit test below catches, never a runtime condition.
    // Falling back to a partial definition would silently provision a container without
    // the unique key the guard depends on.
    serde_json::from_value(container_definition(name))
        .expect("the container definition deserializes into ContainerProperties")
}

/// One way an existing container differs from the definition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Difference {
    property: &'static str,
    expected: String,
    found: String,
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: expected {}, found {}",
            self.property, self.expected, self.found
        )
    }
}

/// Compares an existing container's properties with the definition on what the guard
/// depends on: the partition key, the unique keys and the default TTL. The indexing
/// policy is not compared (the service normalises it, and it can be changed in place).
pub fn verify_container_properties(found: &ContainerProperties) -> Vec<Difference> {
    let mut differences = Vec::new();
    let pk = &found.partition_key;
    let paths: Vec<&str> = pk.paths().iter().map(|p| p.as_ref()).collect();
    if paths != [PARTITION_KEY_PATH] || pk.kind() != PartitionKeyKind::Hash {
        differences.push(Difference {
            property: "partitionKey",
            expected: format!("Hash on [{PARTITION_KEY_PATH}]"),
            found: format!("{:?} on {paths:?}", pk.kind()),
        });
    }
    if pk.version() != PartitionKeyVersion::V2 {
        differences.push(Difference {
            property: "partitionKey.version",
            expected: "2".into(),
            found: format!("{:?}", pk.version()),
        });
    }
    let mut keys: Vec<Vec<String>> = found
        .unique_key_policy
        .as_ref()
        .map(|policy| policy.unique_keys.iter().map(|k| k.paths.clone()).collect())
        .unwrap_or_default();
    let expected_keys = vec![UNIQUE_KEY_PATHS
        .iter()
        .map(|p| (*p).to_owned())
        .collect::<Vec<_>>()];
    let mut normalised = expected_keys.clone();
    for key in keys.iter_mut().chain(normalised.iter_mut()) {
        key.sort();
    }
    keys.sort();
    if keys != normalised {
        differences.push(Difference {
            property: "uniqueKeyPolicy",
            expected: format!("{expected_keys:?}"),
            found: format!(
                "{keys:?} (a unique key policy cannot be changed: create a new container)"
            ),
        });
    }
    if found.default_ttl != TimeToLive::NoDefault {
        let found_ttl = match &found.default_ttl {
            TimeToLive::Forever => "null (TTL off: inbox documents would never expire)".to_owned(),
            TimeToLive::Seconds(n) => format!("{n} (payment documents would expire)"),
            other => format!("{other:?}"),
        };
        differences.push(Difference {
            property: "defaultTtl",
            expected: "-1".into(),
            found: found_ttl,
        });
    }
    differences
}

/// The parts of an indexing policy that decide what is indexed, normalised for what the
/// service adds on its own (the `_etag` exclusion) and for the order of paths.
#[derive(Debug, Clone, PartialEq, Eq)]
struct IndexingShape {
    consistent: bool,
    automatic: bool,
    included: Vec<String>,
    excluded: Vec<String>,
    composite_indexes: usize,
    spatial_indexes: usize,
}

impl IndexingShape {
    fn of(policy: Option<&IndexingPolicy>) -> Self {
        let Some(policy) = policy else {
            // No policy: the service's default, everything indexed.
            return IndexingShape {
                consistent: true,
                automatic: true,
                included: vec!["/*".to_owned()],
                excluded: vec![ETAG_PATH.to_owned()],
                composite_indexes: 0,
                spatial_indexes: 0,
            };
        };
        let sorted = |paths: &mut Vec<String>| {
            paths.sort();
            paths.dedup();
        };
        let mut included: Vec<String> = policy
            .included_paths
            .iter()
            .map(|p| p.path.clone())
            .collect();
        let mut excluded: Vec<String> = policy
            .excluded_paths
            .iter()
            .map(|p| p.path.clone())
            .collect();
        excluded.push(ETAG_PATH.to_owned());
        if !included.iter().chain(&excluded).any(|p| p == "/*") {
            included.push("/*".to_owned());
        }
        sorted(&mut included);
        sorted(&mut excluded);
        IndexingShape {
            consistent: policy.indexing_mode != Some(IndexingMode::None),
            automatic: policy.automatic,
            included,
            excluded,
            composite_indexes: policy.composite_indexes.len(),
            spatial_indexes: policy.spatial_indexes.len(),
        }
    }
}

impl fmt::Display for IndexingShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}, included {:?}, excluded {:?}",
            if self.consistent {
                "consistent"
            } else {
                "none"
            },
            self.included,
            self.excluded
        )?;
        if !self.automatic {
            write!(f, ", automatic off")?;
        }
        if self.composite_indexes + self.spatial_indexes > 0 {
            write!(
                f,
                ", {} composite and {} spatial indexes",
                self.composite_indexes, self.spatial_indexes
            )?;
        }
        Ok(())
    }
}

/// How an existing container's indexing policy differs from the definition, if it does.
/// Not a reason to refuse the container (the guard does not depend on it, and it can be
/// changed in place), but a policy that indexes more costs request units on every write,
/// and one that indexes less breaks or slows the listings.
pub fn indexing_policy_difference(found: &ContainerProperties) -> Option<Difference> {
    let expected = IndexingShape::of(
        container_properties(DEFAULT_CONTAINER)
            .indexing_policy
            .as_ref(),
    );
    let found = IndexingShape::of(found.indexing_policy.as_ref());
    (expected != found).then(|| Difference {
        property: "indexingPolicy",
        expected: expected.to_string(),
        found: found.to_string(),
    })
}

/// What [`provision`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProvisionReport {
    database: String,
    container: String,
    pub database_created: bool,
    pub container_created: bool,
    /// An existing container's indexing policy differed and was replaced in place.
    pub indexing_policy_updated: bool,
}

impl fmt::Display for ProvisionReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = |created: bool| {
            if created {
                "created"
            } else {
                "already existed"
            }
        };
        write!(
            f,
            "database {} {}; container {} {}{} and matches the definition",
            self.database,
            state(self.database_created),
            self.container,
            state(self.container_created),
            if self.indexing_policy_updated {
                " (its indexing policy was updated in place)"
            } else {
                ""
            }
        )
    }
}

/// Creates the database and the container (key auth only: the emulator, dev accounts),
/// or verifies them if they exist. With Entra ID the control plane is not available to
/// data-plane identities, so the container must come from Bicep; this then only verifies.
pub async fn provision(settings: &CosmosSettings) -> anyhow::Result<ProvisionReport> {
    let client = settings.build_client().await?;
    if !matches!(settings.auth, CosmosAuth::Key(_)) {
        verify_existing(&client, &settings.database, &settings.container).await?;
        return Ok(ProvisionReport {
            database: settings.database.clone(),
            container: settings.container.clone(),
            database_created: false,
            container_created: false,
            indexing_policy_updated: false,
        });
    }
    provision_with_client(&client, &settings.database, &settings.container).await
}

/// [`provision`] with an existing client (the emulator, tests).
pub async fn provision_with_client(
    client: &CosmosClient,
    database: &str,
    container: &str,
) -> anyhow::Result<ProvisionReport> {
    let database_created = match client.create_database(database, None).await {
        Ok(_) => true,
        Err(e) if e.status().is_conflict() => false,
        Err(e) => anyhow::bail!(
            "cannot create database {database:?}: {}",
            describe("create_database", &e)
        ),
    };
    let container_created = match client
        .database_client(database)
        .create_container(container_properties(container), None)
        .await
    {
        Ok(_) => true,
        Err(e) if e.status().is_conflict() => false,
        Err(e) => anyhow::bail!(
            "cannot create container {container:?} in database {database:?}: {}",
            describe("create_container", &e)
        ),
    };
    // Read back even what we just created: the account might have dropped a policy.
    let (container_client, properties) = verify_existing(client, database, container).await?;
    let mut indexing_policy_updated = false;
    if let Some(difference) = indexing_policy_difference(&properties) {
        // The unique key, partition key and TTL were just verified equal, so replacing
        // the properties with the definition changes only the indexing policy. Azure
        // applies it as an online index transformation; removed paths stop costing at once.
        container_client
            .replace(container_properties(container), None)
            .await
            .map_err(|e| {
                anyhow::anyhow!(
                    "container {container:?}: cannot update the indexing policy ({difference}): {}",
                    describe("replace_container", &e)
                )
            })?;
        let (_, properties) = verify_existing(client, database, container).await?;
        if let Some(still) = indexing_policy_difference(&properties) {
            anyhow::bail!(
                "container {container:?} in database {database:?}: the indexing policy was \
                 replaced but reads back different: {still}"
            );
        }
        indexing_policy_updated = true;
    }
    Ok(ProvisionReport {
        database: database.to_owned(),
        container: container.to_owned(),
        database_created,
        container_created,
        indexing_policy_updated,
    })
}

/// Reads the container's properties and fails, naming every difference, if they do not
/// match the definition (an indexing policy difference is only logged).
pub async fn verify_existing(
    client: &CosmosClient,
    database: &str,
    container: &str,
) -> anyhow::Result<(ContainerClient, ContainerProperties)> {
    let container_client = client
        .database_client(database)
        .container_client(container, None)
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "container {container:?} in database {database:?}: {}",
                describe("open_container", &e)
            )
        })?;
    let properties = container_client
        .read(None)
        .await
        .and_then(|r| r.into_model())
        .map_err(|e| {
            anyhow::anyhow!(
                "container {container:?}: {}",
                describe("read_container", &e)
            )
        })?;
    check_properties(database, container, &properties)?;
    Ok((container_client, properties))
}

/// Fails on a difference the guard depends on; logs a warning for an outdated indexing
/// policy, which costs request units (or slows the listings) but breaks nothing.
pub fn check_properties(
    database: &str,
    container: &str,
    found: &ContainerProperties,
) -> anyhow::Result<()> {
    if let Some(difference) = indexing_policy_difference(found) {
        tracing::warn!(
            database,
            container,
            %difference,
            "the container's indexing policy differs from infra/cosmos-container.json; \
             deploy the Bicep (or run provision with a key) to update it in place"
        );
    }
    let differences = verify_container_properties(found);
    if differences.is_empty() {
        return Ok(());
    }
    let list: Vec<String> = differences.iter().map(ToString::to_string).collect();
    anyhow::bail!(
        "container {container:?} in database {database:?} does not match the definition \
         (infra/cosmos-container.json): {}",
        list.join("; ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn properties_carry_the_whole_definition() {
        let properties = container_properties("payments");
        // Serializing the SDK type gives back the definition: nothing was dropped.
        let round_trip = serde_json::to_value(&properties).unwrap();
        assert_eq!(round_trip, container_definition("payments"));
        assert!(verify_container_properties(&properties).is_empty());
    }

    /// The indexing policy of containers deployed before indexing was narrowed to the
    /// paths queried: every path but the payout request body.
    fn legacy_policy() -> serde_json::Value {
        serde_json::json!({
            "indexingMode": "consistent",
            "automatic": true,
            "includedPaths": [ { "path": "/*" } ],
            "excludedPaths": [ { "path": "/payoutRequest/?" }, { "path": ETAG_PATH } ]
        })
    }

    fn with_policy(policy: serde_json::Value) -> ContainerProperties {
        let mut definition = container_definition("payments");
        definition["indexingPolicy"] = policy;
        serde_json::from_value(definition).unwrap()
    }

    #[test]
    fn only_the_needed_paths_are_indexed() {
        let policy = &container_definition("payments")["indexingPolicy"];
        assert_eq!(policy["indexingMode"], "consistent", "TTL needs consistent");
        assert_eq!(policy["excludedPaths"][0]["path"], "/*");
        let included: Vec<&str> = policy["includedPaths"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["path"].as_str().unwrap())
            .collect();
        for path in UNIQUE_KEY_PATHS {
            assert!(
                included.contains(&format!("{path}/?").as_str()),
                "unique key path {path} is indexed"
            );
        }
        assert!(included.iter().all(|p| p.ends_with("/?")), "{included:?}");
    }

    #[test]
    fn an_outdated_indexing_policy_is_named_but_not_refused() {
        let legacy = with_policy(legacy_policy());
        let difference = indexing_policy_difference(&legacy).expect("legacy policy differs");
        assert!(difference.found.contains("/*"), "{difference}");
        assert!(
            verify_container_properties(&legacy).is_empty(),
            "the guard does not depend on the index"
        );
        assert!(check_properties("db", "payments", &legacy).is_ok());
        // No policy at all is the service's default: everything indexed.
        let mut bare = with_policy(legacy_policy());
        bare.indexing_policy = None;
        assert!(indexing_policy_difference(&bare).is_some());
    }

    #[test]
    fn what_the_service_adds_is_not_a_difference() {
        // The service adds the `_etag` exclusion itself and may return paths in any order.
        let mut policy = container_definition("payments")["indexingPolicy"].clone();
        policy["excludedPaths"] = serde_json::json!([{ "path": "/*" }]);
        policy["includedPaths"].as_array_mut().unwrap().reverse();
        assert_eq!(indexing_policy_difference(&with_policy(policy)), None);
    }

    /// Every property a query in this crate's `src/` filters or sorts on (`c.<name>` inside
    /// a string literal) is indexed. The emulator ignores the indexing policy, so without
    /// this a new query on an excluded path would pass every local test and then be
    /// refused (ORDER BY) or scan (filter) on Azure.
    #[test]
    fn queried_paths_are_indexed() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let included: Vec<String> = INDEXED_PATHS.iter().map(|(p, _)| p.to_string()).collect();
        let mut queried = Vec::new();
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "rs") {
                let source = std::fs::read_to_string(&path).unwrap();
                // Production code only: the tests below hold sample queries of their own.
                let source = source.split("#[cfg(test)]").next().unwrap_or_default();
                for literal in string_literals(source) {
                    for name in query_properties(&literal) {
                        queried.push((
                            name,
                            path.file_name().unwrap().to_string_lossy().into_owned(),
                        ));
                    }
                }
            }
        }
        assert!(
            queried.iter().any(|(name, _)| name == "createdAt"),
            "the scan finds the listing query: {queried:?}"
        );
        for (name, file) in &queried {
            assert!(
                included.contains(&format!("/{name}/?")),
                "a query in {file} uses c.{name}, which the container does not index: add \
                 \"/{name}/?\" to INDEXED_PATHS, infra/cosmos-container.json and infra/modules/cosmos.bicep"
            );
        }
    }

    /// The contents of the `"..."` string literals of Rust source (escapes kept as written;
    /// raw strings and chars are rare enough in this directory to ignore).
    fn string_literals(source: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut chars = source.chars().peekable();
        let mut in_comment = false;
        let mut previous = ' ';
        while let Some(c) = chars.next() {
            if in_comment {
                in_comment = c != '\n';
            } else if c == '/' && chars.peek() == Some(&'/') {
                in_comment = true;
            } else if c == '\'' && previous != '\\' {
                // A char literal such as '"' must not open a string: skip up to its end.
                let mut lookahead = chars.clone();
                let (a, b) = (lookahead.next(), lookahead.next());
                if b == Some('\'') && a.is_some() {
                    chars.next();
                    chars.next();
                }
            } else if c == '"' {
                let mut literal = String::new();
                let mut escaped = false;
                for d in chars.by_ref() {
                    if escaped {
                        escaped = false;
                    } else if d == '\\' {
                        escaped = true;
                    } else if d == '"' {
                        break;
                    }
                    literal.push(d);
                }
                out.push(literal);
            }
            previous = c;
        }
        out
    }

    /// `name` for every `c.name` in a query text (`c` standing alone before the dot).
    fn query_properties(text: &str) -> Vec<String> {
        let bytes = text.as_bytes();
        let mut names = Vec::new();
        for i in 0..bytes.len().saturating_sub(2) {
            let standalone =
                i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_');
            if standalone && bytes[i] == b'c' && bytes[i + 1] == b'.' {
                let name: String = text[i + 2..]
                    .chars()
                    .take_while(|ch| ch.is_ascii_alphanumeric() || *ch == '_')
                    .collect();
                if !name.is_empty() {
                    names.push(name);
                }
            }
        }
        names
    }

    #[test]
    fn the_query_scan_reads_literals_only() {
        let source = r#"let a = x.map(|c| c.value()); // c.comment
            let q = "SELECT * FROM c WHERE c.docType = @t"; let f = "AND (c.status = 'x')"; let e = "etc. abc.def";"#;
        let found: Vec<String> = string_literals(source)
            .iter()
            .flat_map(|l| query_properties(l))
            .collect();
        assert_eq!(found, ["docType", "status"]);
    }

    #[test]
    fn differences_are_named() {
        let bare = ContainerProperties::new("payments".to_owned(), "/tenantId".into());
        let found: Vec<&str> = verify_container_properties(&bare)
            .iter()
            .map(|d| d.property)
            .collect();
        assert_eq!(found, ["partitionKey", "uniqueKeyPolicy", "defaultTtl"]);
        let message = check_properties("db", "payments", &bare)
            .unwrap_err()
            .to_string();
        assert!(
            message.contains("uniqueKeyPolicy") && message.contains("defaultTtl"),
            "{message}"
        );
    }
}
