#!/usr/bin/env python3
"""The server (examples/server.cpp) end to end on the bundled tiny model, over loopback (ctest: server.<case>).

    test_server.py CASE --server PATH --reference PATH --work DIR

Every case starts its own server on a free port (--port 0; it prints the port) and stops it with SIGTERM,
expecting exit status 0. Every wait is bounded (socket timeouts, deadlines). Reference outputs come from
server_reference: the library's generate() alone, one fresh session per request (tests/server/reference.cpp).

Cases:
  openai      the official `openai` npm package (pinned; fetched by tests/server/fetch_openai.sh into DIR, SKIPPED
              without npm, node or the registry): models list, chat and completions, streamed and not; each equal
              to the reference; an unknown model raises the client's NotFoundError
  sse         curl: the raw framing of server-sent events (headers, "data: {json}\\n\\n" events, role chunk,
              one finish chunk, usage chunk with include_usage, "data: [DONE]" last), chat and completions
  errors      every error class: 400 (malformed JSON, wrong types, unknown role, n > 1, prompt past the context,
              ...), 401 (missing / wrong key), 404 (model, path), 413 (Content-Length and chunked); OpenAI's
              error JSON each time and the server serving on after each
  disconnect  clients leaving mid-generation (streamed and not): their sessions are freed (/metrics)
  first_tokens  8 requests sent together are read one prompt a step (/metrics), each equal to the reference;
                --prefill-priority: no decode rows in a step that reads a prompt (--log-steps)
  concurrent  64 streaming clients at once (16 sessions, the rest queued; shared system prompts through the
              prefix cache): every response complete and equal to its request run alone
  overflow    a full queue answers 429 with Retry-After; the server serves again once it drains
  slow_body   a body trickling in gets 408 at the body deadline, a stalled one is closed after the read timeout,
              stalled headers too; other clients are served meanwhile
  shutdown    SIGTERM with requests in flight: they finish (or, past --shutdown-timeout, end cancelled) and
              the server exits 0; new requests meanwhile get 503
  prefix      a shared system prompt is prefilled once and reused (cached_tokens, /metrics), results equal to
              the reference; a later turn starts from the cached system prompt
Python 3 standard library only.
"""

import argparse
import atexit
import ctypes
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ARGS = None
SERVERS = []  # killed at exit, whatever ends the test


@atexit.register
def _kill_servers():
    for s in SERVERS:
        if s.proc.poll() is None:
            s.proc.kill()


