//! Who is calling (`HTTP_AUTH`), what they may do, and whose Idempotency-Keys are whose.
//!
//! - `functionkey` (default; function keys, or nothing on a local run): a function key is
//!   a shared secret, so every holder is one trust domain. Any holder may pay and read
//!   every payment. The body's `tenantId` partitions keys as a **namespace** (the same key
//!   under two tenants is two requests), not as a security boundary: a holder can name
//!   any tenant. The `X-MS-CLIENT-PRINCIPAL*` headers are ignored: without the platform's
//!   authentication in front, anybody could send them.
//! - `appservice` (App Service Authentication, Entra ID): the platform signs the caller in,
//!   strips client-sent `X-MS-CLIENT-*` headers and sets `X-MS-CLIENT-PRINCIPAL`. The
//!   caller is that principal; its keys are its own; app roles say what it may do
//!   ([`PAY_ROLE`], [`READ_ROLE`]).

use axum::http::HeaderMap;
use base64::Engine;
use serde::Deserialize;

use super::answer::{Answer, Problem};
use crate::domain::ClaimApproved;

/// The app role that may `POST /api/payments`.
pub(crate) const PAY_ROLE: &str = "Payments.Pay";
/// The app role that may `GET /api/payments/{claimId}` of any payment. A payer without it
/// reads only the payments it created.
pub(crate) const READ_ROLE: &str = "Payments.Read";

/// The largest `X-MS-CLIENT-PRINCIPAL` accepted, base64 as sent. A principal with a few
/// hundred group claims stays well below it; anything larger is not decoded at all.
pub(crate) const MAX_PRINCIPAL_BYTES: usize = 64 * 1024;
/// The longest user id (an Entra object id is 36 characters, a Static Web Apps id 32).
const MAX_USER_ID_CHARS: usize = 128;

const OID_CLAIMS: [&str; 2] = [
    "http://schemas.microsoft.com/identity/claims/objectidentifier",
    "oid",
];
const TENANT_CLAIMS: [&str; 2] = [
    "tid",
    "http://schemas.microsoft.com/identity/claims/tenantid",
];

/// How callers are told apart (`HTTP_AUTH`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallerAuth {
    /// Function keys (or nothing, locally): one trust domain; keys namespaced by the
    /// body's `tenantId`.
    FunctionKey,
    /// App Service Authentication: a signed-in principal with app roles.
    AppService,
}

/// Whose Idempotency-Keys these are. Only hashes of it are stored: the key record's ids
/// and the tag in a payment's MessageId ([`super::key`]), so a scope string, once used,
/// must never change for the same caller, and two callers must never share one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Scope(String);

impl Scope {
    #[cfg(test)]
    pub(crate) fn new(s: impl Into<String>) -> Self {
        Scope(s.into())
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }

    /// A signed-in principal's scope: an injective encoding of who signed it in and who
    /// it is, so two principals never share a scope, whatever their ids contain.
    ///
    /// - An Entra principal of App Service Authentication (provider `aad`, tenant and
    ///   user both GUIDs): `aad:{tid}:{oid}`, as before this encoding, so its key
    ///   records and payments stay its own. A GUID has a fixed length and no `:`.
    /// - A Static Web Apps principal whose provider and user id are plain (letters,
    ///   digits, `-`, `.`, `_`; what the platform sends): `swa:{provider}:{userId}`, as
    ///   before. Neither part holds a `:`.
    /// - Every other one: `idp:{platform}:{provider}:{tenant}:{user}`, each part
    ///   percent-encoded ([`encode_part`]), so no part holds a `:` and the string
    ///   reads back as exactly one tuple. `idp:` is no other form's start (nor the key
    ///   holders' `tenant:`), so it can never equal one of them.
    fn of_principal(who: &Identity<'_>) -> Scope {
        match who.platform {
            Platform::AppService
                if who.provider == ENTRA_PROVIDER && is_guid(who.tenant) && is_guid(who.user) =>
            {
                Scope(format!("aad:{}:{}", who.tenant, who.user))
            }
            Platform::StaticWebApps
                if who.tenant.is_empty() && is_plain(who.provider) && is_plain(who.user) =>
            {
                Scope(format!("swa:{}:{}", who.provider, who.user))
            }
            platform => {
                let mut scope = format!("idp:{}", platform.as_str());
                for part in [who.provider, who.tenant, who.user] {
                    scope.push(':');
                    encode_part(&mut scope, part);
                }
                Scope(scope)
            }
        }
    }
}

