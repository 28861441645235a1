#!/usr/bin/env python3
"""What one parameter file deploys, and the landing-zone rules it must keep.

Reads infra/main.bicep and its local modules with pycep, takes the parameter
file's values, and decides for every module and resource whether it is deployed
(its `if (...)` condition evaluated from literals, parameters, variables and the
values main.bicep passes to the module). A resource id read from the
environment without a default (readEnvironmentVariable('X')) counts as given and
non-empty: the deployment cannot start without it.

usage: check_profile.py [--infra DIR] COMMAND PARAM_FILE
  deployed     print every deployed resource type (module/resource)
  landingzone  the file passes the platform team's network, DNS, workspace,
               monitor scope and action group, and the template deploys no
               virtual network, NSG, NAT gateway, public IP, private DNS zone,
               workspace, private link scope or action group of its own
  private      private monitoring (Application Insights ingestion and query
               private only, through a private link scope), diagnostic settings
               to the workspace for Cosmos DB, storage, the function app,
               Service Bus and Key Vault, signed-in callers (App Service
               Authentication, HTTP_AUTH=appservice, CORS without *)
  everywhere   the diagnostic settings and signed-in callers parts of `private`
               (every profile has them)
  store        the store the file's storeKind selects, and only that one, is
               deployed and wired: cosmos (the Cosmos DB account, its private
               endpoint, role and COSMOS_* settings; no PostgreSQL server) or
               postgres (the flexible server with Entra authentication only and
               password authentication off, its Entra administrator, the database
               created after it, TLS enforced, diagnostic settings, public access
               off with a private endpoint in privatelink.postgres.database.azure.com
               in the private profiles, zone-redundant high availability in
               production, the 5432 NSG rules, PAYMENTS_POSTGRES_* settings that
               name the server, the database and the identity; no Cosmos DB)
  nsg          every subnet the template creates has an NSG that denies
               inbound traffic from the internet and allows none of it
Exit code 1 with one line per finding. The diagnostic settings and app settings
checks follow the file's storeKind (cosmos when it sets none).
"""
import hashlib
import os
import pickle
import re
import sys
from pathlib import Path

from pycep import BicepParser
from pycep.transformer import BicepElement


class Unknown(Exception):
    pass


def parse(path):
    """pycep's parse of one file; with CHECK_PROFILE_CACHE set (scripts/check-infra.sh sets it to
    its temporary directory), kept there by the file's content, since each run of this script
    parses every module again and pycep takes seconds per file."""
    cache = os.environ.get("CHECK_PROFILE_CACHE")
    if not cache:
        return BicepParser().parse(file_path=path)
    text = Path(path).read_bytes()
    entry = Path(cache) / (hashlib.sha256(text).hexdigest() + ".pickle")
    if entry.exists():
        return pickle.loads(entry.read_bytes())
    parsed = BicepParser().parse(file_path=path)
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = entry.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_bytes(pickle.dumps(parsed))
    tmp.replace(entry)
    return parsed


class Given(str):
    """A string known only at deployment, but certainly not empty."""


GIVEN = Given("<given at deployment>")


def param_file_values(path):
    values = {}
    for name, raw in re.findall(r"^param\s+(\w+)\s*=\s*(.+?)\s*$", path.read_text(), re.M):
        raw = raw.strip()
        if raw in ("true", "false"):
            values[name] = raw == "true"
        elif re.fullmatch(r"-?\d+", raw):
            values[name] = int(raw)
        elif m := re.fullmatch(r"'((?:[^'\\]|\\.)*)'", raw):
            values[name] = m.group(1)
        elif m := re.fullmatch(r"readEnvironmentVariable\(\s*'([^']+)'\s*(?:,\s*'((?:[^'\\]|\\.)*)'\s*)?\)", raw):
            values[name] = m.group(2) if m.group(2) is not None else GIVEN
        else:
            sys.exit(f"{path}: cannot read the value of {name}: {raw}")
    return values