def _die_with_parent():
    """Child side of Popen: SIGKILL when this test process dies (a ctest timeout), not an orphaned server."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def fail(why):
    sys.stderr.write(f"FAIL: {why}\n")
    sys.exit(1)


def check(cond, why):
    if not cond:
        fail(why)


def skip(why):
    bar = "#" * 100
    print(f"{bar}\n##  SKIPPED: {why}\n{bar}")
    sys.exit(0)


# ---- the server process ----


class Server:
    def __init__(self, *flags, name="server"):
        os.makedirs(ARGS.work, exist_ok=True)
        self.log_path = os.path.join(ARGS.work, f"{name}.{os.getpid()}.log")
        self.log = open(self.log_path, "w")
        env = dict(os.environ)  # under TSan: ignore the uninstrumented cpp-httplib (tsan.supp says why)
        env["TSAN_OPTIONS"] = ":".join(filter(None, [env.get("TSAN_OPTIONS"), "suppressions=" +
                                                     os.path.join(HERE, "tsan.supp")]))
        self.proc = subprocess.Popen([ARGS.server, "--cpu", "--port", "0", *flags], stdout=subprocess.PIPE,
                                     stderr=self.log, text=True, preexec_fn=_die_with_parent, env=env)
        SERVERS.append(self)
        line = [None]

        def read_line():
            line[0] = self.proc.stdout.readline()

        t = threading.Thread(target=read_line, daemon=True)
        t.start()
        t.join(60)
        m = re.match(r"listening on http://([\d.]+):(\d+)", line[0] or "")
        if not m:
            self.proc.kill()
            fail(f"the server did not start: stdout {line[0]!r}; log:\n{self.logtext()}")
        self.host, self.port = m.group(1), int(m.group(2))

    def logtext(self):
        self.log.flush()
        with open(self.log_path) as f:
            return f.read()

    def stop(self, timeout=30, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            fail(f"the server did not exit within {timeout} s of SIGTERM; log:\n{self.logtext()}")
        check(rc == 0, f"the server exited with status {rc}; log:\n{self.logtext()}")
        return rc

    def conn(self, timeout=60):
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def request(self, method, path, body=None, headers=None, timeout=60):
        c = self.conn(timeout)
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        h = {"Content-Type": "application/json"} if body is not None else {}
        h.update(headers or {})
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, data

    def json(self, method, path, body=None, headers=None, want=200):
        status, h, data = self.request(method, path, body, headers)
        check(status == want, f"{method} {path}: HTTP {status}, wanted {want}: {data[:500]!r}")
        return json.loads(data)

    def metrics(self):
        status, _, data = self.request("GET", "/metrics")
        check(status == 200, f"/metrics: HTTP {status}")
        out = {}
        for line in data.decode().splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out

    def wait_metric(self, name, pred, timeout=15):
        deadline = time.time() + timeout
        while True:
            v = self.metrics().get(name, 0)
            if pred(v):
                return v
            if time.time() > deadline:
                fail(f"/metrics {name} = {v} after {timeout} s")
            time.sleep(0.05)

    def healthy(self):
        status, _, data = self.request("GET", "/health", timeout=10)
        check(status == 200, f"/health: HTTP {status} {data!r}")


def reference(requests):
    """What generate() alone gives for each request (server_reference)."""
    path = os.path.join(ARGS.work, f"reference.{os.getpid()}.json")
    with open(path, "w") as f:
        json.dump(requests, f)
    p = subprocess.run([ARGS.reference, path], capture_output=True, text=True, timeout=600)
    check(p.returncode == 0, f"server_reference failed: {p.stderr}")
    return json.loads(p.stdout)


def to_body(q, stream=False, endpoint="chat"):
    """A reference request (see reference.cpp) as an OpenAI request body."""
    b = {"model": "mm_bf16", "max_tokens": q.get("max_tokens", 16), "stream": stream, "return_token_ids": True}
    if endpoint == "chat":
        b["messages"] = q["messages"]
        if q.get("thinking"):
            b["chat_template_kwargs"] = {"enable_thinking": True}
    else:
        b["prompt"] = q["prompt"] if "prompt" in q else q["prompt_ids"]
    for k in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed", "ignore_eos", "stop"):
        if k in q:
            b[k] = q[k]
    if stream:
        b["stream_options"] = {"include_usage": True}
    return b


def sse_events(raw):
    """'data: ...' payloads of an event stream, checking the framing."""
    text = raw.decode("utf-8")
    check(text.endswith("\n\n"), f"the stream does not end with a blank line: {text[-200:]!r}")
    events = text[:-2].split("\n\n")
    for e in events:
        check(e.startswith("data: ") and "\n" not in e, f"malformed event {e!r}")
    return [e[len("data: "):] for e in events]


def read_stream(resp):
    """Decoded chunks of a streamed response (http.client undoes the chunked encoding)."""
    payloads = sse_events(resp.read())
    check(payloads[-1] == "[DONE]", f"the stream does not end with [DONE]: {payloads[-3:]!r}")
    return [json.loads(p) for p in payloads[:-1]]


def collect(chunks, endpoint="chat"):
    """content, token ids, finish_reason, usage of a list of stream chunks."""
    content, ids, finish, usage = "", [], None, None
    for c in chunks:
        check("error" not in c, f"error event {c!r}")
        if c.get("usage"):
            usage = c["usage"]
        for ch in c["choices"]:
            content += (ch["delta"].get("content") or "") if endpoint == "chat" else ch["text"]
            ids += ch.get("token_ids", [])
            if ch["finish_reason"]:
                check(finish is None, f"two finish chunks: {chunks!r}")
                finish = ch["finish_reason"]
    return content, ids, finish, usage


def same(got, ref, what):
    for k in ("content", "token_ids", "finish_reason", "completion_tokens", "prompt_tokens"):
        if got[k] != ref[k]:
            fail(f"{what}: {k} differs from generate() alone:\n  server    {got[k]!r}\n  reference {ref[k]!r}")


def stream_request(srv, body, path="/v1/chat/completions", endpoint="chat"):
    c = srv.conn()
    c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        fail(f"streamed {path}: HTTP {r.status} {r.read()[:300]!r}")
    check(r.getheader("Content-Type", "").startswith("text/event-stream"), "not text/event-stream")
    content, ids, finish, usage = collect(read_stream(r), endpoint)
    c.close()
    return {"content": content, "token_ids": ids, "finish_reason": finish,
            "completion_tokens": usage["completion_tokens"] if usage else None,
            "prompt_tokens": usage["prompt_tokens"] if usage else None, "usage": usage}


def whole_request(srv, body, path="/v1/chat/completions", endpoint="chat"):
    j = srv.json("POST", path, body)
    ch = j["choices"][0]
    return {"content": ch["message"]["content"] if endpoint == "chat" else ch["text"], "token_ids": ch["token_ids"],
            "finish_reason": ch["finish_reason"], "completion_tokens": j["usage"]["completion_tokens"],
            "prompt_tokens": j["usage"]["prompt_tokens"], "usage": j["usage"]}


WORDS = ("the sea is wide and the wind is cold on the shore where the old boat lies in the sand while gulls "
         "call over grey water and the light fades slowly behind the hills of the quiet town").split()


def text(n, seed):
    rnd = random.Random(seed)
    return " ".join(rnd.choice(WORDS) for _ in range(n))


def requests_mix(count, seed=1):
    """`count` varied reference requests: chat (some with a shared system prompt) and completions; greedy and
    seeded sampling; stop strings; EOS honoured or ignored."""
    rnd = random.Random(seed)
    systems = [text(20, 100), text(25, 101)] if ARGS.light else [text(60, 100), text(80, 101)]
    words = (2, 6) if ARGS.light else (3, 20)
    out = []
    for i in range(count):
        q = {"max_tokens": rnd.choice([1, 2] if ARGS.light else [2, 4, 6, 8]), "seed": 1000 + i}
        if i % 3 == 0:
            q["temperature"] = 0
        elif i % 3 == 1:
            q.update(temperature=0.9, top_k=40, top_p=0.9, min_p=0.05)
        if i % 4 == 0:
            q["ignore_eos"] = True
        if i % 5 == 0:
            q["stop"] = ["e", "th"]
        if i % 2 == 0:
            msgs = [{"role": "user", "content": text(rnd.randint(*words), i)}]
            if i % 4 == 0:
                msgs.insert(0, {"role": "system", "content": systems[(i // 4) % 2]})
            q["messages"] = msgs
        else:
            q["prompt"] = text(rnd.randint(*words), i)
        out.append(q)
    return out


# ---- cases ----


def case_openai():
    node = shutil.which("node")
    if not node:
        skip("node is not installed: the openai npm client test did not run")
    pkg = os.path.join(ARGS.work, "npm")
    p = subprocess.run([os.path.join(HERE, "fetch_openai.sh"), pkg], capture_output=True, text=True, timeout=400)
    if p.returncode != 0:
        skip(f"the openai npm package could not be fetched (npm registry unreachable?): {p.stderr.strip()[-300:]}")
    srv = Server("--api-key", "test-key")
    qs = [
        {"messages": [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Name a sea."}],
         "max_tokens": 12, "temperature": 0.8, "top_p": 0.9, "seed": 7},
        {"messages": [{"role": "user", "content": "Hello there, how are you?"}], "max_tokens": 10, "temperature": 0,
         "stop": ["e"]},
        {"prompt": "Once upon a time", "max_tokens": 9, "temperature": 0.7, "seed": 3, "ignore_eos": True},
        {"messages": [{"role": "user", "content": "Think first."}], "thinking": True, "max_tokens": 8,
         "temperature": 0, "top_k": 5, "min_p": 0.1},
    ]
    refs = reference(qs)
    spec = os.path.join(ARGS.work, f"openai_requests.{os.getpid()}.json")
    with open(spec, "w") as f:
        json.dump({"chat": [to_body(qs[0]), to_body(qs[1]), to_body(qs[3])],
                   "completion": to_body(qs[2], endpoint="completion")}, f)
    env = dict(os.environ, OPENAI_PKG=os.path.join(pkg, "openai"))
    p = subprocess.run([node, os.path.join(HERE, "openai_client.cjs"), f"http://{srv.host}:{srv.port}/v1",
                        "test-key", spec], capture_output=True, text=True, timeout=120, env=env)
    check(p.returncode == 0, f"openai_client.cjs failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    out = json.loads(p.stdout)
    print(f"openai {out['version']}: models {out['models']}")
    check(out["models"] == ["mm_bf16"], f"models.list: {out['models']!r}")
    for i, (whole, streamed, ref) in enumerate(zip(out["chat"], out["chat_stream"], (refs[0], refs[1], refs[3]))):
        same(whole, ref, f"openai chat.completions.create #{i}")
        same(streamed, ref, f"openai chat.completions.create stream #{i}")
    check(refs[3]["prompt_tokens"] > reference([dict(qs[3], thinking=False)])[0]["prompt_tokens"],
          "the thinking switch did not change the prompt")
    same(out["completion"], refs[2], "openai completions.create")
    same(out["completion_stream"], refs[2], "openai completions.create stream")
    check(out["not_found"] == {"status": 404, "class": "NotFoundError"}, f"unknown model: {out['not_found']!r}")
    check(out["unauthorized"] == {"status": 401, "class": "AuthenticationError"}, f"bad key: {out['unauthorized']!r}")
    srv.stop()


def case_sse():
    curl = shutil.which("curl")
    if not curl:
        skip("curl is not installed: the raw server-sent-events test did not run")
    srv = Server()
    qs = [{"messages": [{"role": "user", "content": "Tell me about the sea."}], "max_tokens": 10, "seed": 5,
           "temperature": 0.9},
          {"prompt": "The wind", "max_tokens": 6, "temperature": 0, "ignore_eos": True}]
    refs = reference(qs)
    for q, ref, path, endpoint in ((qs[0], refs[0], "/v1/chat/completions", "chat"),
                                   (qs[1], refs[1], "/v1/completions", "completion")):
        body = to_body(q, stream=True, endpoint=endpoint)
        del body["return_token_ids"]
        p = subprocess.run([curl, "-sS", "-N", "--max-time", "60", "-D", "-", "-H", "Content-Type: application/json",
                            "-d", json.dumps(body), f"http://{srv.host}:{srv.port}{path}"], capture_output=True,
                           timeout=90)
        check(p.returncode == 0, f"curl failed: {p.stderr!r}")
        head, _, raw = p.stdout.partition(b"\r\n\r\n")
        head = head.decode().lower()
        check(head.startswith("http/1.1 200"), f"status line: {head[:80]!r}")
        check("content-type: text/event-stream" in head, f"headers: {head!r}")
        check("transfer-encoding: chunked" in head, f"headers: {head!r}")
        payloads = sse_events(raw)
        check(payloads[-1] == "[DONE]" and payloads.count("[DONE]") == 1, f"[DONE] must end the stream: {payloads!r}")
        chunks = [json.loads(x) for x in payloads[:-1]]
        ids = {c["id"] for c in chunks}
        check(len(ids) == 1, f"chunks of one stream with several ids: {ids}")
        want_object = "chat.completion.chunk" if endpoint == "chat" else "text_completion"
        check(all(c["object"] == want_object for c in chunks), f"object must be {want_object}")
        if endpoint == "chat":
            check(chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""},
                  f"first chunk: {chunks[0]!r}")
        usage_chunk = chunks[-1]
        check(usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == ref["completion_tokens"],
              f"include_usage: the last chunk carries usage and no choice: {usage_chunk!r}")
        check(all(c["usage"] is None for c in chunks[:-1]), "usage must be null before the last chunk")
        content, _, finish, _ = collect(chunks, endpoint)
        check(content == ref["content"] and finish == ref["finish_reason"],
              f"curl {path}: {content!r} {finish} vs generate(): {ref['content']!r} {ref['finish_reason']}")
        check(chunks[-2]["choices"][0]["finish_reason"] == finish, "the finish chunk comes just before usage")
    srv.stop()


def case_errors():
    srv = Server("--api-key", "sekret", "--max-body-bytes", str(4 << 20))
    key = {"Authorization": "Bearer sekret"}
    chat = "/v1/chat/completions"
    ok_body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}

    def expect(status, code, method, path, body=None, headers=None, raw_headers=None):
        h = dict(key)
        h.update(headers or {})
        st, hd, data = srv.request(method, path, body, h if raw_headers is None else raw_headers)
        check(st == status, f"{method} {path} {str(body)[:80]}: HTTP {st}, wanted {status}: {data[:300]!r}")
        try:
            err = json.loads(data)["error"]
        except Exception:
            fail(f"{method} {path}: HTTP {st} without OpenAI error JSON: {data[:300]!r}")
        check(isinstance(err.get("message"), str) and err["message"] and isinstance(err.get("type"), str),
              f"error JSON: {err!r}")
        check(err.get("code") == code, f"{method} {path}: code {err.get('code')!r}, wanted {code!r}: {err!r}")
        srv.healthy()  # and the server goes on serving
        return hd

    # 401
    expect(401, "invalid_api_key", "POST", chat, ok_body, raw_headers={"Content-Type": "application/json"})
    expect(401, "invalid_api_key", "GET", "/v1/models", raw_headers={"Authorization": "Bearer wrong"})
    expect(401, "invalid_api_key", "POST", chat, ok_body, headers={"Authorization": "sekret"})
    # 400: malformed JSON, wrong types and values
    for body in ('{"messages": [', "not json", "", '{"messages": [{"role": "user", "content": "hi"}]} trailing',
                 "[" * 1000000 + "]" * 1000000, '{"messages": [{"role": "user", "content": ' + "[" * 500000 +
                 "]" * 500000 + "}]}"):
        expect(400, "invalid_json", "POST", chat, body)  # (valid JSON nested 10^6 deep: refused, not a crash)
    for body in ([1, 2], {"messages": "hi"}, {"messages": []}, {"messages": [{"content": "x"}]},
                 {"messages": [{"role": "user", "content": 5}]},
                 dict(ok_body, max_tokens="ten"), dict(ok_body, max_tokens=0), dict(ok_body, max_tokens=1.5),
                 dict(ok_body, temperature="hot"), dict(ok_body, temperature=-1), dict(ok_body, top_p=2),
                 dict(ok_body, stream="yes"), dict(ok_body, stop=5), dict(ok_body, seed="x"),
                 dict(ok_body, top_k=1.5), dict(ok_body, stream_options=3), dict(ok_body, model=7),
                 dict(ok_body, chat_template_kwargs={"enable_thinking": "yes"})):
        expect(400, "invalid_type", "POST", chat, body)
    for role in ("wizard", "tool", "function"):
        expect(400, "invalid_role", "POST", chat, {"messages": [{"role": role, "content": "hi"}]})
    expect(400, "unsupported", "POST", chat, dict(ok_body, n=2))
    expect(400, "invalid_value", "POST", chat, dict(ok_body, stop=["x" * 257]))
    expect(400, "unsupported", "POST", chat, dict(ok_body, logprobs=True))
    expect(400, "unsupported", "POST", chat, dict(ok_body, presence_penalty=0.5))
    expect(400, "unsupported", "POST", chat,
           {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]})
    expect(400, "invalid_type", "POST", "/v1/completions", {"prompt": 5})
    expect(400, "invalid_value", "POST", "/v1/completions", {"prompt": [2, 600, 3]})
    expect(400, "unsupported", "POST", "/v1/completions", {"prompt": ["a", "b"]})
    # 400: prompts past the context (4096 tokens); a completion that would pass it
    expect(400, "context_length_exceeded", "POST", "/v1/completions", {"prompt": [2] + [100] * 4096})
    expect(400, "context_length_exceeded", "POST", chat,
           {"messages": [{"role": "user", "content": text(2000, 1)}], "max_tokens": 4})
    expect(400, "context_length_exceeded", "POST", "/v1/completions", {"prompt": [2, 100], "max_tokens": 4095})
    # 404: model, path
    expect(404, "model_not_found", "POST", chat, dict(ok_body, model="gpt-4"))
    expect(404, "model_not_found", "POST", "/v1/completions", {"prompt": "x", "model": "other"})
    expect(404, "model_not_found", "GET", "/v1/models/other")
    expect(404, "not_found", "GET", "/v1/nothing")
    expect(404, "not_found", "POST", "/v2/chat/completions", ok_body)
    expect(404, "not_found", "GET", chat)
    # 413: a Content-Length over the limit (answered before the body is read: with "Expect: 100-continue" the
    # client never sends it), and a chunked body that grows past the limit
    head = f"POST {chat} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sekret\r\nContent-Type: application/json\r\n"
    for expect_continue in (True, False):
        s = socket.create_connection((srv.host, srv.port), timeout=10)
        s.sendall((head + f"Content-Length: {5 << 20}\r\n" + ("Expect: 100-continue\r\n" if expect_continue else "") +
                   "\r\n").encode() + (b"" if expect_continue else b'{"messages": ' + b" " * 1000))
        reply = recv_all(s)
        check(reply.startswith(b"HTTP/1.1 413") and b"request_too_large" in reply, f"Content-Length: {reply[:300]!r}")
        s.close()
        srv.healthy()
    s = socket.create_connection((srv.host, srv.port), timeout=10)
    s.sendall((head + "Transfer-Encoding: chunked\r\n\r\n").encode())
    try:
        for _ in range(4 * 1024 + 1):
            s.sendall(b"400\r\n" + b" " * 0x400 + b"\r\n")
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server stopped reading at the limit; its answer is waiting
    reply = recv_all(s)
    check(reply.startswith(b"HTTP/1.1 413") and b"request_too_large" in reply, f"chunked body: {reply[:300]!r}")
    srv.healthy()
    # after all that, a request still works
    j = srv.json("POST", chat, ok_body, headers=key)
    check(j["choices"][0]["finish_reason"] in ("stop", "length"), f"{j!r}")
    srv.stop()


def recv_all(s, limit=1 << 20):
    data = b""
    try:
        while len(data) < limit:
            b = s.recv(65536)
            if not b:
                break
            data += b
    except socket.timeout:
        pass
    except ConnectionResetError:
        pass
    return data


def case_disconnect():
    srv = Server()
    base = srv.metrics().get("gemma4_t4_requests_cancelled_total", 0)
    long_body = {"messages": [{"role": "user", "content": "go on"}], "max_tokens": 4000, "ignore_eos": True,
                 "temperature": 0}
    # streamed: read a few events, then hang up
    c = srv.conn()
    c.request("POST", "/v1/chat/completions", body=json.dumps(dict(long_body, stream=True)),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    check(r.status == 200, f"HTTP {r.status}")
    got = r.read1(4096) if hasattr(r, "read1") else r.read(64)
    check(got.startswith(b"data: "), f"first bytes {got[:100]!r}")
    srv.wait_metric("gemma4_t4_active_sessions", lambda v: v == 1)
    c.sock.shutdown(socket.SHUT_RDWR)
    c.close()
    srv.wait_metric("gemma4_t4_active_sessions", lambda v: v == 0)
    srv.wait_metric("gemma4_t4_requests_cancelled_total", lambda v: v >= base + 1)
    # not streamed: hang up while it generates
    s = socket.create_connection((srv.host, srv.port), timeout=10)
    body = json.dumps(long_body).encode()
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    srv.wait_metric("gemma4_t4_active_sessions", lambda v: v == 1)
    s.close()
    srv.wait_metric("gemma4_t4_active_sessions", lambda v: v == 0)
    srv.wait_metric("gemma4_t4_requests_cancelled_total", lambda v: v >= base + 2)
    m = srv.metrics()
    check(m["gemma4_t4_generation_tokens_total"] < 4000, "the generations ran to their end instead of stopping")
    srv.healthy()
    srv.stop()


def run_clients(n, request, timeout):
    """request(i) for i < n, each on its own thread, all at once: the results in order; fails the case on a
    client's error or one still running after `timeout` seconds."""
    results, errors = [None] * n, []

    def run(i):
        try:
            results[i] = request(i)
        except BaseException as e:  # noqa: BLE001 -- reported below
            errors.append(f"client {i}: {e!r}")

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    check(not any(t.is_alive() for t in threads), f"clients still running after {timeout} s")
    check(not errors, "; ".join(errors))
    return results