/// The platform that signed a principal in (its header's shape says which).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Platform {
    AppService,
    StaticWebApps,
}

impl Platform {
    fn as_str(self) -> &'static str {
        match self {
            Platform::AppService => "appservice",
            Platform::StaticWebApps => "swa",
        }
    }
}

/// Who a principal is, as its platform names it: the identity provider (App Service's
/// `auth_typ`, Static Web Apps' `identityProvider`), the tenant (Entra's `tid`; empty
/// where there is none) and the user id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Identity<'a> {
    platform: Platform,
    provider: &'a str,
    tenant: &'a str,
    user: &'a str,
}

/// App Service Authentication's `auth_typ` for Entra ID.
const ENTRA_PROVIDER: &str = "aad";

/// A GUID in its 36-character hyphenated form (either case), the only form Entra
/// sends for `tid` and `oid`. Stricter than a UUID parser, which also takes
/// `urn:uuid:...` and braces.
fn is_guid(s: &str) -> bool {
    s.len() == 36
        && s.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_hexdigit(),
        })
}

/// Letters, digits, `-`, `.`, `_`, at least one: a part that needs no encoding.
fn is_plain(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
}

/// Percent-encodes `part` onto `out`: letters, digits, `-`, `.`, `_` and `~` stay (RFC
/// 3986 unreserved), every other UTF-8 byte, `%` and `:` included, becomes `%XX` in
/// upper case. One spelling per string, so the encoding is injective, and no encoded
/// part holds a `:`.
fn encode_part(out: &mut String, part: &str) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for byte in part.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(byte >> 4)]));
            out.push(char::from(HEX[usize::from(byte & 0x0f)]));
        }
    }
}

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Caller {
    /// A function-key holder (or a local caller): may do everything.
    KeyHolder,
    /// A principal signed in by App Service Authentication.
    Principal(Principal),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Principal {
    scope: Scope,
    may_pay: bool,
    may_read_all: bool,
}

/// What a caller asks to do, for [`Caller::authorize`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    Pay,
    Read,
}

impl Caller {
    /// The caller of a request, or the 401 that refuses it.
    pub(crate) fn authenticate(auth: CallerAuth, headers: &HeaderMap) -> Result<Caller, Answer> {
        match auth {
            CallerAuth::FunctionKey => Ok(Caller::KeyHolder),
            CallerAuth::AppService => principal_of(headers)
                .map(Caller::Principal)
                .map_err(|unknown| Problem::CallerUnknown.answer(unknown.to_string())),
        }
    }

    /// The 403 for a principal without the app role the action needs. A payer may ask
    /// to read: it then sees only its own payments ([`Caller::reads_only_own`]).
    pub(crate) fn authorize(&self, action: Action) -> Result<(), Answer> {
        let allowed = match (self, action) {
            (Caller::KeyHolder, _) => true,
            (Caller::Principal(p), Action::Pay) => p.may_pay,
            (Caller::Principal(p), Action::Read) => p.may_read_all || p.may_pay,
        };
        if allowed {
            return Ok(());
        }
        let needs = match action {
            Action::Pay => format!("paying needs the app role {PAY_ROLE}"),
            Action::Read => {
                format!(
                    "reading payments needs the app role {READ_ROLE} (or {PAY_ROLE}, for your own)"
                )
            }
        };
        Err(Problem::Forbidden.answer(needs))
    }

    /// Whether this caller sees only the payments it created.
    pub(crate) fn reads_only_own(&self) -> bool {
        matches!(self, Caller::Principal(p) if !p.may_read_all)
    }

    /// Whether a claim paid by someone else is hidden from this caller (409
    /// `claim-already-paid` instead of the payment). Key holders are one trust domain.
    pub(crate) fn is_principal(&self) -> bool {
        matches!(self, Caller::Principal(_))
    }