class Scope:
    """Evaluates expressions of one Bicep file with known parameter values."""

    def __init__(self, parsed, values):
        self.params = parsed.get("parameters", {})
        self.variables = parsed.get("variables", {})
        self.values, self.memo = values, {}

    def identifier(self, name):
        if name in self.values:
            if self.values[name] is Unknown:
                raise Unknown(name)
            return self.values[name]
        if name in self.params:
            default = self.params[name].get("default")
            if isinstance(default, (bool, int)) or (isinstance(default, str) and not isinstance(default, BicepElement) and "${" not in default):
                return default
            raise Unknown(name)
        if name in self.variables:
            if name not in self.memo:
                self.memo[name] = self.eval(self.variables[name]["value"])
            return self.memo[name]
        raise Unknown(name)

    def eval(self, node):
        if isinstance(node, (bool, int)) or node is None:
            return node
        if isinstance(node, BicepElement):
            return self.identifier(str(node))
        if isinstance(node, str):
            # An interpolated string with literal text around it is never empty.
            if "${" in node:
                try:
                    return re.sub(r"\$\{(\w+)\}", lambda m: str(self.identifier(m.group(1))), node)
                except Unknown:
                    if re.sub(r"\$\{[^}]*\}", "", node):
                        return GIVEN
                    raise
            return node
        if isinstance(node, list):
            return [self.eval(x) for x in node]
        if isinstance(node, dict) and "operator" in node:
            kind, args = node["operator"]["type"], node["operator"]["operands"]
            if kind == "conditional":
                return self.eval(args["true_value"] if self.eval(args["condition"]) else args["false_value"])
            if kind == "not":
                return not self.eval(args["bool_value"])
            if kind in ("equals", "not_equals"):
                a, b = self.eval(args["operand_1"]), self.eval(args["operand_2"])
                if isinstance(a, Given) or isinstance(b, Given):
                    raise Unknown("comparison with a value given at deployment")
                return (a == b) if kind == "equals" else (a != b)
            if kind == "and":
                return self.eval(args["operand_1"]) and self.eval(args["operand_2"])
            if kind == "or":
                return self.eval(args["operand_1"]) or self.eval(args["operand_2"])
            raise Unknown(kind)
        if isinstance(node, dict) and "function" in node and node["function"]["type"] == "empty":
            value = self.eval(node["function"]["parameters"]["item_to_test"])
            return False if isinstance(value, Given) else len(value) == 0
        raise Unknown(repr(node)[:80])


def dotted(node):
    """monitoring.outputs.workspaceId for pycep's nested property accessors; anything else as text."""
    if isinstance(node, dict) and node.get("operator", {}).get("type") == "property_accessor":
        ops = node["operator"]["operands"]
        return f"{dotted(ops['operand_1'])}.{dotted(ops['operand_2'])}"
    if isinstance(node, list):
        return "[" + ", ".join(dotted(x) for x in node) + "]"
    if isinstance(node, dict) and "operator" in node:
        return "(" + ", ".join(dotted(v) for v in node["operator"]["operands"].values()) + ")"
    return str(node)


def body(item):
    config = item["config"]
    return config.get("config", config) if ("condition" in config or "loop_type" in config) else config


def condition(item):
    return item["config"].get("condition") if isinstance(item["config"], dict) else None


class Deployment:
    def __init__(self, infra, param_file):
        self.infra = Path(infra)
        self.values = param_file_values(Path(param_file))
        self.main = parse(self.infra / "main.bicep")
        stray = sorted(set(self.values) - set(self.main["parameters"]))
        if stray:
            sys.exit(f"{param_file}: not parameters of main.bicep: {stray}")
        self.scope = Scope(self.main, self.values)
        self.modules = {}  # symbolic name -> (path, parsed, Scope, module params as evaluated)
        for name, mod in self.main.get("modules", {}).items():
            if mod.get("type") != "local":
                continue
            cond = condition(mod)
            if cond is not None and not self.decide(self.scope, cond, f"module {name}"):
                continue
            parsed = parse(self.infra / mod["detail"]["path"])
            passed = {}
            for p, node in body(mod).get("params", {}).items():
                try:
                    passed[p] = self.scope.eval(node)
                except Unknown:
                    passed[p] = Unknown
            self.modules[name] = (mod["detail"]["path"], parsed, Scope(parsed, passed), body(mod).get("params", {}))

    @staticmethod
    def decide(scope, cond, what):
        try:
            return bool(scope.eval(cond))
        except Unknown as exc:
            sys.exit(f"cannot decide whether {what} is deployed: {exc}")

    def resources(self):
        """(module name, resource name, resource, module Scope) of every deployed resource."""
        out = []
        for name, res in self.main.get("resources", {}).items():
            if not res.get("existing") and (condition(res) is None or self.decide(self.scope, condition(res), f"resource {name}")):
                out.append(("main", name, res, self.scope))
        for mname, (path, parsed, scope, _) in self.modules.items():
            for rname, res in parsed.get("resources", {}).items():
                if res.get("existing"):
                    continue
                cond = condition(res)
                if cond is None or self.decide(scope, cond, f"{path}: resource {rname}"):
                    out.append((mname, rname, res, scope))
        return out