def case_concurrent():
    srv = Server("--parallel", "16", "--max-queue", "64", "--prefix-cache-min", "16")
    qs = requests_mix(64, seed=2)
    refs = reference(qs[:8] if ARGS.light else qs)  # --light: the rest are checked for completeness only

    def request(i):
        endpoint = "chat" if "messages" in qs[i] else "completion"
        path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
        return stream_request(srv, to_body(qs[i], stream=True, endpoint=endpoint), path, endpoint)

    results = run_clients(len(qs), request, 240)
    for i, (got, ref) in enumerate(zip(results, refs)):
        same(got, ref, f"concurrent client {i} ({'chat' if 'messages' in qs[i] else 'completion'})")
    for i, (got, q) in enumerate(zip(results, qs)):
        check(got["finish_reason"] in ("stop", "length") and got["completion_tokens"] <= q["max_tokens"] and
              (got["finish_reason"] == "stop" or len(got["token_ids"]) == q["max_tokens"]),
              f"concurrent client {i}: incomplete response {got!r}")
    srv.wait_metric("gemma4_t4_active_sessions", lambda v: v == 0)  # (gauges follow the driver's step)
    m = srv.metrics()
    check(m["gemma4_t4_queue_depth"] == 0, "requests left in the queue")
    print(f"64 streams equal to generate() alone; prefix cache hits {m['gemma4_t4_prefix_cache_hits_total']:.0f}")
    srv.stop()


