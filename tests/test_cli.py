#!/usr/bin/env python3
"""slotd-cli against the real daemon on loopback.

    tests/test_cli.py batch   commands from arguments and from stdin: every
                              command's output, --raw byte for byte against
                              the daemon's own lines, --full, unknown
                              commands, exit statuses, no history or colour
    tests/test_cli.py pty     at a terminal (a pseudo-terminal): arrow-up
                              repeats a command, history survives a restart,
                              Tab completes command names, colour and NO_COLOR

Each mode then starts a second daemon with --auth-token-file and checks the
client's token: --auth-token-file and SLOTD_AUTH_TOKEN_FILE, the auth command,
a wrong token, a file others may read, and that the token shows nowhere (not
in the output, not in the history).

SLOTD_BIN and SLOTD_CLI name the binaries (CTest passes them).  Every wait
is bounded and stretched by SLOTD_TIME_SCALE.  Each check prints PASS or
FAIL; the exit status is 1 if any failed.
"""
import json
import os
import re
import secrets
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time

SCALE = max(1.0, float(os.environ.get("SLOTD_TIME_SCALE", "1") or 1))
SLOTD = os.environ.get("SLOTD_BIN", "build/server/slotd")
CLI = os.environ.get("SLOTD_CLI", "build/server/slotd-cli")
COLOUR_KEY = "\x1b[36m"  # cli_out.c's colour of a key

passed = 0
failed = 0


def check(what, ok, detail=""):
    global passed, failed
    if ok:
        passed += 1
        print("PASS: " + what)
    else:
        failed += 1
        print("FAIL: " + what + ("\n      " + detail.replace("\n", "\n      ") if detail else ""))
    sys.stdout.flush()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def accepts(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


class Daemon:
    """The daemon on two free loopback ports, with tiny, hash and small.
    Without the prefix cache: the checks compare the client's output of a
    session with the daemon's replies to the same lines sent again, and
    the second start of a prompt would say it reused entries (`cached`)."""

    def __init__(self, workdir, *flags):
        for _ in range(5):
            self.port, self.admin = free_port(), free_port()
            if self.port == self.admin:
                continue
            self.log = open(os.path.join(workdir, "daemon.log"), "ab")
            self.proc = subprocess.Popen(
                [SLOTD, "--port", str(self.port), "--admin-port", str(self.admin),
                 "--models", "tiny,hash,small", "--threads", "2", "--prefix-cache", "off",
                 *flags],
                stdout=self.log, stderr=subprocess.STDOUT)
            limit = time.monotonic() + 10 * SCALE
            while time.monotonic() < limit and self.proc.poll() is None:
                if accepts(self.port) and accepts(self.admin):
                    return
                time.sleep(0.05)
            self.proc.kill()
            self.proc.wait()
        raise RuntimeError("slotd did not start (see daemon.log)")

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30 * SCALE)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def lines(self, reqs):
        """The daemon's exact reply lines to `reqs`, sent one at a time on
        one connection."""
        out = []
        with socket.create_connection(("127.0.0.1", self.port), timeout=10 * SCALE) as s:
            f = s.makefile("rb")
            for r in reqs:
                s.sendall(r.encode() + b"\n")
                out.append(f.readline())
        return out

    def http(self, path):
        with socket.create_connection(("127.0.0.1", self.admin), timeout=10 * SCALE) as s:
            s.sendall(("GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % path).encode())
            data = b""
            while True:
                b = s.recv(65536)
                if not b:
                    break
                data += b
        head, _, body = data.partition(b"\r\n\r\n")
        return int(head.split()[1]), body

    def requests_total(self):
        return json.loads(self.http("/stats")[1])["requests_total"]


# ---- The compact format, written again from its description ----

def fmt_value(v, logits=False):
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, str):
        return v
    if isinstance(v, (int, float)) and logits:
        return "%.6f" % v
    if isinstance(v, float) and v == int(v):
        return str(int(v))
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, list):
        return "[" + " ".join(fmt_value(e, logits) for e in v) + "]"
    return "{" + ", ".join(k + ": " + fmt_value(e) for k, e in v.items()) + "}"


def fmt_short_logits(v):
    row, shape = v, str(len(v))
    if v and isinstance(v[0], list):
        row, shape = v[0], "%d × %d" % (len(v), len(v[0]))
    if not row:
        return shape
    first = " ".join("%.6f" % x for x in row[:2]) + (" …" if len(row) > 2 else "")
    return shape + ", first [" + first + "]"


def fmt_reply(line, full=False):
    o = json.loads(line)
    if "error" in o:
        rest = [k + ": " + fmt_value(v) for k, v in o.items() if k != "error"]
        return "  ".join(["(error) %s: %s" % (o["error"]["code"], o["error"]["message"])] + rest)
    parts = []
    for k, v in o.items():
        if k == "logits":
            parts.append(k + ": " + (fmt_value(v, True) if full else fmt_short_logits(v)))
        else:
            parts.append(k + ": " + fmt_value(v))
    return "  ".join(parts)


def cli(d, *args, stdin=None, env=None):
    e = dict(os.environ)
    e.pop("NO_COLOR", None)
    e.update(env or {})
    return subprocess.run([CLI, "-p", str(d.port), "-a", str(d.admin), *args],
                          input=stdin, capture_output=True, timeout=60 * SCALE, env=e)