FORBIDDEN_IN_LANDING_ZONE = {
    "Microsoft.Network/virtualNetworks": "virtual network",
    "Microsoft.Network/networkSecurityGroups": "network security group",
    "Microsoft.Network/natGateways": "NAT gateway",
    "Microsoft.Network/publicIPAddresses": "public IP",
    "Microsoft.Network/privateDnsZones": "private DNS zone",
    "Microsoft.Network/privateDnsZones/virtualNetworkLinks": "private DNS zone link",
    "Microsoft.OperationalInsights/workspaces": "Log Analytics workspace",
    "Microsoft.Insights/privateLinkScopes": "Azure Monitor private link scope",
    "Microsoft.Insights/actionGroups": "action group",
}
LANDING_ZONE_PARAMS = ("existingAppSubnetId", "existingPrivateEndpointSubnetId", "privateDnsZoneResourceGroupId",
                       "existingLogAnalyticsWorkspaceId", "existingPrivateLinkScopeId", "alertActionGroupId")


def cmd_deployed(d):
    for mname, rname, res, _ in d.resources():
        print(f"{res['type']:<60} {mname}/{rname}")
    return []


def cmd_landingzone(d):
    errors = []
    if d.values.get("networkProfile") != "private":
        errors.append("networkProfile must be 'private'")
    for p in LANDING_ZONE_PARAMS:
        if not d.values.get(p):
            errors.append(f"{p} must name the platform team's resource (a literal id or readEnvironmentVariable('NAME') without a default)")
    if d.values.get("natGateway") is not False:
        errors.append("natGateway must be false: egress goes through the hub")
    own = [(m, r, res["type"]) for m, r, res, _ in d.resources() if res["type"] in FORBIDDEN_IN_LANDING_ZONE]
    for m, r, t in own:
        errors.append(f"deploys its own {FORBIDDEN_IN_LANDING_ZONE[t]}: {m}/{r} ({t})")
    if not errors:
        print("deploys no " + ", ".join(sorted(set(FORBIDDEN_IN_LANDING_ZONE.values()))) + " of its own; "
              + ", ".join(LANDING_ZONE_PARAMS) + " passed in")
    return errors


def module_of(d, path):
    for name, (p, parsed, scope, raw) in d.modules.items():
        if p == path:
            return name, parsed, scope, raw
    return None


def check_monitoring(d):
    errors, by_type = [], deployed_by_type(d)
    mon = module_of(d, "modules/monitoring.bicep")
    if mon is None:
        return ["modules/monitoring.bicep is not deployed"]
    _, parsed, scope, _ = mon
    for m, r, res, sc in by_type.get("Microsoft.Insights/components", []):
        props = body(res)["properties"]
        for key in ("publicNetworkAccessForIngestion", "publicNetworkAccessForQuery"):
            try:
                value = sc.eval(props.get(key))
            except Unknown:
                value = None
            if value != "Disabled":
                errors.append(f"Application Insights {m}/{r}: {key} is {value!r}, must be 'Disabled' (ingestion and query through the private link scope)")
    scopes = by_type.get("Microsoft.Insights/privateLinkScopes", [])
    linked = module_of(d, "modules/monitor-scope-link.bicep")
    if scopes:
        for m, r, res, sc in scopes:
            modes = body(res)["properties"].get("accessModeSettings", {})
            if modes.get("ingestionAccessMode") != "PrivateOnly" or modes.get("queryAccessMode") != "PrivateOnly":
                errors.append(f"{m}/{r}: the private link scope must be PrivateOnly for ingestion and query, is {modes}")
        endpoints = [res for m, r, res, sc in by_type.get("Microsoft.Network/privateEndpoints", [])
                     if "azuremonitor" in str(body(res)["properties"])]
        if not endpoints:
            errors.append("the private link scope has no private endpoint (group azuremonitor)")
    elif linked is None:
        errors.append("no Azure Monitor private link scope: neither one is created (monitor-private-link.bicep) "
                      "nor Application Insights added to an existing one (existingPrivateLinkScopeId)")
    for path in ("modules/monitor-private-link.bicep", "modules/monitor-scope-link.bicep"):
        found = module_of(d, path)
        if found and "monitoring.outputs.appInsightsId" not in dotted(found[3].get("scopedResourceIds")):
            errors.append(f"{path}: Application Insights is not among the scoped resources")

    return errors


def deployed_by_type(d):
    by_type = {}
    for m, r, res, scope in d.resources():
        by_type.setdefault(res["type"], []).append((m, r, res, scope))
    return by_type