def case_first_tokens():
    """Requests sent together are read one at a time (--prefill-sessions 1, the default), so a request's first
    token waits only for the prompts before it, as in the in-process bench: /metrics counts exactly one prompt per
    step that read prompt rows, however the requests' arrivals fell between steps. With --prefill-sessions 0 the
    prompts may share steps. With --prefill-priority (and --log-steps, which prints every step) no step that reads
    a prompt carries decode rows. All equal generate() alone."""
    n, length = 8, 2 if ARGS.light else 300
    rnd = random.Random(7)
    qs = [{"prompt_ids": [2] + [rnd.randrange(4, 512) for _ in range(length - 1)], "max_tokens": 3,
           "ignore_eos": True, "temperature": 0} for _ in range(n)]
    refs = reference(qs)
    for flags in ((), ("--prefill-sessions", "0", "--prefill-rows", "4096"), ("--prefill-priority", "--log-steps")):
        srv = Server("--prefix-cache", "0", *flags)
        go = threading.Barrier(n, timeout=60)

        def request(i):
            go.wait()
            return stream_request(srv, to_body(qs[i], stream=True, endpoint="completion"), "/v1/completions",
                                  "completion")

        results = run_clients(n, request, 120)
        for i, (got, ref) in enumerate(zip(results, refs)):
            same(got, ref, f"{' '.join(flags) or 'default'}: client {i}")
        srv.wait_metric("gemma4_t4_active_sessions", lambda v: v == 0)
        m = srv.metrics()
        steps = m["gemma4_t4_engine_prompts_per_step_count"]
        check(m["gemma4_t4_engine_prompts_per_step_sum"] == n, "every prompt read in one step (shorter than a step)")
        check(m["gemma4_t4_engine_prompt_rows_total"] == n * length, "prompt rows")
        check(m["gemma4_t4_engine_decode_rows_total"] == n * 3, "decode rows: 3 tokens each, the last fed too")
        check(m["gemma4_t4_engine_steps_total"] >= steps, "steps")
        check(m["gemma4_t4_engine_prompt_step_seconds_count"] == steps, "a prompt-step time for each step with prompts")
        check(m["gemma4_t4_engine_prompt_step_seconds_count"] + m["gemma4_t4_engine_decode_step_seconds_count"]
              == m["gemma4_t4_engine_steps_total"], "a step time for every step")
        check(0 < m["gemma4_t4_driver_between_steps_seconds_count"] < m["gemma4_t4_engine_steps_total"],
              "the driver's time between busy steps")
        if "--prefill-sessions" not in flags:
            check(steps == n and m['gemma4_t4_engine_prompts_per_step_bucket{le="1"}'] == n,
                  f"{n} requests sent together: {steps:.0f} steps read their prompts, wanted one each")
        if "--log-steps" in flags:
            log = srv.logtext()
            logged = [tuple(map(int, g)) for g in
                      re.findall(r"server: step \d+: (\d+) prompts \((\d+) rows\), (\d+) decode rows", log)]
            check(len(logged) == m["gemma4_t4_engine_steps_total"], f"--log-steps: {len(logged)} step lines")
            check(sum(1 for p, _, _ in logged if p > 0) == n, "--log-steps: one line per prompt step")
            check(all(d == 0 for p, _, d in logged if p > 0),
                  "--prefill-priority: a step that read a prompt carried decode rows:\n" + log)
            check(log.count("server: a first token") == n, "--log-steps: a line per first token")
        mean = lambda k: m[k + "_sum"] / max(m[k + "_count"], 1) * 1e3
        print(f"{' '.join(flags) or 'default'}: {n} prompts read in {steps:.0f} steps; mean ms: prompt step "
              f"{mean('gemma4_t4_engine_prompt_step_seconds'):.2f}, decode step "
              f"{mean('gemma4_t4_engine_decode_step_seconds'):.2f}, between steps "
              f"{mean('gemma4_t4_driver_between_steps_seconds'):.3f}")
        srv.stop()