    /// Whose keys a request's key is: the principal's, or for key holders the body's
    /// tenant as a namespace.
    pub(crate) fn scope(&self, msg: &ClaimApproved) -> Scope {
        match self {
            Caller::KeyHolder => Scope(match &msg.tenant {
                Some(t) => format!("tenant:{}", t.as_str()),
                None => "tenant:".into(),
            }),
            Caller::Principal(p) => p.scope.clone(),
        }
    }

    /// The principal's own scope (`None` for key holders, whose scope depends on the body).
    pub(crate) fn principal_scope(&self) -> Option<&Scope> {
        match self {
            Caller::KeyHolder => None,
            Caller::Principal(p) => Some(&p.scope),
        }
    }
}

/// App Service Authentication's principal: `{auth_typ, name_typ, role_typ, claims}`.
#[derive(Deserialize)]
struct AppServicePrincipal {
    /// The identity provider (`aad` for Entra ID). The platform always sets it; absent,
    /// the principal is not taken for an Entra one.
    #[serde(default)]
    auth_typ: String,
    #[serde(default)]
    role_typ: Option<String>,
    claims: Vec<PrincipalClaim>,
}

#[derive(Deserialize)]
struct PrincipalClaim {
    typ: String,
    val: String,
}

/// Static Web Apps' principal: `{identityProvider, userId, userDetails, userRoles}`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct StaticWebAppsPrincipal {
    identity_provider: String,
    user_id: String,
    #[serde(default)]
    user_roles: Vec<String>,
}

