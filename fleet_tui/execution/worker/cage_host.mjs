// The host side of a worker's cage: `node cage_host.mjs SRT_PACKAGE_DIR POLICY_JSON -- ARGV...`.
//
// Anthropic's sandbox runtime (@anthropic-ai/sandbox-runtime, "srt") does the caging: its
// bubblewrap mount, pid and network namespaces, its filtering proxy outside the cage, its
// seccomp helper. This file only drives its library, for three things its `srt` command does
// not do:
//   - report what was refused: every violation srt records (a connection its proxy refused, a
//     write its seccomp observer saw outside the writable paths) is written into the worker's
//     stream as a `system/fleet_blocked` line, between two whole lines of claude's output;
//   - a private /tmp: the policy read-denies /tmp (srt makes a read-denied folder an empty
//     tmpfs), so its proxy sockets, which srt puts under the host's /tmp, are bound back in;
//   - reads: srt on Linux reports no refused read, so a tool result that says a path in a
//     hidden place does not exist (or may not be read) is reported as a blocked read.
// Nothing here makes a namespace, a mount or a proxy.
//
// POLICY_JSON (written by cage.py, never holds a credential):
//   {"srt": <srt settings>, "hidden": [paths], "shown": [paths], "home": "/home/u",
//    "unset_env": [names]}
// The exit status is the command's (128+N for a signal).