def store_kind(d):
    kind = d.values.get("storeKind", d.main["parameters"]["storeKind"].get("default"))
    if kind not in ("cosmos", "postgres"):
        sys.exit(f"storeKind {kind!r}: expected cosmos or postgres")
    return kind


def check_diagnostics(d):
    errors, by_type = [], deployed_by_type(d)
    store = {"cosmos": ("modules/cosmos.bicep", ["account"]), "postgres": ("modules/postgres.bicep", ["server"])}[store_kind(d)]
    wanted = {
        store[0]: store[1],
        "modules/storage.bicep": ["storage", "blobService", "queueService", "tableService"],
        "modules/functionapp.bicep": ["site"],
        "modules/servicebus.bicep": ["namespace"],
        "modules/keyvault.bicep": ["vault"],
    }
    for path, targets in wanted.items():
        found = module_of(d, path)
        if found is None:
            errors.append(f"{path} is not deployed")
            continue
        name, parsed, scope, raw = found
        if dotted(raw.get("workspaceId")) != "monitoring.outputs.workspaceId":
            errors.append(f"{path}: workspaceId must be monitoring.outputs.workspaceId, is {dotted(raw.get('workspaceId'))}")
        covered = set()
        for m, r, res, sc in by_type.get("Microsoft.Insights/diagnosticSettings", []):
            if m != name:
                continue
            b = body(res)
            props = b.get("properties", {})
            if str(props.get("workspaceId")) != "workspaceId":
                continue
            enabled = [x for x in props.get("logs", []) + props.get("metrics", []) if x.get("enabled") is True]
            if enabled:
                covered.add(str(b.get("scope")))
        for t in targets:
            if t not in covered:
                errors.append(f"{path}: no diagnostic setting sends {t}'s logs or metrics to the workspace")

    return errors


def check_callers(d):
    errors, by_type = [], deployed_by_type(d)
    fa = module_of(d, "modules/functionapp.bicep")
    if fa:
        name, parsed, scope, raw = fa
        try:
            http_auth = scope.eval(BicepElement("httpAuth"))
        except Unknown:
            http_auth = None
        if http_auth != "appservice":
            errors.append(f"functionapp: httpAuth (HTTP_AUTH) must be 'appservice', is {http_auth!r}")
        auths = [(res, sc) for m, r, res, sc in by_type.get("Microsoft.Web/sites/config", []) if m == name and body(res).get("name") == "authsettingsV2"]
        if not auths:
            errors.append("functionapp: no App Service Authentication (Microsoft.Web/sites/config authsettingsV2) is deployed")
        for res, sc in auths:
            props = body(res)["properties"]
            gv = props.get("globalValidation", {})
            if props.get("platform", {}).get("enabled") is not True or gv.get("requireAuthentication") is not True \
                    or gv.get("unauthenticatedClientAction") != "Return401":
                errors.append("functionapp: authsettingsV2 must be enabled, require authentication and answer 401")
            aad = props.get("identityProviders", {}).get("azureActiveDirectory", {})
            if aad.get("enabled") is not True or str(aad.get("registration", {}).get("clientId")) != "apiClientId":
                errors.append("functionapp: the Entra ID provider must be enabled for the API registration (apiClientId)")
        try:
            settings = app_settings(parsed, scope)
        except Unknown as exc:
            return errors + [f"functionapp: cannot tell which app settings are deployed: {exc}"]
        cors = raw.get("corsAllowedOrigins")
        if "'*'" in str(cors) or "\"*\"" in str(cors) or cors == "*":
            errors.append(f"functionapp: CORS must list the web client's origin, never *: {cors}")
        if not any(s["name"] == "HTTP_AUTH" and str(s["value"]) == "httpAuth" for s in settings):
            errors.append("functionapp: the HTTP_AUTH app setting must be httpAuth")
    for fj in sorted(Path(d.infra.parent / "function-app").glob("*/function.json")):
        import json
        for b in json.loads(fj.read_text())["bindings"]:
            if b.get("type") == "httpTrigger" and b.get("authLevel") not in ("anonymous",):
                errors.append(f"{fj}: authLevel {b.get('authLevel')!r}: behind App Service Authentication the browser client "
                              "must not need a function key (anonymous at the host, the caller checked by Entra ID and the handler)")
    return errors


def cmd_private(d):
    errors = check_monitoring(d) + check_diagnostics(d) + check_callers(d)
    if not errors:
        print("Application Insights ingestion/query private only, through a private link scope; " + EVERYWHERE)
    return errors


