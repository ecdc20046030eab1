"""Shared pieces of the bench scripts: servers, HTTP calls, and wrk driving a list of requests."""
import json, os, re, socket, subprocess, time, urllib.request

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


LUA = r'''
local lines = {}
for line in io.lines(os.getenv("SB_LINES")) do lines[#lines + 1] = line end
local extra = {}
for h in string.gmatch(os.getenv("SB_HEADERS") or "", "[^|]+") do
  local k, v = h:match("^([^:]+):%s*(.*)$"); extra[k] = v
end
local threads, counter = 0, 0
function setup(thread) threads = threads + 1; thread:set("tid", threads) end
function init(args) counter = tid - 1; stride = tonumber(os.getenv("SB_STRIDE")) end
function request()
  local l = lines[(counter % #lines) + 1]
  counter = counter + stride
  local method, path, tok, body = l:match("^(%S+) (%S+) (%S+) ?(.*)$")
  local headers = { ["Authorization"] = "Bearer " .. tok }
  if body ~= "" then headers["Content-Type"] = "application/json" else body = nil end
  for k, v in pairs(extra) do headers[k] = v end
  return wrk.format(method, path, headers, body)
end
'''


def wrk_command(url, lines, tmp, conns, seconds, threads=2, stride=None, tag="w", headers=None):
    """The wrk process for `lines` ("METHOD PATH TOKEN [JSON]") against `url`, started; every
    request also carries `headers` (a dict)."""
    with open(f"{tmp}/lines-{tag}.txt", "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(f"{tmp}/script.lua", "w") as f:
        f.write(LUA)
    env = dict(os.environ, SB_LINES=f"{tmp}/lines-{tag}.txt", SB_STRIDE=str(stride or threads),
               SB_HEADERS="|".join(f"{k}: {v}" for k, v in (headers or {}).items()))
    return subprocess.Popen(["wrk", "-t", str(threads), "-c", str(conns), "-d", f"{seconds}s", "--latency", "-s", f"{tmp}/script.lua", url],
                            env=env, stdout=subprocess.PIPE, text=True)


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
