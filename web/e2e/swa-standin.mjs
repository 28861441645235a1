// A local stand-in for Azure Static Web Apps in front of `serve`: it serves the built
// page, signs users in, and forwards /api/* with the signed-in user's principal, the
// way the platform does for a linked backend. Used by the signed-in browser test
// (e2e/signed-in.e2e.mjs); also runnable by hand:
//
//   node e2e/swa-standin.mjs --api http://127.0.0.1:3000 --port 4280
//
// Why not the Static Web Apps CLI (`swa start --api-devserver-url`)? Its npm package
// (@azure/static-web-apps-cli 2.0.10) depends on keytar, whose install step downloads a
// prebuilt binary from GitHub or else compiles against libsecret; neither works on a
// machine that reaches only the package registries, so `npm ci` would fail. This file
// implements the part of it the test needs, with the platform's contract:
//
//   GET  /.auth/login/aad[?post_login_redirect_uri=/x]   sign-in form (user id, name, roles),
//        like the CLI's emulator; POST /.auth/login/aad/callback sets the session cookie
//   GET  /.auth/me        {"clientPrincipal": {...}} or {"clientPrincipal": null}
//   GET  /.auth/logout    ends the session
//   /api/*                forwarded to --api; any X-MS-CLIENT-PRINCIPAL* header the client
//                         sent is removed, and for a signed-in user X-MS-CLIENT-PRINCIPAL
//                         (base64 JSON {identityProvider, userId, userDetails, userRoles})
//                         and X-MS-CLIENT-PRINCIPAL-ID/-NAME/-IDP are added
//   routes                the `routes` of web/public/staticwebapp.config.json with `allowedRoles`
//                         are enforced (401 without a session, 403 without the role), as
//                         the platform enforces them before the backend sees the request
//   everything else       the built page, index.html as navigation fallback
//
// userRoles always holds `anonymous` and `authenticated`, plus the roles typed at sign-in
// (on Azure: the Static Web Apps role assignments, docs/deploy.md "Signed-in callers").
// The session cookie is the principal in base64 (the platform's is encrypted): a
// development stand-in, never a production server.
import { createReadStream, existsSync, readFileSync, statSync } from 'node:fs';
import http from 'node:http';
import { dirname, extname, join, normalize, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const WEB = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const COOKIE = 'StaticWebAppsAuthCookie';
const HOP_BY_HOP = ['connection', 'keep-alive', 'proxy-connection', 'transfer-encoding', 'upgrade', 'te', 'trailer'];
const TYPES = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.ico': 'image/x-icon',
  '.json': 'application/json',
  '.svg': 'image/svg+xml',
  '.png': 'image/png',
};

function readCookie(req) {
  const raw = (req.headers.cookie ?? '').split(';').map((c) => c.trim()).find((c) => c.startsWith(`${COOKIE}=`));
  if (!raw) return null;
  try {
    const p = JSON.parse(Buffer.from(decodeURIComponent(raw.slice(COOKIE.length + 1)), 'base64').toString('utf8'));
    return p && typeof p.userId === 'string' ? p : null;
  } catch {
    return null;
  }
}

function escapeHtml(s) {
  return String(s).replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c]);
}

/** Only same-site paths as redirect targets (no open redirect). */
function localPath(p) {
  return typeof p === 'string' && p.startsWith('/') && !p.startsWith('//') ? p : '/';
}

function loginForm(redirect) {
  return `<!doctype html><html><head><meta charset="utf-8"><title>Sign in (local stand-in)</title></head>
<body><h1>Sign in with Microsoft Entra ID (local stand-in)</h1>
<form method="post" action="/.auth/login/aad/callback">
<input type="hidden" name="redirect" value="${escapeHtml(redirect)}">
<label>User id <input name="userId" data-testid="login-user-id" required></label>
<label>User name <input name="userDetails" data-testid="login-user-details" required></label>
<label>Roles (comma separated) <input name="roles" data-testid="login-roles"></label>
<button type="submit" data-testid="login-submit">Sign in</button>
</form></body></html>`;
}

function loadRoutes(configPath) {
  if (!existsSync(configPath)) return [];
  const config = JSON.parse(readFileSync(configPath, 'utf8'));
  return (config.routes ?? []).filter((r) => Array.isArray(r.allowedRoles) && r.route);
}

function routeMatches(pattern, path) {
  return pattern.endsWith('*') ? path.startsWith(pattern.slice(0, -1)) : path === pattern;
}