EVERYWHERE = ("diagnostic settings for the store (Cosmos DB or PostgreSQL), storage (account, blob, queue, table), function app, Service Bus, Key Vault; "
              "App Service Authentication with Entra ID, HTTP_AUTH=appservice, anonymous at the host, no CORS wildcard")


def cmd_everywhere(d):
    errors = check_diagnostics(d) + check_callers(d)
    if not errors:
        print(EVERYWHERE)
    return errors


def app_settings(parsed, scope):
    """The site's app settings as deployed: the list, or concat() of variables with the
    store's list chosen by its condition (functionapp.bicep)."""
    def resolve(node):
        if isinstance(node, list):
            return node
        if isinstance(node, str) and str(node) in parsed.get("variables", {}):
            return resolve(parsed["variables"][str(node)]["value"])
        if isinstance(node, dict) and node.get("function", {}).get("type") == "concat":
            out = []
            for arg in node["function"]["parameters"].values():
                out += resolve(arg)
            return out
        if isinstance(node, dict) and node.get("operator", {}).get("type") == "conditional":
            ops = node["operator"]["operands"]
            return resolve(ops["true_value"] if scope.eval(ops["condition"]) else ops["false_value"])
        raise Unknown(f"app settings: {repr(node)[:120]}")
    return resolve(body(parsed["resources"]["site"])["properties"]["siteConfig"]["appSettings"])


def value_of(scope, node):
    try:
        return scope.eval(node)
    except Unknown:
        return None


POSTGRES_URL = re.compile(r"postgresql://\$\{postgresUser\}@\$\{postgresHost\}:5432/\$\{postgresDatabaseName\}\?sslmode=(require|verify-ca|verify-full)")