import { accessSync, appendFileSync, constants, createReadStream, existsSync, lstatSync,
  mkdtempSync, readdirSync, readFileSync, renameSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import childProcess, { spawn } from 'node:child_process';
import { createRequire, Module, syncBuiltinESMExports } from 'node:module';
import { connect, createServer } from 'node:net';
import { pathToFileURL } from 'node:url';
import { delimiter, join } from 'node:path';

const t0 = performance.now();
const timing = process.env.FLEET_CAGE_TIMING ? label =>
  process.stderr.write(`cage timing ${label} ${(performance.now() - t0).toFixed(0)} ms ` +
    `@${((performance.timeOrigin + performance.now()) / 1000).toFixed(3)}\n`)
  : () => {};
timing(`node up (process origin @${(performance.timeOrigin / 1000).toFixed(3)})`);

// Two ways to be started. `SRT POLICY -- ARGV...`: cage and run ARGV now. `SRT --go FD`
// (the runner's, to start the cage while it prepares the run): srt is loaded at once; FD
// then brings a line {"policy", "argv", "env"}, after which the cage is built, then a line
// "go", after which the command starts. FD closed before "go": exit 3, nothing started.
const [, , packageDir, ...rest] = process.argv;
const goMode = rest[0] === '--go';
if (!packageDir || (goMode ? !/^\d+$/.test(rest[1] || '')
                            : (!rest[0] || rest[1] !== '--' || rest.length < 3))) {
  process.stderr.write('usage: cage_host.mjs SRT_PACKAGE_DIR (POLICY_JSON -- ARGV... | --go FD)\n');
  process.exit(2);
}
// srt's sandbox manager alone, not its index: the index also builds its settings schemas
// (zod) and the Windows entry points, ~50 ms of a start this host does not need. Another
// srt layout than the pinned one's falls back to the index.
const managerModule = join(packageDir, 'dist', 'sandbox', 'sandbox-manager.js');
const srtLoaded = deferForge();
const executable = p => { try { accessSync(p, constants.X_OK); return statSync(p).isFile(); }
                          catch { return false; } };
const which = name => (name.includes('/') ? [name] : (process.env.PATH || '/usr/bin:/bin')
  .split(delimiter).map(d => join(d || '.', name))).find(executable);
const srtsQuestions = answerSrtsQuestions();
if (!goMode) srtsQuestions.ask();  // a warm host starts nothing before its order: see below
const loading = import(pathToFileURL(existsSync(managerModule) ? managerModule
  : join(packageDir, 'dist', 'index.js')).href).finally(srtLoaded);

// srt asks the system three things at each start with spawnSync, each a child process its
// event loop waits for (~5 ms each): `which rg`, `which SHELL` and `bwrap --version` (for a
// warning on an old bubblewrap). `which` is answered here by the same search of PATH, and
// the version by a child started early (`ask`), which runs while srt loads. Any other
// call, or one asked before its answer is in, is spawnSync's.
// And srt's relay (a socat it starts outside the cage, from its Unix socket to its proxy)
// would outlive this host were it killed (the runner's parent-death signal takes the host,
// not its children; with no engine to sweep, it stayed): it is started under `setpriv
// --pdeathsig KILL`, which becomes socat, so it dies with this host however that ends.
// Whether this setpriv takes the flag (util-linux 2.33 and later) is asked early, by a child
// whose answer usually comes in while srt loads; but a warm host starts srt as soon as its
// order comes, and on a loaded machine srt asked for its relay before that answer was read:
// the relay then ran without the signal and outlived a killed runner. So a relay started
// before the answer waits for it, asked again with spawnSync (~2 ms, rarely).
// `done` puts spawnSync and spawn back.
function answerSrtsQuestions() {
  if (process.platform !== 'linux') return { ask() {}, done() {} };
  const spawnSync = childProcess.spawnSync;
  const spawnAsync = childProcess.spawn;
  const probeArgs = ['--pdeathsig', 'KILL', '--', 'true'];
  let setpriv;  // where it knows --pdeathsig; null: no setpriv, or one without it
  let candidate;  // the setpriv on PATH, once `ask` looked
  const knowSetpriv = () => {  // the probe's answer, asked now if it is not in yet
    if (setpriv !== undefined) return setpriv;
    if (candidate === undefined) candidate = which('setpriv') || null;
    const probe = candidate && spawnSync(candidate, probeArgs, { stdio: 'ignore' });
    setpriv = probe && probe.status === 0 ? candidate : null;
    return setpriv;
  };
  childProcess.spawn = function relayed(file, args, options) {
    if (typeof file === 'string' && /(^|\/)socat$/.test(file) && Array.isArray(args) &&
        knowSetpriv()) {
      return spawnAsync.call(this, setpriv, ['--pdeathsig', 'KILL', '--', file, ...args],
                             options);
    }
    return spawnAsync.apply(this, arguments);
  };
  let bwrap;
  let version;  // [status, stdout] of `bwrap --version`, once it has ended
  const ask = () => {
    candidate = which('setpriv') || null;  // none: knowSetpriv says null without a probe
    if (candidate && setpriv === undefined) {
      const probe = spawnAsync(candidate, probeArgs, { stdio: 'ignore' });
      probe.on('error', () => { if (setpriv === undefined) setpriv = null; });
      probe.on('exit', status => {
        if (setpriv === undefined) setpriv = status === 0 ? candidate : null;
      });
      probe.unref();
    }
    bwrap = which('bwrap');
    if (!bwrap) return;
    let out = '';
    const probe = spawn(bwrap, ['--version'], { stdio: ['ignore', 'pipe', 'ignore'] });
    probe.stdout.setEncoding('utf8').on('data', chunk => { out += chunk; });
    probe.on('error', () => {});
    probe.on('close', status => { version = [status, out]; });
    probe.unref();
  };
  const answer = (status, text, options) => {
    const stdout = options && options.encoding && options.encoding !== 'buffer'
      ? text : Buffer.from(text);
    const empty = typeof stdout === 'string' ? '' : Buffer.alloc(0);
    return { pid: 0, output: [null, stdout, empty], stdout, stderr: empty, status,
             signal: null };
  };
  childProcess.spawnSync = function answered(file, args, options) {
    if (Array.isArray(args) && args.length === 1 && typeof args[0] === 'string') {
      if (file === 'which') {
        const found = which(args[0]);
        return answer(found ? 0 : 1, found ? found + '\n' : '', options);
      }
      if (bwrap && file === bwrap && args[0] === '--version' && version) {
        return answer(version[0], version[1], options);
      }
    }
    return spawnSync.apply(this, arguments);
  };
  syncBuiltinESMExports();
  const done = () => {
    childProcess.spawnSync = spawnSync;
    childProcess.spawn = spawnAsync;
    syncBuiltinESMExports();
  };
  return { ask, done };
}

// node-forge, which srt's TLS termination uses (a cage never turns it on), is ~30 files that
// srt's modules import as they load: ~20 ms of each start. While they load, what they take
// of it (their top level only destructures it) is a stand-in; the first use after that loads
// the real one. Returns the function that ends the load.
function deferForge() {
  let loadingSrt = true;
  const done = () => { loadingSrt = false; };
  let require;
  let path;
  try {
    require = createRequire(join(packageDir, 'package.json'));
    path = require.resolve('node-forge');
  } catch {
    return done;  // another srt than the pinned one: nothing deferred
  }
  let real;
  const forge = () => {
    if (real === undefined) {
      delete require.cache[path];
      real = require(path);
    }
    return real;
  };
  const at = keys => keys.reduce((value, key) => value[key], forge());
  const standIn = keys => new Proxy(function forgeStandIn() {}, {
    get: (_, key) => (loadingSrt ? standIn([...keys, key]) : Reflect.get(at(keys), key)),
    set: (_, key, value) => Reflect.set(at(keys), key, value),
    has: (_, key) => Reflect.has(at(keys), key),
    apply: (_, self, args) => Reflect.apply(at(keys), self, args),
    construct: (_, args) => Reflect.construct(at(keys), args),
  });
  const stub = new Module(path);
  stub.filename = path;
  stub.loaded = true;
  stub.exports = standIn([]);
  require.cache[path] = stub;
  return done;
}

// The lines of the runner's pipe, one at a time.
let goLines;
function nextLine() {
  if (!goLines) {
    const queue = [];
    const waiters = [];
    let buffer = '';
    let ended = false;
    const stream = createReadStream(null, { fd: Number(rest[1]), encoding: 'utf8' });
    const settle = () => {
      while (waiters.length && (queue.length || ended)) waiters.shift()(queue.shift());
    };
    stream.on('data', chunk => {
      buffer += chunk;
      let nl;
      while ((nl = buffer.indexOf('\n')) !== -1) {
        queue.push(buffer.slice(0, nl));
        buffer = buffer.slice(nl + 1);
      }
      settle();
    });
    const end = () => { ended = true; settle(); };
    stream.on('end', end);
    stream.on('error', end);
    goLines = () => new Promise(resolve => { waiters.push(resolve); settle(); });
  }
  return goLines();
}

let policyPath;
let argv;
if (goMode) {
  const first = await nextLine();
  if (first === undefined) process.exit(3);
  const order = JSON.parse(first);
  policyPath = order.policy;
  argv = order.argv;
  for (const name of Object.keys(process.env)) delete process.env[name];
  Object.assign(process.env, order.env);
  srtsQuestions.ask();  // the runner moved this process into the attempt's cgroup by now
} else {
  policyPath = rest[0];
  argv = rest.slice(2);
}
const policy = JSON.parse(readFileSync(policyPath, 'utf8'));
const { SandboxManager } = await loading;

// Stopped before the command started (the runner gave up while it prepared the run): srt's
// mount points in the worktree are removed, nothing is left behind.
let child;
let wrappedYet = false;
const abandon = status => {
  if (wrappedYet) try { SandboxManager.cleanupAfterCommand(); } catch { /* best effort */ }
  process.exit(status);
};
for (const [sig, num] of [['SIGTERM', 15], ['SIGINT', 2], ['SIGHUP', 1]]) {
  process.on(sig, () => {
    if (!child) return abandon(128 + num);
    try { child.kill(sig); } catch { /* gone */ }
  });
}

// --- what the cage refused, as stream lines ------------------------------------------------
const pending = [];
const seen = new Set();
const home = policy.home || '';

function tilde(path) {
  if (home && (path === home || path.startsWith(home + '/'))) return '~' + path.slice(home.length);
  return path;
}

function block(kind, target, detail) {
  const key = target;  // one line a target, whichever way it was first seen
  if (seen.has(key)) return;
  seen.add(key);
  const line = JSON.stringify({ type: 'system', subtype: 'fleet_blocked', action: kind,
                                target: tilde(target), detail }) + '\n';
  if (policy.blocked_file) {  // a setup command's: its output is not a stream
    try { appendFileSync(policy.blocked_file, line); } catch { /* a report, never fatal */ }
    return;
  }
  pending.push(line);
  flushBlocked();
}

// srt's lines: "deny network-outbound HOST:PORT (why)", "deny SYSCALL /path". Its write
// observer also reports writes into the tmpfs folders that hide a place: /tmp is the cage's
// own (not reported); the home's tmpfs keeps a write from the real file, so it is reported.
const SYSTEM = ['/dev', '/proc', '/sys'];
const PRIVATE = ['/tmp', '/var/tmp'];
// claude's Write tool writes NAME.tmp.PID.HEX and renames it over NAME: one write, NAME's.
const atomicTemp = path => path.replace(/\.tmp\.\d+\.[0-9a-f]+$/, '');
function isDir(path) {
  try { return statSync(path).isDirectory(); } catch { return false; }
}
function fromViolation(line) {
  const net = /^deny (?:network-outbound|socks-tunnel) (\S+)(?: \((.*)\))?/.exec(line);
  if (net) return block('connect', net[1], net[2] || 'not on the allow list');
  const request = /^deny http-request (\S+) (\S+)(?: \((.*)\))?/.exec(line);
  if (request) return block('request', `${request[1]} ${request[2]}`, request[3] || '');
  const fs = /^deny (\S+) (\/.*)$/.exec(line);
  if (fs) {
    const path = atomicTemp(fs[2]);
    if (SYSTEM.some(d => under(path, d))) return undefined;
    // srt's observer sees attempts, not refusals: `mkdir -p` (claude's Write tool does one)
    // of a folder that is there is no write; a hidden folder's own mount point is there
    if (/^mkdir/.test(fs[1]) && isDir(path) && (!isHidden(path) || hidden.includes(path))) {
      return undefined;
    }
    // the cage's own /tmp is a private tmpfs: a write there is no refusal, unless the path
    // is a hidden place of the host's that lies under /tmp (a home, a repository)
    const hiddenHere = hidden.filter(d => !PRIVATE.includes(d)).some(d => under(path, d));
    if (PRIVATE.some(d => under(path, d)) && !hiddenHere) return undefined;
    return block('write', path, isHidden(path) ? 'kept in the cage, not written' : fs[1]);
  }
  return block('other', line, '');
}

timing('srt imported');
const store = SandboxManager.getSandboxViolationStore();
const addViolation = store.addViolation.bind(store);
store.addViolation = violation => {  // before initialize(): its monitors bind this method
  addViolation(violation);
  try { fromViolation(String(violation.line || '')); } catch { /* a report, never fatal */ }
};

const under = (p, dir) => p === dir || p.startsWith(dir.endsWith('/') ? dir : dir + '/');
const hidden = (policy.hidden || []).filter(Boolean);
const shown = (policy.shown || []).filter(Boolean);
const isHidden = p => hidden.some(d => under(p, d)) && !shown.some(d => under(p, d));
const REFUSED = /No such file or directory|Permission denied|Operation not permitted|Read-only file system|cannot open|No such process/;
const PATHS = /(?:~|\/)[^\s:'"`()<>;,|&]*/g;

// The commands of claude's Bash steps by tool_use id, to tell a refused write from a read.
const commands = new Map();
// The path each of claude's own file tools was given, by tool_use id: their refusals say
// "File does not exist." or EROFS without naming it.
const toolPaths = new Map();
const WRITING_TOOLS = ['Write', 'Edit', 'MultiEdit', 'NotebookEdit'];
function remember(map, id, value) {
  map.set(id, value);
  if (map.size > 1000) map.delete(map.keys().next().value);
}
function noteToolUse(message) {
  const content = message && message.message && message.message.content;
  if (!Array.isArray(content)) return;
  for (const part of content) {
    if (!part || part.type !== 'tool_use' || !part.input) continue;
    if (typeof part.input.command === 'string') remember(commands, part.id, part.input.command);
    const path = [part.input.file_path, part.input.notebook_path, part.input.path]
      .find(p => typeof p === 'string' && p);
    if (path) remember(toolPaths, part.id, { name: String(part.name || ''), path });
  }
}
const TOOL_REFUSED = /does not exist|EROFS|EACCES|EPERM|ENOENT|Permission denied|Read-only file system/;
function scanFileTool(part, text) {
  const used = toolPaths.get(part.tool_use_id);
  if (!used || !(part.is_error === true || TOOL_REFUSED.test(text))) return;
  let path = used.path;
  if (path.startsWith('~')) path = home + path.slice(1);
  if (!path.startsWith('/') || !isHidden(path)) return;  // refused elsewhere: srt's record
  block(WRITING_TOOLS.includes(used.name) ? 'write' : 'read', path, 'not in the cage');
}
const escape = text => text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
// A path the command writes: a redirection to it, or a writing command naming it.
function writes(command, path) {
  if (!command) return false;
  const names = [path, tilde(path)].map(escape).join('|');
  return new RegExp(`(>>?|\\btee\\b[^|;&]*?)\\s*["']?(${names})`).test(command) ||
    new RegExp(`\\b(touch|cp|mv|rm|mkdir|ln|install|sed\\s+-i|truncate|chmod)\\b[^|;&]*?(${names})`)
      .test(command);
}

// A tool result (claude's `user` line) that failed on a hidden path, on another process's
// /proc entry or on a signal to a process outside: reported as what the cage stopped.
function scanToolResult(message) {
  const content = message && message.message && message.message.content;
  if (!Array.isArray(content)) return;
  for (const part of content) {
    if (!part || part.type !== 'tool_result') continue;
    let text = part.content;
    if (Array.isArray(text)) text = text.map(t => (t && t.text) || '').join('\n');
    if (typeof text !== 'string') continue;
    scanFileTool(part, text);
    if (!REFUSED.test(text)) continue;
    for (const line of text.split('\n')) scanLine(line, commands.get(part.tool_use_id));
  }
}

// One line of a command's output (a tool result's, a setup command's) that says it was
// refused something the cage holds back.
function scanLine(line, command) {
  if (!REFUSED.test(line)) return;
  const kill = /kill: \(?(\d+)\)?.*No such process/.exec(line) ||
               /kill: .*?(\d+).*No such process/.exec(line) ||
               /ProcessLookupError.*?(\d+)?/.exec(line);
  if (kill && /No such process|ProcessLookupError/.test(line)) {
    block('signal', kill[1] ? `pid ${kill[1]}` : 'a process outside', 'not in the cage');
    return;
  }
  for (const raw of line.match(PATHS) || []) {
    let path = raw.replace(/[.]+$/, '');
    if (path.startsWith('~')) path = home + path.slice(1);
    if (/^\/proc\/\d+(\/|$)/.test(path) && /No such file|Permission denied/.test(line)) {
      block('read', path, 'a process outside the cage');
    } else if (path.length > 1 && isHidden(path)) {
      const kind = /Read-only file system|Operation not permitted/.test(line) ||
        writes(command, path) ? 'write' : 'read';
      block(kind, path, 'not in the cage');
    }
  }
}

// --- the command ----------------------------------------------------------------------------
// srt keeps its sockets (the proxy's bridges, the write observer's) in the host's temp folder
// and binds them in before the tmpfs that hides /tmp: give it a folder of its own and name
// that folder as a re-allowed read, so it is bound back over the tmpfs (read-only inside).
const quote = s => `'${String(s).replace(/'/g, `'\\''`)}'`;
// A cage host ended by SIGKILL (its runner's group killed after the grace, or the runner's PID
// namespace ended with it) never runs its exit handler, and its folder stayed in /tmp, one for
// each such kill. So a host listens on `alive.sock` in its folder while it runs (named so only
// once it listens); each start removes this user's folders whose alive.sock refuses a
// connection: nothing listens, its host is gone. A pid would not tell: hosts run in PID
// namespaces of their own. A folder without the socket is never touched.
const ALIVE = 'alive.sock';
function sweepEnded(base) {
  let names;
  try { names = readdirSync(base); } catch { return; }
  const uid = process.getuid();
  for (const name of names) {
    if (!name.startsWith('fleet-cage-')) continue;
    const path = join(base, name);
    try {
      const st = lstatSync(path);
      if (!st.isDirectory() || st.uid !== uid || !existsSync(join(path, ALIVE))) continue;
    } catch { continue; }
    const probe = connect(join(path, ALIVE));
    probe.unref();
    probe.on('connect', () => probe.destroy());
    probe.on('error', err => {
      if (err.code !== 'ECONNREFUSED') return;
      try { rmSync(path, { recursive: true, force: true }); } catch { /* another start did */ }
    });
  }
}
const own = mkdtempSync(join(tmpdir(), 'fleet-cage-'));
const alive = createServer(conn => conn.destroy());
alive.unref();
alive.on('error', () => { /* a host that cannot listen is only not swept */ });
alive.listen(join(own, 'alive.tmp'), () => {
  try { renameSync(join(own, 'alive.tmp'), join(own, ALIVE)); } catch { /* not swept */ }
});
sweepEnded(tmpdir());
process.env.TMPDIR = own;
process.on('exit', () => { try { rmSync(own, { recursive: true, force: true }); } catch { /* */ } });
// bubblewrap and socat by the paths PATH gives, as srt would find them, but without its
// `which` child for each at every start.
const programs = process.platform === 'linux'
  ? Object.fromEntries([['bwrapPath', which('bwrap')], ['socatPath', which('socat')]]
    .filter(([, path]) => path && path.startsWith('/')))
  : {};
const srtConfig = { ...policy.srt, ...programs, filesystem: { ...policy.srt.filesystem,
  allowRead: [...(policy.srt.filesystem.allowRead || []), own] } };

// The command's /proc. srt's seccomp helper runs the command in a PID namespace of its own
// (inside bwrap's) and mounts that namespace's /proc over bwrap's. The kernel lets a user
// namespace mount a proc only where a proc mount already stands fully visible (no locked
// mount over anything in it but an empty folder), and bwrap's fresh /proc is not: it puts
// read-only binds over /proc/irq and /proc/bus. So with srt's default the helper's mount
// fails (EPERM, which it ignores), the command's pids ($$, getpid) are not the ones its
// /proc names, and ps and pgrep fail ("lookup self") or name the wrong process. srt's
// enableWeakerNestedSandbox binds the host's /proc where bwrap would mount a fresh one:
// fully visible wherever bwrap's own fresh mount is allowed at all (the same kernel rule,
// on the host's /proc), so the helper's mount succeeds and the command sees its own
// namespace's processes only. Where the host's /proc is masked (a container), bwrap's
// fresh mount fails with srt's default, and the helper's with this: the command's first
// step (OWN_PROC below) then refuses to start in the host's /proc.
if (process.platform === 'linux') srtConfig.enableWeakerNestedSandbox = true;

// srt's start (its proxy, its relay to it, its write observer), meanwhile our bridge's
// socket and shell are made. srt waits for its relay (a socat it starts, from a Unix socket
// in the temp folder to its proxy) by looking for the relay's socket at once, at once
// again, and then 100 ms later: socat listens ~10 ms after it starts, so most starts slept
// ~90 ms for nothing. While srt starts, that wait of its (told by srt's function on the
// stack; no other timer is touched) ends as soon as the relay's socket is in our folder,
// where srt then finds it. Its own timeout stays as it was.
const relaySleep = /\binitializeLinuxNetworkBridge\b/;
const relayListening = () => {
  try { return readdirSync(own).some(name => /^claude-http-[0-9a-f]+\.sock$/.test(name)); }
  catch { return false; }
};
const ownSetTimeout = globalThis.setTimeout;
if (process.platform === 'linux' && srtConfig.network?.httpProxyPort === undefined &&
    srtConfig.network?.socksProxyPort === undefined) {  // one relay (srt's mux), none external
  globalThis.setTimeout = function setTimeout(callback, delay, ...args) {
    if (typeof callback !== 'function' || !(delay >= 50) ||
        !relaySleep.test(new Error().stack || '')) {
      return ownSetTimeout(callback, delay, ...args);
    }
    let poll;
    const late = ownSetTimeout(() => { clearTimeout(poll); callback(...args); }, delay);
    const look = () => {
      if (!relayListening()) { poll = ownSetTimeout(look, 2); return; }
      clearTimeout(late);
      callback(...args);
    };
    poll = ownSetTimeout(look, 1);
    return late;
  };
}
const initializing = SandboxManager.initialize(srtConfig, undefined, true);
initializing.catch(() => {}).finally(() => { globalThis.setTimeout = ownSetTimeout; });

// The worker's endpoint on this machine (the gateway, a local endpoint): a socket of ours in
// `own` (bound into the cage with it), relayed inside to the endpoint's own 127.0.0.1:PORT by
// a socat that srt's shell starts before srt's seccomp filter (which forbids Unix sockets to
// everything it starts after). So claude reaches it as uncaged, not through the proxy: a
// refused connection stays one, where the proxy would answer "502 Bad Gateway".
let binShell;
let bridgeWait = '';
const bridged = [];
if (policy.bridge && process.platform === 'linux') {
  const { host, port } = policy.bridge;
  const target = host === 'localhost' ? '127.0.0.1' : host;
  const sock = join(own, 'endpoint.sock');
  const server = createServer(inner => {
    const outer = connect({ host: target, port });
    bridged.push(inner, outer);
    const drop = () => { inner.destroy(); outer.destroy(); };
    inner.on('error', drop); outer.on('error', drop);
    inner.on('close', drop); outer.on('close', drop);
    inner.pipe(outer); outer.pipe(inner);
  });
  await new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(sock, resolve);
  });
  server.unref();
  const bash = which('bash') || '/bin/bash';
  const socat = srtConfig.socatPath || 'socat';
  const shim = join(own, 'shell');
  // srt runs its shell three times inside: the first, before its relays and its seccomp
  // helper, starts our relay in the background (it comes up while srt's start); the others
  // just run bash. Nothing waits for it there: the command does, below.
  writeFileSync(shim, [
    '#!/bin/sh',
    ...(process.env.FLEET_CAGE_TIMING ? ['echo "cage timing shim $(date +%s.%N) $$" >&2'] : []),
    'if [ -z "${FLEET_CAGE_BRIDGE-}" ]; then',
    '  export FLEET_CAGE_BRIDGE=1',
    `  ${quote(socat)} TCP4-LISTEN:${port},bind=${target},fork,reuseaddr,backlog=4096 ` +
      `UNIX-CONNECT:${quote(sock)} >/dev/null 2>&1 &`,
    'fi',
    `exec ${quote(bash)} "$@"`,
    '',
  ].join('\n'), { mode: 0o755 });
  binShell = shim;
  // Before the command starts (inside, under the seccomp filter): wait until our relay
  // listens, and srt's two with it (srt waits until two TCP sockets listen, which ours may
  // have been one of). The cage's network namespace holds no other socket yet, so its
  // counts of TCP sockets in use (/proc/net/sockstat{,6}) say when all three listen:
  // ~0.1 ms a look, where a read of /proc/net/tcp walks the kernel's whole connection
  // table (~3 ms a file here). Shell only, no program; given up after 5 s by /proc/uptime
  // (hundredths), as srt gives up its own wait, and the command starts as it would have.
  bridgeWait = [
    '_fc_since=',
    'while :; do',
    '  _fc_up=0',
    '  for _fc_f in /proc/net/sockstat /proc/net/sockstat6; do',
    '    [ -r "$_fc_f" ] || continue',
    '    while read -r _fc_kind _fc_skip _fc_inuse _fc_rest; do',
    '      case "$_fc_kind" in TCP: | TCP6:) _fc_up=$((_fc_up + _fc_inuse)); break ;; esac',
    '    done < "$_fc_f"',
    '  done',
    '  [ "$_fc_up" -ge 3 ] && break',
    '  read -r _fc_now _fc_rest < /proc/uptime || break',
    '  _fc_now=1${_fc_now%.*}${_fc_now#*.}',
    '  [ "$((_fc_now - ${_fc_since:=$_fc_now}))" -lt 500 ] || break',
    'done',
    'unset _fc_since _fc_up _fc_f _fc_kind _fc_skip _fc_inuse _fc_rest _fc_now',
    '',
  ].join('\n');
}
timing('bridge ready');
await initializing;
timing('srt initialized');

// Inside, every connection but the bridged endpoint's goes through the proxy (srt's NO_PROXY
// would send loopback and private addresses past it, where there is nothing): NO_PROXY is
// removed, or names only the bridged host:port, so each refusal is seen.
const unset = (policy.unset_env || []).flatMap(name => ['-u', name]);
const set = Object.entries(policy.set_env || {}).map(([k, v]) => `${k}=${v}`);
// The command's first step, on Linux: the /proc it sees is its cage's (its own PID
// namespace's, or bwrap's), never one of a namespace outside the cage, in which another
// process could be read or signalled. NSpid lists a process's pid in each namespace from
// its /proc's down to its own: more than two means /proc is from outside bwrap's.
// (The command starts after the loop, whose input is the status file, not the command's.)
const OWN_PROC = 'own=; while read -r k a b c; do case $k in NSpid:) ' +
  '[ -n "$a" ] && [ -z "$c" ] && own=1; break ;; esac; done < /proc/self/status; ' +
  '[ -n "$own" ] && exec "$@"; echo "fleet-tui cage: the worker\'s /proc is not its cage\'s (srt\'s seccomp helper could ' +
  'not mount its own): refusing to start it there" >&2; exit 125';
const check = process.platform === 'linux' ? ['/bin/sh', '-c', OWN_PROC, 'fleet-cage'] : [];
const inner = (process.env.FLEET_CAGE_TIMING ? 'echo "cage timing begin ${EPOCHREALTIME/,/.}" >&2\n' : '') + bridgeWait + (process.env.FLEET_CAGE_TIMING ? 'echo "cage timing inner ${EPOCHREALTIME/,/.}" >&2\n' : '') + 'exec ' + [...check, 'env', ...unset, '-u', 'FLEET_CAGE_BRIDGE', ...set,
  `TMPDIR=${policy.tmpdir || '/tmp'}`, ...argv].map(quote).join(' ');
const wrapped = await SandboxManager.wrapWithSandbox(inner, binShell);
wrappedYet = true;
srtsQuestions.done();
timing('wrapped');

if (goMode && (await nextLine()) !== 'go') abandon(3);
timing('go');
// A setup command's output is text (stderr with stdout, in order, as uncaged), read line
// by line for refusals; claude's is its stream. `exec` on Linux for claude: the shell srt's
// string is run by becomes bubblewrap (srt keeps that string one simple command so that a
// prefix composes), one process less to start.
const textOutput = policy.output === 'text';
const run = textOutput ? `{ ${wrapped}\n} 2>&1`
  : process.platform === 'linux' ? `exec ${wrapped}` : wrapped;
child = spawn(run, { shell: true, stdio: ['inherit', 'pipe', 'inherit'] });

// claude's stdout, line by line, with our lines only between two of its lines.
let partial = Buffer.alloc(0);
let blockedOut = false;
function write(chunk) {
  if (!process.stdout.write(chunk) && !blockedOut) {
    blockedOut = true;
    child.stdout.pause();
    process.stdout.once('drain', () => { blockedOut = false; child.stdout.resume(); });
  }
}
function flushBlocked() {
  if (partial.length !== 0) return;  // mid-line: after the line ends
  while (pending.length) write(pending.shift());
}
child.stdout.on('data', data => {
  let start = 0;
  let nl;
  while ((nl = data.indexOf(10, start)) !== -1) {
    const line = partial.length ? Buffer.concat([partial, data.subarray(start, nl + 1)])
                                : data.subarray(start, nl + 1);
    partial = Buffer.alloc(0);
    write(line);
    if (textOutput) {
      try { scanLine(line.toString('utf8'), policy.command); } catch { /* a report only */ }
    } else if (line.length < 4 * 1024 * 1024 && line.includes('"tool_result"')) {
      try { scanToolResult(JSON.parse(line.toString('utf8'))); } catch { /* not JSON */ }
    } else if (line.length < 4 * 1024 * 1024 && line.includes('"tool_use"')) {
      try { noteToolUse(JSON.parse(line.toString('utf8'))); } catch { /* not JSON */ }
    }
    flushBlocked();
    start = nl + 1;
  }
  if (start < data.length) partial = Buffer.concat([partial, data.subarray(start)]);
});

child.on('exit', (code, signal) => {
  let done = false;
  const finish = () => {
    if (done) return;
    done = true;
    if (partial.length) { write(partial); partial = Buffer.alloc(0); write('\n'); }
    flushBlocked();
    try { SandboxManager.cleanupAfterCommand(); } catch { /* best effort */ }
    const status = signal ? 128 + ({ SIGHUP: 1, SIGINT: 2, SIGKILL: 9, SIGTERM: 15 }[signal] || 1)
                          : (code ?? 1);
    process.stdout.write('', () => process.exit(status));
  };
  if (child.stdout.readableEnded) return finish();
  // the sandbox's processes die with its init, closing claude's stdout; should something
  // still hold it, the exit is not held up past a few seconds
  const late = setTimeout(finish, 5000);
  child.stdout.once('end', () => { clearTimeout(late); finish(); });
});
child.on('error', err => {
  process.stderr.write(`cage: cannot start the command: ${err.message}\n`);
  process.exit(127);
});
