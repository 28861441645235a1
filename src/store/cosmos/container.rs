//! The container definition, written once here, and provisioning against it.
//!
//! [`container_definition`] is the Cosmos REST JSON of the container; `infra/cosmos-container.json`
//! and the Bicep carry the same content, and a test keeps them equal. [`container_properties`]
//! is that JSON read into the SDK's type, so the provisioned container cannot drift from it.
//!
//! A unique key policy cannot be changed after a container is created, and the guard depends
//! on it. So provisioning does not only create: it reads an existing container back and
//! refuses to run against one whose partition key, unique keys or default TTL differ.

use std::fmt;

use azure_data_cosmos::models::{
    ContainerProperties, PartitionKeyKind, PartitionKeyVersion, TimeToLive,
};
use azure_data_cosmos::CosmosClient;

use super::errors::describe;
use super::settings::{CosmosAuth, CosmosSettings};

/// The container name used by default and in `infra/cosmos-container.json`.
pub const DEFAULT_CONTAINER: &str = "payments";
/// The database name used by default.
pub const DEFAULT_DATABASE: &str = "payments";

pub const PARTITION_KEY_PATH: &str = "/claimId";
pub const UNIQUE_KEY_PATHS: [&str; 2] = ["/docType", "/dedupKey"];

/// The container's Cosmos REST definition under the name `name`.
///
/// - partition key `/claimId` (Hash, version 2): a claim's documents share one logical
///   partition, the scope of transactional batches and unique keys;
/// - `defaultTtl: -1`: TTL on without a default, so only documents with `ttl` (inbox) expire;
/// - unique key `(/docType, /dedupKey)`: one inbox per (consumer, message) and one payment
///   per purpose in each claim, whatever the documents' ids;
/// - indexing: everything except the stored payout request body (never queried, and the
///   largest field) and `_etag`.
pub fn container_definition(name: &str) -> serde_json::Value {
    serde_json::json!({
        "id": name,
        "partitionKey": { "paths": [PARTITION_KEY_PATH], "kind": "Hash", "version": 2 },
        "defaultTtl": -1,
        "uniqueKeyPolicy": { "uniqueKeys": [ { "paths": UNIQUE_KEY_PATHS } ] },
        "indexingPolicy": {
            "indexingMode": "consistent",
            "automatic": true,
            "includedPaths": [ { "path": "/*" } ],
            "excludedPaths": [ { "path": "/payoutRequest/?" }, { "path": "/\"_etag\"/?" } ]
        }
    })
}

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
    pub property: &'static str,
    pub expected: String,
    pub found: String,
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

/// What [`provision`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProvisionReport {
    pub database: String,
    pub container: String,
    pub database_created: bool,
    pub container_created: bool,
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
            "database {} {}; container {} {} and matches the definition",
            self.database,
            state(self.database_created),
            self.container,
            state(self.container_created)
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
    verify_existing(client, database, container).await?;
    Ok(ProvisionReport {
        database: database.to_owned(),
        container: container.to_owned(),
        database_created,
        container_created,
    })
}

/// Reads the container's properties and fails, naming every difference, if they do not
/// match the definition.
pub(crate) async fn verify_existing(
    client: &CosmosClient,
    database: &str,
    container: &str,
) -> anyhow::Result<()> {
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
    check_properties(database, container, &properties)
}

pub(crate) fn check_properties(
    database: &str,
    container: &str,
    found: &ContainerProperties,
) -> anyhow::Result<()> {
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