def cmd_store(d):
    errors, by_type = [], deployed_by_type(d)
    kind = store_kind(d)
    private = d.values.get("networkProfile") == "private"
    deployed_types = {res["type"] for m, r, res, sc in d.resources()}
    cosmos_types = sorted(t for t in deployed_types if t.startswith("Microsoft.DocumentDB/"))
    pg_types = sorted(t for t in deployed_types if t.startswith("Microsoft.DBforPostgreSQL/"))
    fa = module_of(d, "modules/functionapp.bicep")
    if fa is None:
        return ["modules/functionapp.bicep is not deployed"]
    fa_name, fa_parsed, fa_scope, fa_raw = fa
    try:
        settings = {s["name"]: s["value"] for s in app_settings(fa_parsed, fa_scope)}
    except Unknown as exc:
        return [f"functionapp: cannot tell which app settings are deployed: {exc}"]
    if str(settings.get("PAYMENTS_STORE")) != kind:
        errors.append(f"functionapp: PAYMENTS_STORE is {settings.get('PAYMENTS_STORE')!r}, the file's storeKind is {kind!r}")
    endpoints = [(m, r, res, sc) for m, r, res, sc in by_type.get("Microsoft.Network/privateEndpoints", [])]

    def endpoint_for(group):
        found = []
        for m, r, res, sc in endpoints:
            links = body(res)["properties"].get("privateLinkServiceConnections", [])
            groups = [value_of(sc, g) for link in links for g in link.get("properties", {}).get("groupIds", [])]
            if group in groups:
                found.append((m, sc))
        return found

    if kind == "cosmos":
        if pg_types:
            errors.append(f"storeKind cosmos deploys PostgreSQL resources: {pg_types}")
        if "Microsoft.DocumentDB/databaseAccounts" not in deployed_types:
            errors.append("storeKind cosmos: no Cosmos DB account is deployed")
        if "Microsoft.DocumentDB/databaseAccounts/sqlRoleAssignments" not in deployed_types:
            errors.append("storeKind cosmos: the identity has no Cosmos DB data role")
        for name in ("COSMOS_ENDPOINT", "COSMOS_DATABASE", "COSMOS_CONTAINER", "COSMOS_MANAGED_IDENTITY_CLIENT_ID"):
            if name not in settings:
                errors.append(f"storeKind cosmos: app setting {name} is missing")
        stray = sorted(n for n in settings if n.startswith("PAYMENTS_POSTGRES_"))
        if stray:
            errors.append(f"storeKind cosmos: PostgreSQL app settings deployed: {stray}")
        if private and not endpoint_for("Sql"):
            errors.append("storeKind cosmos, private profile: no private endpoint (Sql) for Cosmos DB")
        if not errors:
            print("storeKind cosmos: Cosmos DB account, data role, COSMOS_* settings" + (", private endpoint" if private else "")
                  + "; no PostgreSQL server, no PAYMENTS_POSTGRES_* setting")
        return errors

    # postgres
    if cosmos_types:
        errors.append(f"storeKind postgres deploys Cosmos DB resources: {cosmos_types}")
    stray = sorted(n for n in settings if n.startswith("COSMOS_"))
    if stray:
        errors.append(f"storeKind postgres: Cosmos DB app settings deployed: {stray}")
    pg = module_of(d, "modules/postgres.bicep")
    if pg is None:
        return errors + ["storeKind postgres: modules/postgres.bicep is not deployed"]
    pg_name, pg_parsed, pg_scope, pg_raw = pg
    servers = [(res, sc) for m, r, res, sc in by_type.get("Microsoft.DBforPostgreSQL/flexibleServers", []) if m == pg_name]
    if len(servers) != 1:
        return errors + [f"storeKind postgres: expected one flexible server, found {len(servers)}"]
    server, sc = servers[0]
    props = body(server)["properties"]
    auth = props.get("authConfig", {})
    if value_of(sc, auth.get("activeDirectoryAuth")) != "Enabled":
        errors.append(f"postgres: authConfig.activeDirectoryAuth must be 'Enabled', is {auth.get('activeDirectoryAuth')!r}")
    if value_of(sc, auth.get("passwordAuth")) != "Disabled":
        errors.append(f"postgres: password authentication must be off (authConfig.passwordAuth 'Disabled'), is {auth.get('passwordAuth')!r}")
    for key in ("administratorLogin", "administratorLoginPassword"):
        if key in props:
            errors.append(f"postgres: {key} is set; the server has no password login")
    access = value_of(sc, props.get("network", {}).get("publicNetworkAccess"))
    if private and access != "Disabled":
        errors.append(f"postgres, private profile: network.publicNetworkAccess must be 'Disabled', is {access!r}")
    if not private and access != "Enabled":
        errors.append(f"postgres, public profile: network.publicNetworkAccess is {access!r}; the public profile has no private endpoint")
    ha = value_of(sc, props.get("highAvailability", {}).get("mode"))
    if private and ha != "ZoneRedundant":
        errors.append(f"postgres, production (private profile): highAvailability.mode must be 'ZoneRedundant', is {ha!r}")
    if ha in ("ZoneRedundant", "SameZone") and value_of(sc, body(server).get("sku", {}).get("tier")) == "Burstable":
        errors.append("postgres: high availability is not offered on the Burstable tier")
    admins = [(res, s) for m, r, res, s in by_type.get("Microsoft.DBforPostgreSQL/flexibleServers/administrators", []) if m == pg_name]
    if len(admins) != 1:
        errors.append(f"postgres: expected one Entra administrator, found {len(admins)}")
    else:
        if dotted(pg_raw.get("administratorObjectId")) != "postgresAdminObjectId" or str(body(admins[0][0]).get("name")) != "administratorObjectId":
            errors.append("postgres: the Entra administrator must be named by its object id from postgresAdminObjectId")
        given = d.values.get("postgresAdminObjectId")
        if given and not isinstance(given, Given) and not re.fullmatch(r"[0-9a-fA-F-]{36}", str(given)):
            errors.append(f"postgresAdminObjectId {given!r} is not an object id (GUID)")
    databases = [res for m, r, res, s in by_type.get("Microsoft.DBforPostgreSQL/flexibleServers/databases", []) if m == pg_name]
    if len(databases) != 1:
        errors.append(f"postgres: expected one database, found {len(databases)}")
    elif "administrator" not in [str(x) for x in body(databases[0]).get("dependsOn", [])]:
        errors.append("postgres: the database must be created after the Entra administrator (dependsOn administrator), "
                      "or it belongs to azuresu and nobody can grant on it")
    configs = {value_of(s, body(res).get("name")): value_of(s, body(res)["properties"].get("value"))
               for m, r, res, s in by_type.get("Microsoft.DBforPostgreSQL/flexibleServers/configurations", []) if m == pg_name}
    if str(configs.get("require_secure_transport", "")).lower() != "on":
        errors.append(f"postgres: require_secure_transport must be set 'on', is {configs.get('require_secure_transport')!r}")
    if configs.get("ssl_min_protocol_version") not in ("TLSv1.2", "TLSv1.3"):
        errors.append(f"postgres: ssl_min_protocol_version must be TLSv1.2 or TLSv1.3, is {configs.get('ssl_min_protocol_version')!r}")
    rules = [r for m, r, res, s in by_type.get("Microsoft.DBforPostgreSQL/flexibleServers/firewallRules", []) if m == pg_name]
    if private and rules:
        errors.append(f"postgres, private profile: firewall rules deployed: {rules}")
    if private:
        found = [(m, s) for m, s in endpoint_for("postgresqlServer")]
        if not found:
            errors.append("postgres, private profile: no private endpoint (postgresqlServer) for the server")
        for m, s in found:
            raw = d.modules[m][3]
            if dotted(raw.get("targetResourceId")) != "(usePostgres, postgres.outputs.serverId, )":
                errors.append(f"{m}: the private endpoint must target postgres.outputs.serverId, targets {dotted(raw.get('targetResourceId'))}")
            if value_of(s, BicepElement("privateDnsZoneName")) != "privatelink.postgres.database.azure.com":
                errors.append(f"{m}: private DNS zone must be privatelink.postgres.database.azure.com")
    # The app: Entra login as its identity, TLS verified, the server and database of this deployment.
    url = str(settings.get("PAYMENTS_POSTGRES_URL", ""))
    if not POSTGRES_URL.fullmatch(url):
        errors.append(f"functionapp: PAYMENTS_POSTGRES_URL must be postgresql://${{postgresUser}}@${{postgresHost}}:5432/${{postgresDatabaseName}}"
                      f"?sslmode=verify-full (or require), is {url!r}")
    wiring = {"postgresHost": "(usePostgres, postgres.outputs.fqdn, )",
              "postgresDatabaseName": "(usePostgres, postgres.outputs.databaseName, )",
              "postgresUser": "identity.outputs.name", "identityClientId": "identity.outputs.clientId"}
    for param, expected in wiring.items():
        if dotted(fa_raw.get(param)) != expected:
            errors.append(f"functionapp: {param} must be {expected}, is {dotted(fa_raw.get(param))}")
    if str(settings.get("PAYMENTS_POSTGRES_AUTH")) != "entra":
        errors.append(f"functionapp: PAYMENTS_POSTGRES_AUTH must be 'entra' (password authentication is off), is {settings.get('PAYMENTS_POSTGRES_AUTH')!r}")
    if str(settings.get("PAYMENTS_POSTGRES_MANAGED_IDENTITY_CLIENT_ID")) != "identityClientId":
        errors.append("functionapp: PAYMENTS_POSTGRES_MANAGED_IDENTITY_CLIENT_ID must be the identity's client id (identityClientId)")
    # Own network: 5432 from the app (and the tools subnet) to the private endpoints.
    if private and "network" in d.modules:
        rules = {}
        for m, r, res, s in by_type.get("Microsoft.Network/networkSecurityGroups", []):
            for x in body(res)["properties"].get("securityRules", []):
                rp = x["properties"]
                if rp.get("access") == "Allow" and str(rp.get("destinationPortRange")) == "5432":
                    rules[(r, rp.get("direction"))] = str(rp.get("sourceAddressPrefix"))
        for nsg, direction in (("appNsg", "Outbound"), ("peNsg", "Inbound")):
            if (nsg, direction) not in rules:
                errors.append(f"network: {nsg} has no {direction} rule allowing 5432 (the app to PostgreSQL's private endpoint)")
    if not errors:
        print(f"storeKind postgres: Entra-only server (password auth off), Entra administrator, database after it, "
              f"require_secure_transport on, TLS >= 1.2, diagnostic settings; "
              + ("public access off, private endpoint in privatelink.postgres.database.azure.com, zone-redundant HA; "
                 if private else "public endpoint behind the firewall; ")
              + "PAYMENTS_POSTGRES_URL names the server, database and identity (sslmode verified), Entra login; no Cosmos DB")
    return errors