def run_batch(d, work):
    env = {"HOME": work}
    # The session's requests, as commands and as the JSON the daemon gets.
    session = [
        ("start a 1 2 3", '{"op":"start","id":"a","prompt":[1,2,3]}'),
        ("start -m hash b 5 6", '{"op":"start","id":"b","model":"hash","prompt":[5,6]}'),
        ("start c -m small 1,2", '{"op":"start","id":"c","model":"small","prompt":[1,2]}'),
        ("step a 2", '{"op":"step","id":"a","n":2}'),
        ("step a", '{"op":"step","id":"a"}'),
        ("step b 3", '{"op":"step","id":"b","n":3}'),
        ("logits 0 1 2", '{"op":"logits","tokens":[0,1,2]}'),
        ("logits -m small 4,5", '{"op":"logits","model":"small","tokens":[4,5]}'),
        ("generate 3 0 1", '{"op":"generate","steps":3,"tokens":[0,1]}'),
        ("generate --cache -m small 2 7 8",
         '{"op":"generate","model":"small","steps":2,"use_cache":true,"tokens":[7,8]}'),
        ("finish a", '{"op":"finish","id":"a"}'),
        ("finish b", '{"op":"finish","id":"b"}'),
        ("finish c", '{"op":"finish","id":"c"}'),
        ("start d 1", '{"op":"start","id":"d","prompt":[1]}'),
        ("append d 4,5 0", '{"op":"append","id":"d","tokens":[4,5,0]}'),
        ("step d", '{"op":"step","id":"d"}'),
        ("fork e d", '{"op":"fork","id":"e","from":"d"}'),
        ("step e", '{"op":"step","id":"e"}'),
        ("finish d", '{"op":"finish","id":"d"}'),
        ("finish e", '{"op":"finish","id":"e"}'),
        ('{"op":"start","id":"j","prompt":[0],"tag":7}', '{"op":"start","id":"j","prompt":[0],"tag":7}'),
    ]
    cmds = [c for c, _ in session]
    want_raw = d.lines([j for _, j in session])

    r = cli(d, *cmds, env=env)
    got = r.stdout.decode().splitlines()
    want = [fmt_reply(l) for l in want_raw]
    check("every session command, one argument each: exit 0, nothing on stderr",
          r.returncode == 0 and r.stderr == b"", "rc %d, stderr %r" % (r.returncode, r.stderr))
    check("every session command: one compact line per reply, as the daemon's line says",
          got == want, "got:\n" + "\n".join(got) + "\nwant:\n" + "\n".join(want))
    # The shape itself, written out (docs/models.md's tiny model, as in the README).
    check("start: 'id: a  model: tiny  entries: 3  cached: 0'",
          got[:1] == ["id: a  model: tiny  entries: 3  cached: 0"],
          repr(got[:1]))
    check("step with logits shortened: 'logits: 2 × 6, first [-0.125467 0.468642 …]'",
          len(got) > 3 and got[3] == "id: a  tokens: [1 0]  logits: 2 × 6, first "
          "[-0.125467 0.468642 …]  entries: 5", repr(got[3:4]))
    check("hash step without logits: 'id: b  tokens: [260 352 680]  entries: 5'",
          len(got) > 5 and got[5] == "id: b  tokens: [260 352 680]  entries: 5", repr(got[5:6]))
    check("logits: one vector, 'logits: 6, first [...]  rows: 6'",
          len(got) > 6 and re.fullmatch(r"logits: 6, first \[-?\d\.\d{6} -?\d\.\d{6} …\]  rows: 6",
                                        got[6]) is not None, repr(got[6:7]))
    check("a JSON line goes as it is, members in the daemon's order: "
          "'tag: 7  id: j  model: tiny  entries: 1  cached: 0'",
          got[-1:] == ["tag: 7  id: j  model: tiny  entries: 1  cached: 0"], repr(got[-1:]))

    r = cli(d, stdin=("\n".join(cmds) + "\n").encode(), env=env)
    check("the same commands from stdin: the same output, no prompt, exit 0",
          r.returncode == 0 and r.stdout.decode().splitlines() == want,
          "rc %d\n%s" % (r.returncode, r.stdout.decode()))
    check("stdin is not a terminal: no history file written",
          not os.path.exists(os.path.join(work, ".slotd_history")))
    check("stdout is not a terminal: no colour", b"\x1b[" not in r.stdout)

    r = cli(d, "--raw", *cmds, env=env)
    check("--raw: the daemon's lines byte for byte", r.stdout == b"".join(want_raw),
          "got:\n%r\nwant:\n%r" % (r.stdout, b"".join(want_raw)))
    # The decoding options: each command sends the JSON written beside it.
    decode = [
        ("start dq -m small 1 2", '{"op":"start","id":"dq","model":"small","prompt":[1,2]}'),
        ("step dq 3 --scores none --temp 0.5 --seed 18446744073709551615 --stop 7 --stop 9",
         '{"op":"step","id":"dq","n":3,"scores":"none","sample":{"temperature":0.5,'
         '"seed":18446744073709551615},"stop":[7,9]}'),
        ("step --top-k 3 --top-p 0.9 --temp 1 dq --scores 2",
         '{"op":"step","id":"dq","sample":{"top_k":3,"top_p":0.9,"temperature":1},"scores":2}'),
        ("generate --scores 1 -m tiny --seed 4 --cache --temp 2 3 0 1",
         '{"op":"generate","model":"tiny","steps":3,"use_cache":true,"scores":1,'
         '"sample":{"seed":4,"temperature":2},"tokens":[0,1]}'),
        ("finish dq", '{"op":"finish","id":"dq"}'),
    ]
    r = cli(d, "--raw", *[c for c, _ in decode], env=env)
    want_dec = b"".join(d.lines([j for _, j in decode]))
    check("decoding options: the replies of the JSON they stand for",
          r.returncode == 0 and r.stdout == want_dec, "got:\n%r\nwant:\n%r" % (r.stdout, want_dec))
    r = cli(d, "--full", *cmds[:4], env=env)
    check("--full: logits in full, six decimals",
          r.stdout.decode().splitlines() == [fmt_reply(l, full=True) for l in want_raw[:4]],
          r.stdout.decode())

    # A lone command word joins the arguments into one command.
    r = cli(d, "generate", "-m", "small", "2", "7", "8", env=env)
    check("a lone command word: 'slotd-cli generate -m small 2 7 8'",
          r.returncode == 0 and r.stdout.decode().splitlines() == [
              fmt_reply(d.lines(['{"op":"generate","model":"small","steps":2,"tokens":[7,8]}'])[0])],
          r.stdout.decode())

    # stats: every member of the daemon's object, in its order.
    r = cli(d, "stats", env=env)
    keys = re.findall(r"(?:^|  )([a-z_]+): ", r.stdout.decode())
    st = json.loads(d.http("/stats")[1])
    check("stats: one line with every member of the stats object",
          r.returncode == 0 and len(r.stdout.decode().splitlines()) == 1 and keys == list(st),
          r.stdout.decode())
    check("stats: 'released: {finish: N, disconnect: N, idle: N, shutdown: N}'",
          re.search(r"  released: \{finish: \d+, disconnect: \d+, idle: \d+, shutdown: \d+\}  ",
                    r.stdout.decode()) is not None, r.stdout.decode())

    # The admin port.
    r = cli(d, "health", env=env)
    check("health: 'status: ok', exit 0", r.returncode == 0 and r.stdout == b"status: ok\n",
          repr(r.stdout))
    r = cli(d, "--raw", "health", env=env)
    check("health --raw: the body byte for byte", r.stdout == d.http("/health")[1], repr(r.stdout))
    r = cli(d, "metrics", env=env)
    body = d.http("/metrics")[1].decode()
    samples = [l for l in body.splitlines() if l and not l.startswith("#")]
    names = [l.split()[0] for l in r.stdout.decode().splitlines()]
    check("metrics: the sample lines, no comments",
          r.returncode == 0 and names == [l.split()[0] for l in samples] and len(names) > 5,
          r.stdout.decode()[:400])
    r = cli(d, "metrics", "slotd_cache_entries", env=env)
    check("metrics PATTERN: only the lines holding it",
          r.returncode == 0 and re.fullmatch(r"slotd_cache_entries \d+\n", r.stdout.decode()) is not None,
          repr(r.stdout))
    r = cli(d, "metrics", "no_such_metric", env=env)
    check("metrics PATTERN matching nothing says so, exit 0",
          r.returncode == 0 and r.stdout == b"(no metric matches 'no_such_metric')\n", repr(r.stdout))
    r = cli(d, "--raw", "metrics", "slotd_cache_entries", env=env)
    want_lines = "".join(l + "\n" for l in body.splitlines() if "slotd_cache_entries" in l)
    check("metrics --raw PATTERN: the body's lines holding it, comments too",
          r.stdout.decode() == want_lines and "# TYPE" in want_lines, repr(r.stdout))
    e = dict(os.environ, HOME=work)
    r = subprocess.run([CLI, "-p", str(d.port), "-a", "127.0.0.1:%d" % d.admin, "health"],
                       capture_output=True, timeout=60 * SCALE, env=e)
    check("-a HOST:PORT", r.returncode == 0 and r.stdout == b"status: ok\n", repr(r.stdout))
    r = subprocess.run([CLI, "--admin", "[::1]:1", "health"], capture_output=True,
                       timeout=60 * SCALE, env=e)
    check("--admin [::1]:1 (nothing there): exit 3 with a message",
          r.returncode == 3 and b"cannot connect to ::1:1" in r.stderr, repr(r.stderr))

    # An unhealthy daemon: a test build's wedged worker makes /health 503.
    if "--fault-wedge-after" not in subprocess.run([SLOTD, "--help"], capture_output=True,
                                                   text=True).stdout:
        print("SKIP: health at 503: the daemon is not a test build (SLOTD_FAULT_INJECTION)")
    else:
        w = Daemon(work, "--fault-wedge-after", "1", "--wedge-timeout", "1")
        try:
            with socket.create_connection(("127.0.0.1", w.port), timeout=10 * SCALE) as s:
                s.sendall(b'{"op":"logits","tokens":[1]}\n')  # holds its worker
                limit = time.monotonic() + 20 * SCALE
                while w.http("/health")[0] != 503 and time.monotonic() < limit:
                    time.sleep(0.1)
                r = cli(w, "health", env=env)
                check("health at 503: '(error) http 503: status: ...', exit 1",
                      r.returncode == 1 and r.stdout.decode().startswith(
                          "(error) http 503: status: a worker is stuck on one job\n"),
                      "rc %d %r" % (r.returncode, r.stdout))
                r = cli(w, "--raw", "health", env=env)
                check("health --raw at 503: the body, exit 1",
                      r.returncode == 1 and r.stdout == w.http("/health")[1], repr(r.stdout))
                w.proc.send_signal(signal.SIGUSR1)  # lets the job go
                s.makefile("rb").readline()
        finally:
            check("the wedged daemon exits 0 on SIGTERM", w.stop() == 0)

    # Local: help, unknown commands, usage.
    r = cli(d, "help", env=env)
    out = r.stdout.decode()
    check("help lists every command",
          r.returncode == 0 and all(re.search(r"^  %s\b" % c, out, re.M) for c in
                                    ["start", "step", "finish", "logits", "generate", "stats",
                                     "health", "metrics", "help", "quit"]), out)
    # The model names the help gives are the daemon's presets (core/model.h's
    # list, which its refusal of an unknown model names), all and in order.
    known = re.search(r"\(known: ([a-z0-9,]+)\)",
                      subprocess.run([SLOTD, "--models", "bogus"], capture_output=True,
                                     timeout=60 * SCALE).stderr.decode())
    named = re.search(r"^MODEL: (.*?)\s*$", out, re.M)
    check("help names every preset, as core/model.h lists them",
          known is not None and named is not None and
          named.group(1).split(", ") == known.group(1).split(","),
          "%r against %r" % (named and named.group(1), known and known.group(1)))
    r = cli(d, "help", "generate", env=env)
    check("help COMMAND: its usage", r.returncode == 0 and
          r.stdout.decode().startswith("  generate [-m MODEL] [--cache] [DECODE...] STEPS TOKEN...\n"), repr(r.stdout))
    before = d.requests_total()
    r = cli(d, "bogus thing", "stats", env=env)
    after = d.requests_total()
    check("unknown command: '(error) unknown command 'bogus'; type help' on stderr",
          r.stderr == b"(error) unknown command 'bogus'; type help\n", repr(r.stderr))
    check("unknown command: never sent (the daemon counted only the stats after it)",
          after == before + 1, "requests_total %d -> %d" % (before, after))
    check("unknown command: the next command still runs, and the exit status is 1",
          r.returncode == 1 and r.stdout.decode().startswith("cache_entries: "), r.stdout.decode())
    # Too few or too many words: what is missing, or the first word too
    # many, and the usage; an extra word is never dropped in silence.
    for line, msg in [("step", "(error) step: missing ID; usage: step ID [N] [DECODE...]"),
                      ("start a 1 x", "(error) start: token 'x' is not an integer"),
                      ("step a 1 2", "(error) step: one argument too many, '2'; usage: step ID [N] [DECODE...]"),
                      ("step a 1 2 3",
                       "(error) step: 2 arguments too many, from '2'; usage: step ID [N] [DECODE...]"),
                      ("finish", "(error) finish: missing ID; usage: finish ID"),
                      ("append a", "(error) append: missing TOKEN; usage: append ID TOKEN..."),
                      ("append a 1 y", "(error) append: token 'y' is not an integer"),
                      ("fork b", "(error) fork: missing FROM; usage: fork ID FROM"),
                      ("fork b a c", "(error) fork: one argument too many, 'c'; usage: fork ID FROM"),
                      ("finish a b", "(error) finish: one argument too many, 'b'; usage: finish ID"),
                      ("start", "(error) start: missing ID; usage: start ID [-m MODEL] TOKEN..."),
                      ("start a -m", "(error) start: missing MODEL after -m; "
                       "usage: start ID [-m MODEL] TOKEN..."),
                      ("generate -m small", "(error) generate: missing STEPS; "
                       "usage: generate [-m MODEL] [--cache] [DECODE...] STEPS TOKEN..."),
                      ("health stats", "(error) health: takes no arguments, got 'stats' "
                       "(two commands? give each its own line)"),
                      ("stats now", "(error) stats: takes no arguments, got 'now'"),
                      ("metrics a b",
                       "(error) metrics: one argument too many, 'b'; usage: metrics [PATTERN]"),
                      ("help step x", "(error) help: one argument too many, 'x'; usage: help [COMMAND]"),
                      ("quit now", "(error) quit: takes no arguments, got 'now'"),
                      ("step a --temp x", "(error) step: temperature 'x' is not a number"),
                      ("step a --stop x", "(error) step: stop token 'x' is not an integer"),
                      ("logits -x 1", "(error) logits: unknown option '-x'")]:
        before = d.requests_total()
        r = cli(d, line, env=env)
        check("'%s': '%s', exit 1, nothing sent" % (line, msg),
              r.returncode == 1 and r.stderr.decode() == msg + "\n" and r.stdout == b""
              and d.requests_total() == before,
              "rc %d %r" % (r.returncode, r.stderr))
    # As the words of the command line, the way the guide's reader typed it.
    r = cli(d, "health", "stats", env=env)
    check("'slotd-cli health stats': the same error, exit 1, nothing asked",
          r.returncode == 1 and r.stdout == b"" and r.stderr.decode().startswith(
              "(error) health: takes no arguments, got 'stats'"),
          "rc %d %r %r" % (r.returncode, r.stdout, r.stderr))

    # Exit statuses.
    r = cli(d, "finish nobody", "stats", env=env)
    check("an error reply: '(error) unknown_id: ...', later commands run, exit 1",
          r.returncode == 1 and r.stdout.decode().startswith(
              "(error) unknown_id: finish: no live session 'nobody' on this connection\ncache_entries: "),
          "rc %d %r" % (r.returncode, r.stdout))
    r = cli(d, "--raw", "{bad", env=env)
    check("--raw with an error reply: the line as it came, exit 1",
          r.returncode == 1 and r.stdout == d.lines(["{bad"])[0], repr(r.stdout))
    r = cli(d, stdin=b"start s 1\nstep s 9999\nfinish s\n", env=env)
    check("from stdin, one error reply among successes: exit 1",
          r.returncode == 1 and len(r.stdout.decode().splitlines()) == 3
          and r.stdout.decode().splitlines()[1].startswith("(error) "), r.stdout.decode())
    r = cli(d, "start s 1", "finish s", "quit", "stats", env=env)
    check("quit ends the commands, exit 0", r.returncode == 0 and len(r.stdout.splitlines()) == 2,
          r.stdout.decode())
    r = subprocess.run([CLI, "-p", "1", "stats"], capture_output=True, timeout=60 * SCALE, env=e)
    check("no daemon: exit 3, 'cannot connect' on stderr",
          r.returncode == 3 and b"cannot connect to 127.0.0.1:1" in r.stderr, repr(r.stderr))
    r = subprocess.run([CLI, "-p", "x"], capture_output=True, timeout=60 * SCALE, env=e)
    check("a bad option: exit 2", r.returncode == 2, "rc %d" % r.returncode)
    r = subprocess.run([CLI, "--help"], capture_output=True, timeout=60 * SCALE, env=e)
    out = r.stdout.decode()
    check("--help shows the commands and the exit statuses",
          r.returncode == 0 and "generate [-m MODEL] [--cache] [DECODE...] STEPS TOKEN..." in out
          and "--temp T --top-k K --top-p P --seed S" in out
          and "Exit status" in out and "SLOTD_HISTFILE" in out and "NO_COLOR" in out, out)
    check("--help names --auth-token-file, SLOTD_AUTH_TOKEN_FILE and the auth command",
          "--auth-token-file PATH" in out and "SLOTD_AUTH_TOKEN_FILE" in out
          and "auth TOKEN" in out, out)