def case_overflow():
    srv = Server("--parallel", "1", "--max-queue", "1")
    long_body = json.dumps({"prompt": "x", "max_tokens": 4000, "ignore_eos": True, "stream": True})
    holders = []
    for expect_active, expect_queue in ((1, 0), (1, 1)):
        c = srv.conn()
        c.request("POST", "/v1/completions", body=long_body, headers={"Content-Type": "application/json"})
        holders.append(c)
        srv.wait_metric("gemma4_t4_active_sessions", lambda v: v == expect_active)
        srv.wait_metric("gemma4_t4_queue_depth", lambda v: v == expect_queue)
    status, headers, data = srv.request("POST", "/v1/completions", {"prompt": "x", "max_tokens": 2})
    check(status == 429, f"a full queue: HTTP {status}, wanted 429: {data[:200]!r}")
    check(headers.get("retry-after") == "1", f"429 without Retry-After: {headers!r}")
    check(json.loads(data)["error"]["code"] == "queue_full", f"{data!r}")
    srv.wait_metric('gemma4_t4_requests_total{endpoint="/v1/completions",code="429"}', lambda v: v == 1)
    srv.healthy()
    for c in holders:
        c.sock.shutdown(socket.SHUT_RDWR)
        c.close()
    srv.wait_metric("gemma4_t4_active_sessions", lambda v: v == 0)
    srv.wait_metric("gemma4_t4_queue_depth", lambda v: v == 0)
    j = srv.json("POST", "/v1/completions", {"prompt": "x", "max_tokens": 2})
    check(len(j["choices"]) == 1, f"{j!r}")
    srv.stop()


