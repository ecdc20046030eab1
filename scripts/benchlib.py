"""Shared pieces of the bench scripts: servers, HTTP calls, and wrk driving a list of requests."""
import json, math, os, re, socket, subprocess, time, urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# SKILLBOX_BENCH_BIN runs another build (an older commit's, built in a target directory of its
# own) through the same script, to compare builds side by side; unset, the tree's release build.
BIN = os.environ.get("SKILLBOX_BENCH_BIN") or os.path.join(ROOT, "target", "release", "skillbox")
ADMIN = "bench-admin-token"


def build_release():
    if os.environ.get("SKILLBOX_BENCH_BIN"):
        return
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "skillbox"], cwd=ROOT, check=True)


def test_server(script):
    """Starts `scripts/<script>` (`postgres-test-server` or `s3-test-server`): returns its URL
    and the command that stops it."""
    run = subprocess.run([f"{ROOT}/scripts/{script}"], capture_output=True, text=True, check=True)
    return run.stdout.strip(), [f"{ROOT}/scripts/{script}", "--stop", run.stderr.split()[1]]


def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p


def call(method, url, token, body=None, ctype="application/json"):
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Authorization": f"Bearer {token}", "Content-Type": ctype})
    with urllib.request.urlopen(req) as r:
        return json.loads(r.read() or b"null")


def serve(data_dir, extra=(), env=None):
    """Starts `skillbox serve` (`--box none` unless `extra` names one) on a free port; returns
    (process, base URL) once healthy."""
    port = free_port()
    env = dict(env or os.environ, SKILLBOX_ADMIN_TOKEN=ADMIN, SKILLBOX_LOG="warn")
    box = [] if "--box" in extra else ["--box", "none"]
    proc = subprocess.Popen([BIN, "serve", *box, "--listen", f"127.0.0.1:{port}", "--data-dir", data_dir, "--gc-interval", "0", *extra], env=env)
    base = f"http://127.0.0.1:{port}"
    for _ in range(400):
        if proc.poll() is not None:
            raise RuntimeError(f"skillbox serve exited with {proc.returncode}")
        try:
            urllib.request.urlopen(base + "/healthz"); return proc, base
        except Exception:
            time.sleep(0.05)
    raise RuntimeError(f"server on {base} did not become healthy")


# Each wrk thread sends the requests of its own file, as bytes ready to send: an 8-digit length,
# then the request. Built here rather than per request in Lua (a pattern match, a header
# table and `wrk.format` each time): that took ~35-40% of a core of the two that wrk shares
# with the server under test (scripts/bench-runs, 2026-12-07), for skillbox and nginx alike.
LUA = r"""
local threads, file = 0
function setup(thread) threads = threads + 1; thread:set("requests", os.getenv("SB_REQUESTS") .. "-" .. threads) end
function init(args) file = assert(io.open(requests, "rb")) end
function request()
  local size = file:read(8)
  if not size then file:seek("set", 0); size = file:read(8) end
  return file:read(tonumber(size))
end
"""


def http_request(line, host, headers):
    """`line` ("METHOD PATH TOKEN [JSON]") as the bytes of an HTTP/1.1 request to `host`."""
    method, path, token, *body = line.split(" ", 3)
    body = body[0].encode() if body and body[0] else b""
    head = [f"{method} {path} HTTP/1.1", f"Host: {host}", f"Authorization: Bearer {token}"]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if body:
        head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def wrk_command(url, lines, tmp, conns, seconds, threads=2, stride=None, tag="w", headers=None):
    """The wrk process for `lines` ("METHOD PATH TOKEN [JSON]") against `url`, started; every
    request also carries `headers` (a dict). Thread t (from 0) sends lines t, t + stride,
    t + 2 stride, … (`stride` defaults to `threads`: each line is sent by one thread), from
    the first again once it has sent them all. To start several at once, `wrk_prepare` each
    first, then `wrk_start` them."""
    return wrk_start(wrk_prepare(url, lines, tmp, conns, seconds, threads, stride, tag, headers))


def wrk_prepare(url, lines, tmp, conns, seconds, threads=2, stride=None, tag="w", headers=None):
    """`wrk_command`'s request files written (the slow part) and its command line, to start."""
    stride = stride or threads
    host = url.split("://", 1)[1].split("/", 1)[0]
    period = len(lines) // math.gcd(len(lines), stride)  # then thread t's lines repeat
    for t in range(threads):
        with open(f"{tmp}/requests-{tag}-{t + 1}", "wb") as f:
            for k in range(period):
                request = http_request(lines[(t + k * stride) % len(lines)], host, headers)
                f.write(b"%08d" % len(request) + request)
            # On disk before the row starts: written back during it, a write row's pool
            # (~100 MB) would share the disk with the fsyncs it measures.
            f.flush()
            os.fsync(f.fileno())
    with open(f"{tmp}/script-{tag}.lua", "w") as f:
        f.write(LUA)
    env = dict(os.environ, SB_REQUESTS=f"{tmp}/requests-{tag}")
    return ["wrk", "-t", str(threads), "-c", str(conns), "-d", f"{seconds}s", "--latency", "-s", f"{tmp}/script-{tag}.lua", url], env


def wrk_start(prepared):
    argv, env = prepared
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)


def wrk(url, lines, tmp, conns, seconds, threads=2, stride=None, headers=None):
    p = wrk_command(url, lines, tmp, conns, seconds, threads, stride, headers=headers)
    out, _ = p.communicate()
    assert p.returncode == 0, out
    return parse(out)


def parse(out):
    """(requests/s, p50 ms, p99 ms, failed count, total requests) of a wrk --latency report;
    failed counts non-2xx answers and socket errors (a request that timed out or whose
    connection broke did not succeed either)."""
    rps = float([l for l in out.splitlines() if l.startswith("Requests/sec")][0].split()[1])
    total = int([l for l in out.splitlines() if "requests in" in l][0].split()[0])

    def pct(p):
        v = [l for l in out.splitlines() if l.strip().startswith(p + "%")][0].split()[1]
        if v.endswith("us"):
            return float(v[:-2]) / 1000
        if v.endswith("ms"):
            return float(v[:-2])
        if v.endswith("m"):
            return float(v[:-1]) * 60000
        return float(v[:-1]) * 1000
    non2xx = [l for l in out.splitlines() if "Non-2xx" in l]
    failed = int(non2xx[0].split()[-1]) if non2xx else 0
    for line in out.splitlines():
        if line.strip().startswith("Socket errors:"):
            failed += sum(int(n) for n in re.findall(r"\d+", line))
    return rps, pct("50"), pct("99"), failed, total