# ---- With a token ----

def token_file(work, name, token, mode=0o600):
    path = os.path.join(work, name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.write(fd, (token + "\n").encode())
    os.close(fd)
    os.chmod(path, mode)
    return path


def auth_daemon(work):
    """A daemon that wants a token: (daemon, token, its file)."""
    sub = os.path.join(work, "auth")
    os.makedirs(sub, exist_ok=True)
    token = secrets.token_hex(16)
    path = token_file(sub, "token", token)
    return Daemon(sub, "--auth-token-file", path), token, path


def run_auth_batch(plain, work):
    d, token, path = auth_daemon(work)
    env = {"HOME": work}
    wrong = token_file(work, "wrong", secrets.token_hex(16))
    seen = []  # every run's output, searched for the token at the end

    def run(*args, env=env, stdin=None):
        r = cli(d, *args, env=env, stdin=stdin)
        seen.append(r.stdout + r.stderr)
        return r

    try:
        r = run("stats")
        check("token daemon, no token: '(error) auth_required: ...', exit 1",
              r.returncode == 1 and r.stdout.decode().startswith("(error) auth_required: "),
              "rc %d %r %r" % (r.returncode, r.stdout, r.stderr))
        r = run("metrics")
        check("token daemon, no token: metrics is '(error) http 401', exit 1",
              r.returncode == 1 and r.stdout.decode().startswith("(error) http 401"),
              "rc %d %r" % (r.returncode, r.stdout))
        r = run("health")
        check("token daemon, no token: health stays open, exit 0",
              r.returncode == 0 and r.stdout == b"status: ok\n", "rc %d %r" % (r.returncode, r.stdout))

        cmds = ["start a 1 2 3", "step a 2", "finish a"]
        want = [fmt_reply(l) for l in plain.lines(['{"op":"start","id":"a","prompt":[1,2,3]}',
                                                  '{"op":"step","id":"a","n":2}',
                                                  '{"op":"finish","id":"a"}'])]
        r = run("--auth-token-file", path, *cmds, "stats")
        got = r.stdout.decode().splitlines()
        check("--auth-token-file: start, step, finish, stats work, exit 0, nothing on stderr",
              r.returncode == 0 and r.stderr == b"" and got[:3] == want
              and len(got) == 4 and got[3].startswith("cache_entries: "),
              "rc %d %r %r" % (r.returncode, r.stdout, r.stderr))
        r = run("--auth-token-file", path, stdin=b"start b 1\nfinish b\nstats\n")
        check("--auth-token-file, lines from stdin: exit 0",
              r.returncode == 0 and len(r.stdout.splitlines()) == 3 and b"(error)" not in r.stdout,
              "rc %d %r %r" % (r.returncode, r.stdout, r.stderr))
        r = run("--auth-token-file", path, "health")
        check("--auth-token-file: health, exit 0",
              r.returncode == 0 and r.stdout == b"status: ok\n", "rc %d %r" % (r.returncode, r.stdout))
        r = run("--auth-token-file", path, "metrics", "slotd_requests_total")
        check("--auth-token-file: metrics (Bearer) answers 200, exit 0",
              r.returncode == 0 and r.stdout.startswith(b"slotd_requests_total{"),
              "rc %d %r %r" % (r.returncode, r.stdout, r.stderr))
        r = run("--auth-token-file", path, "--raw", "metrics", "slotd_auth_failures_total")
        failures0 = int(r.stdout.split()[-1]) if r.returncode == 0 and r.stdout else -1
        r = run("stats", env=dict(env, SLOTD_AUTH_TOKEN_FILE=path))
        check("SLOTD_AUTH_TOKEN_FILE: stats works, exit 0",
              r.returncode == 0 and r.stdout.startswith(b"cache_entries: "),
              "rc %d %r %r" % (r.returncode, r.stdout, r.stderr))
        r = run("--auth-token-file", path, "stats", env=dict(env, SLOTD_AUTH_TOKEN_FILE=wrong))
        check("--auth-token-file wins over SLOTD_AUTH_TOKEN_FILE",
              r.returncode == 0 and r.stdout.startswith(b"cache_entries: "),
              "rc %d %r %r" % (r.returncode, r.stdout, r.stderr))
        r = cli(plain, "--auth-token-file", path, "stats", env=env)
        seen.append(r.stdout + r.stderr)
        check("a token file given to a daemon without a token: accepted, exit 0",
              r.returncode == 0 and r.stdout.startswith(b"cache_entries: "),
              "rc %d %r %r" % (r.returncode, r.stdout, r.stderr))

        r = run("--auth-token-file", wrong, stdin=b"stats\nhealth\n")
        check("a wrong token: '(error) auth_failed: ...' on stderr, exit 3, nothing run",
              r.returncode == 3 and r.stdout == b""
              and r.stderr.decode().startswith("(error) auth_failed: "),
              "rc %d %r %r" % (r.returncode, r.stdout, r.stderr))
        r = run("metrics", "slotd_auth_failures_total", env=dict(env, SLOTD_AUTH_TOKEN_FILE=path))
        check("... and the daemon counted it",
              r.returncode == 0 and int(r.stdout.split()[-1]) == failures0 + 1,
              "before %d, %r" % (failures0, r.stdout))
        r = run("--auth-token-file", wrong, "metrics")
        check("a wrong token on the admin port: '(error) http 401', exit 1",
              r.returncode == 1 and r.stdout.decode().startswith("(error) http 401"),
              "rc %d %r" % (r.returncode, r.stdout))

        r = run("auth " + token, "stats")
        check("'auth TOKEN' then stats: 'ok: true', stats, exit 0",
              r.returncode == 0 and r.stdout.decode().startswith("ok: true\ncache_entries: "),
              "rc %d %r %r" % (r.returncode, r.stdout, r.stderr))
        r = run("auth " + secrets.token_hex(16), "stats")
        check("'auth' with a wrong token: '(error) auth_failed: ...', exit 3, stats not run",
              r.returncode == 3 and r.stdout.decode().startswith("(error) auth_failed: ")
              and b"cache_entries" not in r.stdout,
              "rc %d %r %r" % (r.returncode, r.stdout, r.stderr))
        r = run("auth " + token, "metrics slotd_requests_total")
        check("'auth TOKEN' then metrics: the admin port gets the token too (200), exit 0",
              r.returncode == 0 and r.stdout.decode().startswith("ok: true\nslotd_requests_total{"),
              "rc %d %r %r" % (r.returncode, r.stdout[:300], r.stderr))
        r = run("auth " + token, "health", "metrics slotd_auth_failures_total")
        check("... whatever comes between: health, then metrics, exit 0",
              r.returncode == 0 and r.stdout.decode().startswith(
                  "ok: true\nstatus: ok\nslotd_auth_failures_total "),
              "rc %d %r %r" % (r.returncode, r.stdout[:300], r.stderr))
        r = run("auth " + secrets.token_hex(16), "metrics")
        check("'auth' with a wrong token, then metrics: auth_failed, exit 3, metrics not run",
              r.returncode == 3 and r.stdout.decode().startswith("(error) auth_failed: ")
              and b"http" not in r.stdout, "rc %d %r %r" % (r.returncode, r.stdout, r.stderr))
        r = run("auth")
        check("'auth' alone: '(error) auth: missing TOKEN; usage: auth TOKEN', exit 1",
              r.returncode == 1 and r.stderr == b"(error) auth: missing TOKEN; usage: auth TOKEN\n",
              "rc %d %r" % (r.returncode, r.stderr))
        r = run("auth " + token + " " + token)
        check("'auth' with two words: refused, exit 1, neither word shown",
              r.returncode == 1 and r.stdout == b""
              and r.stderr == b"(error) auth: takes one TOKEN, got 2 words; usage: auth TOKEN\n",
              "rc %d %r" % (r.returncode, r.stderr))

        for mode in (0o644, 0o640, 0o604, 0o620):
            loose = token_file(work, "loose", token, mode)
            r = run("--auth-token-file", loose, "health")
            check("a token file of mode %03o: refused, exit 2, nothing run" % mode,
                  r.returncode == 2 and r.stdout == b"" and b"chmod 600" in r.stderr,
                  "rc %d %r %r" % (r.returncode, r.stdout, r.stderr))
        r = run("health", env=dict(env, SLOTD_AUTH_TOKEN_FILE=loose))
        check("... also from SLOTD_AUTH_TOKEN_FILE, which the message names",
              r.returncode == 2 and b"SLOTD_AUTH_TOKEN_FILE" in r.stderr, repr(r.stderr))
        r = run("--auth-token-file", os.path.join(work, "none"), "health")
        check("a token file that is not there: exit 2",
              r.returncode == 2 and b"cannot open" in r.stderr, repr(r.stderr))
        short = token_file(work, "short", "abc")
        r = run("--auth-token-file", short, "health")
        check("a token too short: exit 2, the token not shown",
              r.returncode == 2 and b"16 to 4096 bytes" in r.stderr, repr(r.stderr))

        leaks = [o for o in seen if token.encode() in o]
        check("the token appears in no output (%d runs)" % len(seen), not leaks, repr(leaks[:1]))
    finally:
        rc = d.stop()
        check("the token daemon exits 0 on SIGTERM", rc == 0, "exit %r" % rc)


# ---- At a terminal ----

class Term:
    """slotd-cli on a pseudo-terminal, 120 columns wide."""

    def __init__(self, d, env, *args):
        import pty
        import fcntl
        import struct
        import termios
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.execve(CLI, [CLI, "-p", str(d.port), "-a", str(d.admin), *args], env)
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 120, 0, 0))
        self.out = b""
        self.mark = 0

    def plain(self):
        """The output without colour sequences."""
        return re.sub(rb"\x1b\[[0-9;]*m", b"", self.out)

    def read_until(self, pattern, seconds=10):
        """Reads until `pattern` (a regex on bytes) matches the output (less
        its colour sequences) after the last match; returns the match or
        None."""
        limit = time.monotonic() + seconds * SCALE
        rx = re.compile(pattern, re.S)
        while True:
            m = rx.search(self.plain(), self.mark)
            if m:
                self.mark = m.end()
                return m
            left = limit - time.monotonic()
            if left <= 0:
                return None
            r, _, _ = select.select([self.fd], [], [], left)
            if r:
                try:
                    b = os.read(self.fd, 65536)
                except OSError:
                    b = b""
                if not b:
                    return None
                self.out += b

    def pump(self, seconds):
        """Reads whatever comes for `seconds`."""
        limit = time.monotonic() + seconds
        while (left := limit - time.monotonic()) > 0:
            r, _, _ = select.select([self.fd], [], [], left)
            if not r:
                break
            try:
                b = os.read(self.fd, 65536)
            except OSError:
                b = b""
            if not b:
                break
            self.out += b

    def skip(self):
        """Forgets the output so far for read_until."""
        self.pump(0.2 * SCALE)
        self.mark = len(self.plain())

    def screen_line(self):
        """The last line as a terminal would show it: carriage returns,
        backspaces, cursor columns (ESC [ n G, C, D) and erasures (ESC [ K)
        applied."""
        line, col = [], 0
        for m in re.finditer(rb"\x1b\[([0-9;]*)([A-Za-z])|(.)", self.out, re.S):
            if m.group(3) is not None:
                ch = m.group(3)
                if ch == b"\n":
                    line, col = [], 0
                elif ch == b"\r":
                    col = 0
                elif ch == b"\b":
                    col = max(0, col - 1)
                elif ch >= b" ":
                    line[col:col + 1] = [ch]
                    col += 1
                continue
            n = int(m.group(1) or 1) if m.group(1).isdigit() else 1
            op = m.group(2)
            if op == b"G":
                col = n - 1
            elif op == b"C":
                col += n
            elif op == b"D":
                col = max(0, col - n)
            elif op == b"K":
                del line[col:]
            while len(line) < col:
                line.append(b" ")
        return b"".join(line).decode(errors="replace")

    def send(self, s):
        os.write(self.fd, s.encode())

    def prompt(self):
        """Waits for the prompt after the last match, then a moment for
        libedit to take the terminal: keys typed before that are echoed by
        the terminal as well (harmless, but noise on the screen)."""
        m = self.read_until(PROMPT)
        self.pump(0.1 * SCALE)
        return m

    def line_is(self, want, seconds=10):
        """Waits until the screen's last line starts with `want`."""
        limit = time.monotonic() + seconds * SCALE
        while not self.screen_line().startswith(want) and time.monotonic() < limit:
            self.pump(0.1)
        return self.screen_line().startswith(want)

    def wait_exit(self, seconds=10):
        limit = time.monotonic() + seconds * SCALE
        while time.monotonic() < limit:
            r, _, _ = select.select([self.fd], [], [], 0.1)
            if r:
                try:
                    b = os.read(self.fd, 65536)
                    self.out += b
                except OSError:
                    pass
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid == self.pid:
                os.close(self.fd)
                return os.waitstatus_to_exitcode(status)
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        os.close(self.fd)
        return None

    def text(self):
        return self.out.decode(errors="replace")