def case_slow_body():
    srv = Server("--read-timeout", "1", "--body-timeout", "2", "--keep-alive-timeout", "1")
    head = ("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Content-Length: 200\r\n\r\n").encode()
    # trickle: a byte every 0.3 s (each read in time) -> 408 once the body deadline (2 s) passes
    s = socket.create_connection((srv.host, srv.port), timeout=10)
    s.sendall(head)
    t0 = time.time()
    reply = b""
    for _ in range(60):
        try:
            s.sendall(b" ")
        except OSError:
            break
        time.sleep(0.3)
        s.setblocking(False)
        try:
            reply += s.recv(65536)
        except (BlockingIOError, ConnectionResetError):
            pass
        s.setblocking(True)
        srv.healthy()  # others are served meanwhile
        if reply:
            break
    s.settimeout(5)
    reply += recv_all(s)
    took = time.time() - t0
    check(reply.startswith(b"HTTP/1.1 408") and b'"timeout"' in reply, f"trickled body: {reply[:300]!r}")
    check(1.5 < took < 10, f"408 after {took:.1f} s, wanted about 2 s")
    s.close()
    # stall: part of the body, then nothing -> answered and closed after the read timeout (1 s)
    s = socket.create_connection((srv.host, srv.port), timeout=10)
    t0 = time.time()
    s.sendall(head + b'{"messages"')
    reply = recv_all(s)
    took = time.time() - t0
    check(reply.startswith(b"HTTP/1.1 400") and b"incomplete_body" in reply, f"stalled body: {reply[:300]!r}")
    check(took < 5, f"a stalled body held the connection {took:.1f} s")
    s.close()
    # stalled headers -> httplib answers 400 after the read timeout (no handler runs); the connection is closed
    # once the keep-alive timeout (1 s) passes
    s = socket.create_connection((srv.host, srv.port), timeout=10)
    t0 = time.time()
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost:")
    first = s.recv(65536)
    took = time.time() - t0
    check(first.startswith(b"HTTP/1.1 400") and took < 5, f"stalled headers: {first[:100]!r} after {took:.1f} s")
    recv_all(s)
    took = time.time() - t0
    check(took < 5, f"stalled headers held the connection {took:.1f} s")
    s.close()
    srv.healthy()
    srv.stop()