export function startSwaStandin({ apiUrl, dist = join(WEB, 'dist', 'claims-payments-web', 'browser'), port = 0,
  config = join(WEB, 'public', 'staticwebapp.config.json') }) {
  const target = new URL(apiUrl);
  const routes = loadRoutes(config);

  function body(req) {
    return new Promise((res, rej) => {
      let data = '';
      req.on('data', (d) => {
        data += d;
        if (data.length > 64 * 1024) req.destroy();
      });
      req.on('end', () => res(data));
      req.on('error', rej);
    });
  }

  async function handleAuth(req, res, url) {
    if (url.pathname === '/.auth/login/aad' && req.method === 'GET') {
      res.writeHead(200, { 'Content-Type': 'text/html; charset=utf-8', 'Cache-Control': 'no-store' });
      return res.end(loginForm(localPath(url.searchParams.get('post_login_redirect_uri'))));
    }
    if (url.pathname === '/.auth/login/aad/callback' && req.method === 'POST') {
      const form = new URLSearchParams(await body(req));
      const userId = (form.get('userId') ?? '').trim();
      const userDetails = (form.get('userDetails') ?? '').trim();
      if (!userId || !userDetails) {
        res.writeHead(400, { 'Content-Type': 'text/plain' });
        return res.end('user id and user name are required');
      }
      const roles = (form.get('roles') ?? '').split(',').map((r) => r.trim()).filter(Boolean);
      const principal = {
        identityProvider: 'aad',
        userId,
        userDetails,
        userRoles: ['anonymous', 'authenticated', ...roles.filter((r) => r !== 'anonymous' && r !== 'authenticated')],
      };
      const value = encodeURIComponent(Buffer.from(JSON.stringify(principal)).toString('base64'));
      res.writeHead(302, {
        'Set-Cookie': `${COOKIE}=${value}; Path=/; HttpOnly; SameSite=Lax`,
        Location: localPath(form.get('redirect')),
      });
      return res.end();
    }
    if (url.pathname === '/.auth/me') {
      res.writeHead(200, { 'Content-Type': 'application/json', 'Cache-Control': 'no-store' });
      return res.end(JSON.stringify({ clientPrincipal: readCookie(req) }));
    }
    if (url.pathname === '/.auth/logout') {
      res.writeHead(302, {
        'Set-Cookie': `${COOKIE}=; Path=/; HttpOnly; SameSite=Lax; Max-Age=0`,
        Location: localPath(url.searchParams.get('post_logout_redirect_uri')),
      });
      return res.end();
    }
    res.writeHead(404).end();
  }

  function proxy(req, res, principal) {
    const headers = { ...req.headers, host: target.host };
    for (const h of HOP_BY_HOP) delete headers[h];
    // The platform never passes a client's own principal headers through.
    for (const h of Object.keys(headers)) if (h.startsWith('x-ms-client-principal')) delete headers[h];
    delete headers.cookie;
    if (principal) {
      headers['x-ms-client-principal'] = Buffer.from(JSON.stringify(principal)).toString('base64');
      headers['x-ms-client-principal-id'] = principal.userId;
      headers['x-ms-client-principal-name'] = principal.userDetails;
      headers['x-ms-client-principal-idp'] = principal.identityProvider;
    }
    const upstream = http.request(
      { protocol: target.protocol, hostname: target.hostname, port: target.port, method: req.method,
        path: target.pathname.replace(/\/$/, '') + req.url, headers },
      (up) => {
        const h = { ...up.headers };
        for (const k of HOP_BY_HOP) delete h[k];
        res.writeHead(up.statusCode ?? 502, h);
        up.pipe(res);
      },
    );
    upstream.on('error', (e) => {
      if (res.headersSent) return res.destroy();
      res.writeHead(502, { 'Content-Type': 'application/problem+json' });
      res.end(JSON.stringify({ type: 'about:blank', title: 'Bad Gateway', status: 502, detail: e.message }));
    });
    req.pipe(upstream);
  }

  function serveStatic(req, res, path) {
    let file = normalize(join(dist, path));
    if (!file.startsWith(dist)) return res.writeHead(403).end();
    if (!existsSync(file) || statSync(file).isDirectory()) file = join(dist, 'index.html'); // navigation fallback
    res.writeHead(200, { 'Content-Type': TYPES[extname(file)] ?? 'application/octet-stream', 'Cache-Control': 'no-store' });
    createReadStream(file).pipe(res);
  }

  const server = http.createServer((req, res) => {
    const url = new URL(req.url, 'http://standin');
    if (url.pathname.startsWith('/.auth/')) {
      return handleAuth(req, res, url).catch(() => res.headersSent ? res.destroy() : res.writeHead(500).end());
    }
    const principal = readCookie(req);
    const rule = routes.find((r) => routeMatches(r.route, url.pathname));
    if (rule) {
      const roles = principal?.userRoles ?? ['anonymous'];
      if (!rule.allowedRoles.some((r) => roles.includes(r))) {
        res.writeHead(principal ? 403 : 401, { 'Content-Type': 'text/plain' });
        return res.end(principal ? 'Forbidden (route roles)' : 'Unauthorized (sign in first)');
      }
    }
    if (url.pathname === '/api' || url.pathname.startsWith('/api/')) return proxy(req, res, principal);
    return serveStatic(req, res, decodeURIComponent(url.pathname));
  });
  return new Promise((res) =>
    server.listen(port, '127.0.0.1', () => res({ server, url: `http://127.0.0.1:${server.address().port}` })),
  );
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const arg = (name, fallback) => {
    const i = process.argv.indexOf(name);
    return i >= 0 ? process.argv[i + 1] : fallback;
  };
  const { url } = await startSwaStandin({ apiUrl: arg('--api', 'http://127.0.0.1:3000'), port: Number(arg('--port', 4280)) });
  console.log(`Static Web Apps stand-in on ${url} (sign in: ${url}/.auth/login/aad), /api -> ${arg('--api', 'http://127.0.0.1:3000')}`);
}