PROMPT = rb"slotd> "


def pty_env(work, hist, **extra):
    """The environment of slotd-cli at a terminal: a clean one with HOME,
    TERM, the history file and the sanitizers' options passed through."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "TERM": "xterm", "HOME": work,
           "SLOTD_HISTFILE": hist}
    for k in ("ASAN_OPTIONS", "UBSAN_OPTIONS", "TSAN_OPTIONS", "LSAN_OPTIONS"):
        if k in os.environ:
            env[k] = os.environ[k]
    env.update(extra)
    return env


def read_saved(path):
    """The text of a history file, or "" if there is none."""
    try:
        with open(path, encoding="latin-1") as f:
            return f.read()
    except OSError:
        return ""


def history_lines(saved):
    """The lines of a libedit history file, its escapes (\\040 for a
    blank) decoded."""
    lines = saved.splitlines()
    if lines[:1] == ["_HiStOrY_V2_"]:
        lines = lines[1:]
    return [re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), l) for l in lines]


def run_pty(d, work):
    hist = os.path.join(work, "hist")
    env = pty_env(work, hist)

    t = Term(d, env)
    check("a prompt 'slotd> '", t.prompt() is not None, t.text())
    t.send("start a 1 2 3\r")
    check("start at the prompt", t.read_until(rb"entries: 3  cached: 0\r\n") is not None, t.text())
    t.prompt()
    t.send("step a 2\r")
    check("step a 2: entries 5", t.read_until(rb"entries: 5\r\n") is not None, t.text())
    t.prompt()
    t.send("\x1b[A")
    check("arrow-up brings back 'step a 2'", t.line_is("slotd> step a 2"), repr(t.screen_line()))
    t.send("\r")
    # Only a second step of the same session gives these tokens and 7 entries.
    check("... and Enter runs it again: tokens [0 3], entries 7",
          t.read_until(rb"tokens: \[0 3\].*entries: 7\r\n") is not None, t.text())
    check("replies are coloured at a terminal", COLOUR_KEY in t.text(), repr(t.text()[-300:]))
    t.prompt()
    t.skip()
    t.send("sta\t")
    t.pump(0.3 * SCALE)
    check("Tab after 'sta' (start, stats): the bell, the line stays 'slotd> sta'",
          b"\x07" in t.plain()[t.mark:] and t.screen_line() == "slotd> sta", repr(t.screen_line()))
    t.send("\t")
    check("a second Tab lists both candidates, start and stats, and the line comes back",
          t.read_until(rb"\r\nstart\s+stats\s*\r\n") is not None and t.line_is("slotd> sta"),
          repr(t.text()[-200:]))
    t.send("t\t")
    check("'stat' and Tab completes the line to 'slotd> stats '", t.line_is("slotd> stats "),
          repr(t.screen_line()))
    t.send("\r")
    check("... and Enter runs stats", t.read_until(rb"cache_entries: .*live_sessions: ") is not None,
          repr(t.text()))
    t.prompt()
    t.send("fin\ta\r")
    check("'fin' and Tab completes to 'finish ': finish a runs",
          t.read_until(rb"released: 7\r\n") is not None, repr(t.text()))
    t.prompt()
    t.send("bogus\r")
    check("an unknown command at the prompt: said, and the prompt comes back",
          t.read_until(rb"unknown command 'bogus'; type help\r\n") is not None
          and t.prompt() is not None, repr(t.text()))
    t.send("quit\r")
    rc = t.wait_exit()
    check("quit: exit 0 (errors at the prompt do not count)", rc == 0, "exit %r" % rc)
    saved = read_saved(hist)
    check("history saved in $SLOTD_HISTFILE", "bogus" in saved and "finish" in saved, repr(saved))
    lines = history_lines(saved)
    check("the Tab-completed 'stats ' is saved as typed again: 'stats', no line ends in a blank",
          "stats" in lines and not [l for l in lines if l != l.rstrip(" \t")],
          repr(lines))
    check("history file mode 0600", os.path.exists(hist) and (os.stat(hist).st_mode & 0o777) == 0o600)

    t = Term(d, env)
    t.prompt()
    t.send("\x1b[A")
    check("after a restart, arrow-up brings back the last command ('quit')",
          t.line_is("slotd> quit"), repr(t.screen_line()))
    t.send("\x1b[A\x1b[A")
    check("... and further up 'finish a'", t.line_is("slotd> finish a"), repr(t.screen_line()))
    t.send("\x1b[B\x1b[B\x1b[B")
    t.send("start a 1 2 3\r")
    check("down past the newest line gives an empty line to type on",
          t.read_until(rb"entries: 3  cached: 0\r\n") is not None, repr(t.text()))
    t.prompt()
    t.send("\x1b[A" * 6)
    check("six lines up: 'step a 2' of the first run",
          t.line_is("slotd> step a 2"), repr(t.screen_line()))
    t.send("\r")
    check("... run on the new session: entries 5", t.read_until(rb"entries: 5\r\n") is not None,
          repr(t.text()))
    t.prompt()
    t.send("\x04")
    rc = t.wait_exit()
    check("^D leaves with exit 0", rc == 0, "exit %r" % rc)

    env2 = dict(env, NO_COLOR="1", SLOTD_HISTFILE="")
    t = Term(d, env2)
    t.prompt()
    t.send("stats\r")
    check("NO_COLOR: no colour at a terminal",
          t.read_until(rb"cache_entries.*" + PROMPT) is not None and COLOUR_KEY not in t.text(),
          repr(t.text()))
    t.send("quit\r")
    check("NO_COLOR: exit 0", t.wait_exit() == 0)
    check("SLOTD_HISTFILE empty: no history written", not os.path.exists(os.path.join(work, ".slotd_history")))


def run_auth_pty(plain, work):
    d, token, path = auth_daemon(work)
    hist = os.path.join(work, "hist-auth")
    env = pty_env(work, hist, NO_COLOR="1")
    try:
        t = Term(d, env)
        t.prompt()
        t.send("stats\r")
        check("token daemon, at the prompt without a token: auth_required",
              t.read_until(rb"\(error\) auth_required: ") is not None, t.text())
        t.prompt()
        t.send("auth " + token + "\r")
        check("'auth TOKEN' at the prompt: ok", t.read_until(rb"ok: true\r\n") is not None, t.text())
        t.prompt()
        t.send("stats\r")
        check("... then stats works", t.read_until(rb"cache_entries: ") is not None, t.text())
        t.prompt()
        t.send("metrics slotd_live_sessions\r")
        check("... and metrics: the admin port gets the token too (no http 401)",
              t.read_until(rb"(slotd_live_sessions \d+|\(error\) http 401)[^\r]*\r\n") is not None
              and "http 401" not in t.text(), t.text()[-300:])
        t.prompt()
        t.send("AUTH " + token + "\r")
        t.prompt()
        t.send('{"op":"auth","token":"%s"}\r' % token)
        t.prompt()
        t.send("\x1b[A")
        check("arrow-up skips the auth lines: 'metrics slotd_live_sessions'",
              t.line_is("slotd> metrics slotd_live_sessions"),
              repr(t.screen_line()))
        t.send("\x1b[Bquit\r")
        rc = t.wait_exit()
        check("quit: exit 0", rc == 0, "exit %r" % rc)
        saved = read_saved(hist)
        check("the history has stats, but no auth line and not the token",
              "stats" in saved and token not in saved and "auth" not in saved.lower(), repr(saved))

        t = Term(d, env, "--auth-token-file", path)
        t.prompt()
        t.send("start a 1 2 3\r")
        check("--auth-token-file at the prompt: start works",
              t.read_until(rb"entries: 3  cached: 0\r\n") is not None, t.text())
        t.prompt()
        t.send("metrics slotd_live_sessions\r")
        check("... and metrics", t.read_until(rb"slotd_live_sessions 1\r\n") is not None, t.text())
        t.prompt()
        t.send("quit\r")
        rc = t.wait_exit()
        check("quit: exit 0", rc == 0, "exit %r" % rc)
        check("the token appears nowhere on the terminal but where it was typed",
              t.text().count(token) == 0, repr(t.text()))
    finally:
        rc = d.stop()
        check("the token daemon exits 0 on SIGTERM", rc == 0, "exit %r" % rc)


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "batch"
    for b in (SLOTD, CLI):
        if not os.access(b, os.X_OK):
            print("FAIL: no binary at %s (build first)" % b)
            return 1
    with tempfile.TemporaryDirectory(prefix="slotd-cli.") as work:
        d = Daemon(work)
        try:
            (run_pty if mode == "pty" else run_batch)(d, work)
            (run_auth_pty if mode == "pty" else run_auth_batch)(d, work)
        except Exception as e:  # a broken expectation must fail, not vanish
            check("no exception", False, repr(e))
        finally:
            rc = d.stop()
            check("the daemon exits 0 on SIGTERM", rc == 0, "exit %r" % rc)
            if failed:
                print(open(os.path.join(work, "daemon.log"), errors="replace").read()[-2000:])
    print("cli %s: %d passed, %d failed" % (mode, passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