def case_shutdown():
    # (a) requests in flight at SIGTERM -- two generating, two queued (--parallel 2) -- all finish, complete
    srv = Server("--shutdown-timeout", "60", "--parallel", "2")
    n_tokens = 40 if ARGS.light else 200  # (steps are ~10x slower under TSan: the same window)
    bodies = [{"messages": [{"role": "user", "content": text(10, i)}], "max_tokens": n_tokens, "ignore_eos": True,
               "temperature": 0, "return_token_ids": True} for i in range(4)]
    results, errors = [None] * 4, []

    def run(i):
        try:
            if i < 3:
                results[i] = stream_request(srv, dict(bodies[i], stream=True, stream_options={"include_usage": True}))
            else:
                results[i] = whole_request(srv, bodies[i])
        except BaseException as e:  # noqa: BLE001
            errors.append(f"client {i}: {e!r}")

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    deadline = time.time() + 30
    while True:
        m = srv.metrics()
        if m["gemma4_t4_active_sessions"] + m["gemma4_t4_queue_depth"] == 4:
            break
        check(time.time() < deadline and m.get("gemma4_t4_generation_tokens_total", 0) < 2 * n_tokens - 8,
              "the four requests were never in flight together")  # (by then the first two were done)
        time.sleep(0.01)
    srv.proc.send_signal(signal.SIGTERM)
    time.sleep(0.05)
    try:
        st, _, data = srv.request("POST", "/v1/completions", {"prompt": "x", "max_tokens": 2}, timeout=10)
        check(st == 503, f"a request after SIGTERM: HTTP {st}, wanted 503 (or a refused connection)")
    except (ConnectionRefusedError, ConnectionResetError, http.client.RemoteDisconnected):
        pass
    for t in threads:
        t.join(120)
    check(not errors, "; ".join(errors))
    for i, r in enumerate(results):
        check(r["finish_reason"] == "length" and r["completion_tokens"] == n_tokens and len(r["token_ids"]) == n_tokens,
              f"request {i} in flight at SIGTERM did not finish: {r['finish_reason']}, {len(r['token_ids'])} tokens")
    srv.stop(timeout=30)
    # (b) past --shutdown-timeout the rest are cancelled: streams end with an error event and [DONE], others 503
    srv = Server("--shutdown-timeout", "1")
    long_body = {"messages": [{"role": "user", "content": "go"}], "max_tokens": 4000, "ignore_eos": True}
    outs = [None, None]

    def run_stream():
        c = srv.conn(timeout=60)
        c.request("POST", "/v1/chat/completions", body=json.dumps(dict(long_body, stream=True)),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        outs[0] = (r.status, sse_events(r.read()))
        c.close()

    def run_whole():
        outs[1] = srv.request("POST", "/v1/chat/completions", long_body, timeout=60)[::2]

    threads = [threading.Thread(target=run_stream), threading.Thread(target=run_whole)]
    for t in threads:
        t.start()
    srv.wait_metric("gemma4_t4_active_sessions", lambda v: v == 2)
    t0 = time.time()
    srv.proc.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(60)
    status, events = outs[0]
    check(status == 200 and events[-1] == "[DONE]" and "error" in json.loads(events[-2]),
          f"a stream cancelled at shutdown: {events[-3:]!r}")
    check(outs[1][0] == 503 and json.loads(outs[1][1])["error"]["code"] == "cancelled", f"{outs[1]!r}")
    srv.stop(timeout=30)
    took = time.time() - t0
    check(took < 15, f"shutdown took {took:.1f} s with --shutdown-timeout 1")


def case_prefix():
    srv = Server("--prefix-cache-min", "32" if ARGS.light else "64")
    system = text(30 if ARGS.light else 80, 7)
    qs = [{"messages": [{"role": "system", "content": system}, {"role": "user", "content": u}], "max_tokens": 8,
           "temperature": 0.8, "seed": 11} for u in ("Where is the boat?", "What do the gulls do?")]
    turn2 = [{"role": "system", "content": system}, {"role": "user", "content": "Where is the boat?"},
             {"role": "assistant", "content": "On the sand."}, {"role": "user", "content": "And the town?"}]
    qs.append({"messages": turn2, "max_tokens": 8, "temperature": 0, "repetition_penalty": 1.3})
    refs = reference(qs)
    first = whole_request(srv, to_body(qs[0]))
    same(first, refs[0], "first request")
    check(first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, f"first request: {first['usage']!r}")
    m = srv.metrics()
    check(m["gemma4_t4_prefix_cache_prefills_total"] == 1 and m["gemma4_t4_prefix_cache_entries"] == 1,
          f"the system prompt was not cached: {m!r}")
    second = stream_request(srv, to_body(qs[1], stream=True))
    same(second, refs[1], "second request (system prompt from the cache)")
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    check(32 <= cached < second["prompt_tokens"], f"second request: cached_tokens {cached}")
    third = whole_request(srv, to_body(qs[2]))
    same(third, refs[2], "a later turn (from the cached system prompt)")
    check(third["usage"]["prompt_tokens_details"]["cached_tokens"] == cached, f"{third['usage']!r}")
    srv.wait_metric("gemma4_t4_active_sessions", lambda v: v == 0)  # (gauges follow the driver's step)
    m = srv.metrics()
    # hits: the second request, and the third (its new entry [system, user, assistant] was built from [system])
    check(m["gemma4_t4_prefix_cache_hits_total"] == 2, f"hits: {m['gemma4_t4_prefix_cache_hits_total']}")
    check(m["gemma4_t4_prefix_cache_prefills_total"] == 2, "prefills")
    check(m["gemma4_t4_prefix_cache_reused_tokens_total"] >= 2 * cached, "reused tokens not counted")
    check(m["gemma4_t4_kv_bytes_in_use"] > 0 and m["gemma4_t4_kv_bytes_allocated"] >= m["gemma4_t4_kv_bytes_in_use"],
          "KV bytes gauges")
    # /metrics has the documented families
    status, _, data = srv.request("GET", "/metrics")
    for family in ("gemma4_t4_requests_total", "gemma4_t4_prompt_tokens_total", "gemma4_t4_generation_tokens_total",
                   "gemma4_t4_time_to_first_token_seconds_bucket", "gemma4_t4_time_per_output_token_seconds_count",
                   "gemma4_t4_queue_depth", "gemma4_t4_active_sessions", "gemma4_t4_kv_bytes_in_use"):
        check(family.encode() in data, f"/metrics lacks {family}")
    srv.stop()


def case_bench_serve():
    """bench_serve (next to the server binary) against a server: a small sweep, its table, JSON and CSV."""
    exe = os.path.join(os.path.dirname(ARGS.server), "bench_serve")
    if not os.path.exists(exe):
        skip(f"{exe} was not built")
    srv = Server("--max-context", "64")
    out = os.path.join(ARGS.work, f"bench_serve.{os.getpid()}")
    p = subprocess.run([exe, "--url", f"http://{srv.host}:{srv.port}", "--prompts", "8,100", "--concurrency", "1,3",
                        "--tokens", "4", "--repeats", "2", "--json", out + ".json", "--csv", out + ".csv"],
                       capture_output=True, text=True, timeout=240)
    check(p.returncode == 0, f"bench_serve failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    j = json.load(open(out + ".json"))
    check(j["schema"] == "gemma4_t4.bench_serve/1" and j["model"] == "mm_bf16", f"{j!r}")
    check(any("shortened" in n for n in j["notes"]), "the 100-token prompt must be shortened to fit 64 with 4 tokens")
    cells = j["cells"]
    check([(c["prompt"], c["concurrency"]) for c in cells] == [(8, 1), (8, 3), (60, 1), (60, 3)],
          f"cells: {[(c['prompt'], c['concurrency']) for c in cells]}")
    for c in cells:
        check(not c["error"] and c["repeats"] == 2 and c["tokens"] == 4, f"cell {c!r}")
        # (per-token times may be 0 here: a few tokens of the tiny model can arrive in one read)
        check(c["ms_per_token"] >= 0 and c["tpot_ms"] >= 0 and c["ttft_ms_p99"] >= c["ttft_ms_p90"] >=
              c["ttft_ms_median"] > 0 and c["tok_s_wall"] > 0, f"cell {c!r}")
        check(abs(c["tok_s_total"] - c["concurrency"] * c["tok_s_per_stream"]) < 1e-6 * c["tok_s_total"] + 1e-9,
              f"tok_s_total = concurrency x tok_s_per_stream: {c!r}")
    csv = open(out + ".csv").read().splitlines()
    check(csv[0].startswith("prompt,requested_prompt,concurrency,tokens,repeats,ms_per_token,tpot_ms,tok_s_per_stream,"
                            "tok_s_total") and len(csv) == 5, f"CSV: {csv[:2]!r}")
    check("TTFT p99" in p.stdout, f"table: {p.stdout!r}")
    m = srv.metrics()
    check(m["gemma4_t4_generation_tokens_total"] == 4 * 2 * 2 * (1 + 3) + 2 * 2 * (1 + 3),
          f"tokens generated: {m['gemma4_t4_generation_tokens_total']}")  # timed + warm-up (2 tokens a stream)
    srv.stop()


CASES = {name[len("case_"):]: fn for name, fn in globals().items() if name.startswith("case_")}


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("case", choices=sorted(CASES))
    ap.add_argument("--server", required=True)
    ap.add_argument("--reference", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--light", action="store_true",
                    help="lighter workloads for slow (ThreadSanitizer) builds: fewer tokens, fewer reference checks")
    ARGS = ap.parse_args()
    ARGS.work = os.path.abspath(ARGS.work)
    t0 = time.time()
    CASES[ARGS.case]()
    print(f"server.{ARGS.case}: ok ({time.time() - t0:.1f} s)")


if __name__ == "__main__":
    main()