def cmd_nsg(d):
    errors = []
    deployed = d.resources()
    nsgs = {(m, r): (res, sc) for m, r, res, sc in deployed if res["type"] == "Microsoft.Network/networkSecurityGroups"}
    vnets = [(m, r, res, sc) for m, r, res, sc in deployed if res["type"] == "Microsoft.Network/virtualNetworks"]
    if not vnets:
        print("this parameter file creates no virtual network (subnets and their NSGs are the platform team's)")
        return []
    subnet_count = 0
    for m, r, res, sc in vnets:
        for subnet in body(res)["properties"].get("subnets", []):
            subnet_count += 1
            name = subnet.get("name")
            props = subnet.get("properties", {})
            ref = props.get("networkSecurityGroup")
            if not ref:
                errors.append(f"{m}/{r}: subnet {name} has no network security group")
                continue
            m_ref = re.fullmatch(r"(\w+)", str(ref.get("id", {}).get("operator", {}).get("operands", {}).get("operand_1", "")))
            target = nsgs.get((m, m_ref.group(1))) if m_ref else None
            if target is None:
                errors.append(f"{m}/{r}: subnet {name}: its NSG is not a deployed NSG of the same file ({ref})")
                continue
            nsg, nsg_scope = target
            rules = [x["properties"] for x in body(nsg)["properties"].get("securityRules", [])]
            inbound = [x for x in rules if x.get("direction") == "Inbound"]
            open_from_internet = [x for x in inbound if x.get("access") == "Allow"
                                  and str(x.get("sourceAddressPrefix")) in ("*", "Internet", "0.0.0.0/0", "Any")]
            if open_from_internet:
                errors.append(f"{m}/{r}: subnet {name}: inbound allowed from the internet: {open_from_internet}")
            if not any(x.get("access") == "Deny" and str(x.get("sourceAddressPrefix")) in ("Internet", "*")
                       and str(x.get("destinationPortRange")) == "*" for x in inbound):
                errors.append(f"{m}/{r}: subnet {name}: its NSG has no rule denying inbound traffic from the internet")
            if any(x.get("access") == "Allow" and str(x.get("destinationPortRange")) == "*" for x in rules):
                errors.append(f"{m}/{r}: subnet {name}: a rule allows every port; allow only the ports the traffic needs")
            if "privateEndpointNetworkPolicies" in props and props["privateEndpointNetworkPolicies"] not in ("Enabled", "NetworkSecurityGroupEnabled"):
                errors.append(f"{m}/{r}: subnet {name}: privateEndpointNetworkPolicies {props['privateEndpointNetworkPolicies']!r} "
                              "leaves the private endpoints outside the NSG")
    if not errors:
        print(f"{subnet_count} subnets, each with an NSG that denies inbound from the internet and allows only named ports")
    return errors