/// Why a request carries no principal this service accepts: the detail of a 401
/// `caller-unknown`. Each names what is wrong, never what was sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum UnknownPrincipal {
    #[error(
        "X-MS-CLIENT-PRINCIPAL is missing: App Service Authentication must sign the caller in"
    )]
    Missing,
    #[error("{0} is sent more than once")]
    SentTwice(&'static str),
    #[error("{0} is not visible ASCII")]
    NotVisibleAscii(&'static str),
    #[error("X-MS-CLIENT-PRINCIPAL is larger than {MAX_PRINCIPAL_BYTES} bytes")]
    TooLarge,
    #[error("X-MS-CLIENT-PRINCIPAL is not base64 (RFC 4648, padded)")]
    NotBase64,
    #[error("X-MS-CLIENT-PRINCIPAL is not base64 of JSON")]
    NotJson,
    #[error("X-MS-CLIENT-PRINCIPAL is not an App Service principal ({{auth_typ, role_typ, claims: [{{typ, val}}]}})")]
    NotAppService,
    #[error("X-MS-CLIENT-PRINCIPAL is not a Static Web Apps principal ({{identityProvider, userId, userRoles: [...]}})")]
    NotStaticWebApps,
    #[error("X-MS-CLIENT-PRINCIPAL has neither claims (App Service) nor userId (Static Web Apps)")]
    UnknownShape,
    #[error("the principal has no object id (oid claim) and X-MS-CLIENT-PRINCIPAL-ID is missing")]
    NoObjectId,
    #[error("X-MS-CLIENT-PRINCIPAL-ID does not name the user of X-MS-CLIENT-PRINCIPAL")]
    IdMismatch,
    #[error("the principal's user id must be 1 to {MAX_USER_ID_CHARS} printable ASCII characters")]
    BadUserId,
}

/// Reads the principal the platform set.
fn principal_of(headers: &HeaderMap) -> Result<Principal, UnknownPrincipal> {
    let encoded = single(headers, "x-ms-client-principal")?.ok_or(UnknownPrincipal::Missing)?;
    let header_id = single(headers, "x-ms-client-principal-id")?;
    if encoded.len() > MAX_PRINCIPAL_BYTES {
        return Err(UnknownPrincipal::TooLarge);
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .map_err(|_| UnknownPrincipal::NotBase64)?;
    let json: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|_| UnknownPrincipal::NotJson)?;
    let is_object_with = |field: &str| json.get(field).is_some();
    let (scope, id_in_principal, roles) = if is_object_with("claims") {
        let p: AppServicePrincipal =
            serde_json::from_value(json).map_err(|_| UnknownPrincipal::NotAppService)?;
        let find = |types: &[&str]| {
            p.claims
                .iter()
                .find(|c| types.contains(&c.typ.as_str()))
                .map(|c| c.val.clone())
        };
        let oid = find(&OID_CLAIMS);
        let tid = find(&TENANT_CLAIMS).unwrap_or_default();
        let role_typ = p.role_typ.as_deref();
        let roles: Vec<String> = p
            .claims
            .iter()
            .filter(|c| c.typ == "roles" || Some(c.typ.as_str()) == role_typ)
            .map(|c| c.val.clone())
            .collect();
        let id = oid
            .clone()
            .or_else(|| header_id.map(str::to_owned))
            .ok_or(UnknownPrincipal::NoObjectId)?;
        let scope = Scope::of_principal(&Identity {
            platform: Platform::AppService,
            provider: &p.auth_typ,
            tenant: &tid,
            user: &id,
        });
        (scope, oid, roles)
    } else if is_object_with("userId") {
        let p: StaticWebAppsPrincipal =
            serde_json::from_value(json).map_err(|_| UnknownPrincipal::NotStaticWebApps)?;
        let scope = Scope::of_principal(&Identity {
            platform: Platform::StaticWebApps,
            provider: &p.identity_provider,
            tenant: "",
            user: &p.user_id,
        });
        (scope, Some(p.user_id), p.user_roles)
    } else {
        return Err(UnknownPrincipal::UnknownShape);
    };
    if let (Some(from_principal), Some(from_header)) = (&id_in_principal, header_id) {
        if from_principal != from_header {
            return Err(UnknownPrincipal::IdMismatch);
        }
    }
    let id = id_in_principal.as_deref().or(header_id).unwrap_or_default();
    if id.is_empty()
        || id.chars().count() > MAX_USER_ID_CHARS
        || !id.chars().all(|c| c.is_ascii_graphic())
    {
        return Err(UnknownPrincipal::BadUserId);
    }
    let has = |role: &str| roles.iter().any(|r| r == role);
    Ok(Principal {
        scope,
        may_pay: has(PAY_ROLE),
        may_read_all: has(READ_ROLE),
    })
}

/// A header sent at most once, as text. Two of them are refused: the platform sets
/// each principal header once, so a second one came from somewhere else.
fn single<'h>(
    headers: &'h HeaderMap,
    name: &'static str,
) -> Result<Option<&'h str>, UnknownPrincipal> {
    let mut values = headers.get_all(name).iter();
    let first = values.next();
    if values.next().is_some() {
        return Err(UnknownPrincipal::SentTwice(name));
    }
    match first {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .map(|s| Some(s.trim()).filter(|s| !s.is_empty()))
            .map_err(|_| UnknownPrincipal::NotVisibleAscii(name)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn b64(json: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(json)
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn app_service(oid: &str, roles: &[&str]) -> String {
        let mut claims = vec![
            serde_json::json!({"typ": "http://schemas.microsoft.com/identity/claims/objectidentifier", "val": oid}),
            serde_json::json!({"typ": "http://schemas.microsoft.com/identity/claims/tenantid", "val": "t-1"}),
        ];
        for r in roles {
            claims.push(serde_json::json!({"typ": "roles", "val": r}));
        }
        b64(&serde_json::json!({"auth_typ": "aad", "name_typ": "name", "role_typ": "http://schemas.microsoft.com/ws/2008/06/identity/claims/role", "claims": claims}).to_string())
    }

    fn caller(h: &HeaderMap) -> Result<Caller, u16> {
        Caller::authenticate(CallerAuth::AppService, h).map_err(|a| a.status)
    }

    #[test]
    fn an_app_service_principal_names_user_tenant_and_roles() {
        let h = headers(&[
            ("x-ms-client-principal", &app_service("oid-1", &[PAY_ROLE])),
            ("x-ms-client-principal-id", "oid-1"),
        ]);
        let c = caller(&h).unwrap();
        // Not GUIDs: not an Entra scope of the old form.
        assert_eq!(
            c.principal_scope().unwrap().as_str(),
            "idp:appservice:aad:t-1:oid-1"
        );
        assert!(c.authorize(Action::Pay).is_ok());
        assert!(c.reads_only_own());
        // Roles under the principal's own role_typ count as well.
        let p = b64(
            r#"{"auth_typ":"aad","role_typ":"r","claims":[{"typ":"oid","val":"o"},{"typ":"r","val":"Payments.Read"}]}"#,
        );
        let c = caller(&headers(&[("x-ms-client-principal", &p)])).unwrap();
        assert_eq!(c.authorize(Action::Pay).unwrap_err().status, 403);
        assert!(c.authorize(Action::Read).is_ok());
        assert!(!c.reads_only_own());
    }

    #[test]
    fn a_static_web_apps_principal_is_understood() {
        let p = b64(
            r#"{"identityProvider":"aad","userId":"u-1","userDetails":"x@y","userRoles":["anonymous","authenticated","Payments.Pay"]}"#,
        );
        let c = caller(&headers(&[("x-ms-client-principal", &p)])).unwrap();
        assert_eq!(c.principal_scope().unwrap().as_str(), "swa:aad:u-1");
        assert!(c.authorize(Action::Pay).is_ok());
    }

    /// The scope a principal of `who` gets, through the header as the platform sends it.
    fn scope_of(who: &Identity<'_>) -> String {
        let principal = match who.platform {
            Platform::AppService => serde_json::json!({
                "auth_typ": who.provider,
                "claims": [
                    {"typ": "oid", "val": who.user},
                    {"typ": "tid", "val": who.tenant},
                ],
            }),
            Platform::StaticWebApps => serde_json::json!({
                "identityProvider": who.provider,
                "userId": who.user,
                "userRoles": [],
            }),
        };
        let h = headers(&[("x-ms-client-principal", &b64(&principal.to_string()))]);
        caller(&h)
            .unwrap_or_else(|status| panic!("{who:?}: {status}"))
            .principal_scope()
            .unwrap()
            .as_str()
            .to_owned()
    }

    const TENANT: &str = "72f988bf-86f1-41af-91ab-2d7cd011db47";
    const OID: &str = "4d1c3b2a-9f8e-4d7c-8b6a-5f4e3d2c1b0a";

    fn app<'a>(provider: &'a str, tenant: &'a str, user: &'a str) -> Identity<'a> {
        Identity {
            platform: Platform::AppService,
            provider,
            tenant,
            user,
        }
    }

    fn swa(provider: &'static str, user: &'static str) -> Identity<'static> {
        Identity {
            platform: Platform::StaticWebApps,
            provider,
            tenant: "",
            user,
        }
    }

    /// The scopes key records and payments were stored under stay what they were for
    /// Entra principals (and plain Static Web Apps ones): a changed scope would make a
    /// stored key unknown to its caller, and its retry a second payment.
    #[test]
    fn existing_entra_and_static_web_apps_scopes_are_unchanged() {
        assert_eq!(
            scope_of(&app("aad", TENANT, OID)),
            format!("aad:{TENANT}:{OID}")
        );
        assert_eq!(
            scope_of(&swa("aad", "d1f5e2a3b4c5d6e7f8a9b0c1d2e3f4a5")),
            "swa:aad:d1f5e2a3b4c5d6e7f8a9b0c1d2e3f4a5"
        );
        assert_eq!(scope_of(&swa("github", "u-1")), "swa:github:u-1");
    }

    /// Principals that could share a scope (the provider left out, `:` not escaped) each
    /// have their own, and none takes an Entra principal's: a shared scope would let one
    /// caller replay another's answer.
    #[test]
    fn crafted_ids_and_other_providers_never_share_a_scope() {
        let pairs = [
            // Two App Service providers, one user id.
            (app("google", "", "123"), app("github", "", "123")),
            // A `:` moved between tenant and user.
            (app("aad", "t:a", "b"), app("aad", "t", "a:b")),
            // Another provider with an Entra principal's tenant and object id.
            (app("aad", TENANT, OID), app("oidc", TENANT, OID)),
            // A `:` moved between a Static Web Apps provider and user.
            (swa("aad:x", "u"), swa("aad", "x:u")),
            // An id that spells an encoded `:`.
            (app("aad", "t", "a%3Ab"), app("aad", "t", "a:b")),
            (swa("aad", "a%3Ab"), swa("aad", "a:b")),
            // An id that spells another form.
            (swa("idp", "appservice"), app("", "", "appservice")),
            // The same ids on two platforms.
            (app("aad", "", "u-1"), swa("aad", "u-1")),
        ];
        for (a, b) in pairs {
            assert_ne!(scope_of(&a), scope_of(&b), "{a:?} and {b:?}");
        }
        // An Entra-looking scope is only ever an Entra principal's.
        let both = format!("{TENANT}:{OID}");
        let crafted = app("aad", "", &both);
        assert!(!scope_of(&crafted).starts_with("aad:"), "{crafted:?}");
    }

    proptest::proptest! {
        /// Distinct principals (platform, provider, tenant, user) never get one scope. Parts are drawn from an alphabet made of separators, escape
        /// characters and GUIDs, so near-collisions are frequent.
        #[test]
        fn distinct_principals_never_share_a_scope(
            ids in proptest::collection::vec(
                (
                    proptest::bool::ANY,
                    "(aad|swa|idp|[a:%3A]{0,4})",
                    "([a:%3A-]{0,4}|72f988bf-86f1-41af-91ab-2d7cd011db47)",
                    "([a:%3A-]{1,4}|4d1c3b2a-9f8e-4d7c-8b6a-5f4e3d2c1b0a)",
                ),
                2..12,
            )
        ) {
            let mut seen: std::collections::HashMap<String, (bool, String, String, String)> =
                Default::default();
            for (on_app_service, provider, tenant, user) in ids {
                let tenant = if on_app_service { tenant } else { String::new() };
                let who = Identity {
                    platform: if on_app_service { Platform::AppService } else { Platform::StaticWebApps },
                    provider: &provider,
                    tenant: &tenant,
                    user: &user,
                };
                let id = (on_app_service, provider.clone(), tenant.clone(), user.clone());
                if let Some(other) = seen.insert(scope_of(&who), id.clone()) {
                    proptest::prop_assert_eq!(other, id);
                }
            }
        }
    }

    #[test]
    fn missing_malformed_or_disagreeing_principals_are_401_without_echo() {
        let no_role = app_service("oid-1", &[]);
        let cases: Vec<(HeaderMap, &str)> = vec![
            (headers(&[]), "missing"),
            (headers(&[("x-ms-client-principal-id", "oid-1")]), "missing"),
            (
                headers(&[("x-ms-client-principal", "not base64!")]),
                "base64",
            ),
            (
                headers(&[("x-ms-client-principal", &b64("[1,2]"))]),
                "neither",
            ),
            (
                headers(&[("x-ms-client-principal", &b64("{\"claims\":5}"))]),
                "App Service",
            ),
            (
                headers(&[(
                    "x-ms-client-principal",
                    &b64("{\"userId\":\"\",\"identityProvider\":\"aad\"}"),
                )]),
                "user id",
            ),
            (
                headers(&[
                    ("x-ms-client-principal", &no_role),
                    ("x-ms-client-principal-id", "oid-2"),
                ]),
                "does not name",
            ),
            (
                headers(&[
                    ("x-ms-client-principal", &no_role),
                    ("x-ms-client-principal", &no_role),
                ]),
                "more than once",
            ),
            (
                headers(&[(
                    "x-ms-client-principal",
                    &"A".repeat(MAX_PRINCIPAL_BYTES + 4),
                )]),
                "larger",
            ),
        ];
        for (h, why) in cases {
            let a = Caller::authenticate(CallerAuth::AppService, &h).unwrap_err();
            assert_eq!(a.status, 401, "{why}");
            assert!(
                a.body.contains("caller-unknown") && a.body.contains(why),
                "{why}: {}",
                a.body
            );
            assert!(
                !a.body.contains("eyJ") && !a.body.contains("AAAA"),
                "never echoed: {}",
                a.body
            );
        }
        // The principal without a role is known, but may do nothing.
        let c = caller(&headers(&[("x-ms-client-principal", &no_role)])).unwrap();
        assert_eq!(c.authorize(Action::Pay).unwrap_err().status, 403);
        assert_eq!(c.authorize(Action::Read).unwrap_err().status, 403);
    }

    #[test]
    fn function_key_holders_ignore_principal_headers() {
        let h = headers(&[("x-ms-client-principal", "forged")]);
        let c = Caller::authenticate(CallerAuth::FunctionKey, &h).unwrap();
        assert_eq!(c, Caller::KeyHolder);
        assert!(c.authorize(Action::Pay).is_ok() && !c.reads_only_own());
    }
}