OPERATOR_ROLES = {
    "4f6d3b9b-027b-4f4c-9142-0e5a2a2247e0": "Azure Service Bus Data Receiver",
    "69a216fc-b8fb-44d8-bc22-1f3c2cd27a39": "Azure Service Bus Data Sender",
}


def cmd_operators(d):
    """The operators' group gets Data Receiver and Data Sender on the queue (dead-letters)."""
    errors = []
    if not d.values.get("operatorsGroupObjectId"):
        errors.append("operatorsGroupObjectId must be set (a literal object id or readEnvironmentVariable('OPERATORS_GROUP_OBJECT_ID') without a default)")
    rbac = module_of(d, "modules/rbac.bicep")
    if rbac is None:
        return errors + ["modules/rbac.bicep is not deployed"]
    name, parsed, scope, raw = rbac
    if str(raw.get("operatorsGroupObjectId")) != "operatorsGroupObjectId":
        errors.append(f"module {name}: operatorsGroupObjectId is not main.bicep's parameter of that name")
    granted = {}
    for m, r, res, sc in d.resources():
        if m != name or res["type"] != "Microsoft.Authorization/roleAssignments":
            continue
        props = body(res)["properties"]
        if str(props.get("principalId")) != "operatorsGroupObjectId":
            continue
        role = dotted(props.get("roleDefinitionId"))
        found = next((rid for rid in OPERATOR_ROLES if rid in role or any(
            str(v) in role and parsed.get("variables", {}).get(str(v), {}).get("value") == rid
            for v in parsed.get("variables", {}))), None)
        try:
            ptype = sc.eval(props.get("principalType"))
        except Unknown:
            ptype = None
        if ptype != "Group":
            errors.append(f"{name}/{r}: principalType is {ptype!r}, must be 'Group'")
        if str(body(res).get("scope")) != "queue":
            errors.append(f"{name}/{r}: scope is {body(res).get('scope')!s}, must be the queue")
        if found:
            granted[found] = r
    for rid, role in OPERATOR_ROLES.items():
        if rid not in granted:
            errors.append(f"the operators' group has no {role} ({rid}) on the queue")
    if not errors:
        print("operators' group: " + ", ".join(f"{OPERATOR_ROLES[k]} ({v})" for k, v in sorted(granted.items())) + " on the queue")
    return errors


def main():
    args = sys.argv[1:]
    infra = "infra"
    if args[:1] == ["--infra"]:
        infra, args = args[1], args[2:]
    if len(args) != 2 or args[0] not in ("deployed", "landingzone", "private", "everywhere", "nsg", "store", "operators"):
        sys.exit(__doc__)
    d = Deployment(infra, args[1])
    errors = globals()[f"cmd_{args[0]}"](d)
    if errors:
        sys.exit("\n".join(f"{args[1]}: {e}" for e in errors))


if __name__ == "__main__":
    main()
