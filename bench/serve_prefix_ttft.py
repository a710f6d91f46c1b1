#!/usr/bin/env python3
"""Prefix reuse, measured: the TTFT of a chat request whose long system prompt is new to the server against the
TTFT of a second request with the same system prompt (and another user message), which the server's prefix
cache serves from the first one's KV.

    bench/serve_prefix_ttft.py [--url http://127.0.0.1:8080] [--system-tokens 2000] [--repeats 5] [--json PATH]

The system prompt is random words, sized to --system-tokens by two probe requests (the server reports
prompt_tokens); each repeat uses fresh words, so its first request is a miss. TTFT = request sent -> the first
server-sent event carrying a token (streamed, return_token_ids, greedy, 2 tokens). Reports the medians, their
ratio (second / first) and the cached_tokens the server reported for the second requests. Python 3 standard
library only; the server must be examples/server.cpp with its prefix cache on (the default).
"""

import argparse
import http.client
import json
import random
import statistics
import sys
import time
import urllib.parse

WORDS = ("the sea is wide and the wind is cold on the shore where the old boat lies in the sand while gulls call "
         "over grey water and light fades slowly behind hills of a quiet town people walk along harbour wall "
         "watching ships come home before night falls across fields rivers mountains forests valleys").split()


def words(n, seed):
    rnd = random.Random(seed)
    return " ".join(rnd.choice(WORDS) for _ in range(n))


class Client:
    def __init__(self, url, key):
        u = urllib.parse.urlparse(url)
        self.host, self.port = u.hostname, u.port or 80
        self.headers = {"Content-Type": "application/json"}
        if key:
            self.headers["Authorization"] = f"Bearer {key}"

    def get(self, path):
        c = http.client.HTTPConnection(self.host, self.port, timeout=600)
        c.request("GET", path, headers=self.headers)
        r = c.getresponse()
        body = r.read()
        if r.status != 200:
            sys.exit(f"GET {path}: HTTP {r.status} {body[:300]!r}")
        return json.loads(body)

    def chat(self, model, system, user):
        """(ttft_ms, usage) of one streamed chat request."""
        body = {"model": model, "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
                "max_tokens": 2, "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
                "return_token_ids": True}
        c = http.client.HTTPConnection(self.host, self.port, timeout=600)
        t0 = time.perf_counter()
        c.request("POST", "/v1/chat/completions", body=json.dumps(body), headers=self.headers)
        r = c.getresponse()
        if r.status != 200:
            sys.exit(f"POST /v1/chat/completions: HTTP {r.status} {r.read()[:300]!r}")
        ttft, usage, buf = None, None, b""
        while True:
            chunk = r.read1(65536)
            if not chunk:
                break
            buf += chunk
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                payload = event[len(b"data: "):]
                if payload == b"[DONE]":
                    continue
                j = json.loads(payload)
                if "error" in j:
                    sys.exit(f"error event: {j}")
                if ttft is None and any(ch.get("token_ids") for ch in j.get("choices", [])):
                    ttft = (time.perf_counter() - t0) * 1e3
                if j.get("usage"):
                    usage = j["usage"]
        c.close()
        return ttft, usage


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--api-key", default="")
    ap.add_argument("--system-tokens", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    cli = Client(a.url, a.api_key)
    model = cli.get("/v1/models")["data"][0]["id"]

    # size the system prompt: prompt_tokens is linear in the number of words
    p = [cli.chat(model, words(n, 10_000 + n + a.seed), "hi")[1]["prompt_tokens"] for n in (100, 300)]
    per_word = (p[1] - p[0]) / 200
    overhead = p[0] - 100 * per_word
    n_words = max(1, round((a.system_tokens - overhead) / per_word))

    first, second, cached, prompt = [], [], [], []
    for r in range(a.repeats):
        system = words(n_words, 1_000_000 * a.seed + r)
        t1, u1 = cli.chat(model, system, f"Question {r}: where is the boat?")
        t2, u2 = cli.chat(model, system, f"Question {r}: what do the gulls do?")
        first.append(t1)
        second.append(t2)
        cached.append(u2["prompt_tokens_details"]["cached_tokens"])
        prompt.append(u2["prompt_tokens"])
        print(f"repeat {r + 1}: first {t1:8.1f} ms, second {t2:8.1f} ms ({cached[-1]} of {prompt[-1]} prompt tokens "
              f"cached, first request {u1['prompt_tokens_details']['cached_tokens']})", file=sys.stderr)
    f, s = statistics.median(first), statistics.median(second)
    out = {"url": a.url, "model": model, "repeats": a.repeats, "system_words": n_words,
           "prompt_tokens_median": statistics.median(prompt), "cached_tokens_median": statistics.median(cached),
           "ttft_first_ms_median": f, "ttft_second_ms_median": s, "ratio": s / f if f else None,
           "ttft_first_ms": first, "ttft_second_ms": second}
    print(f"prefix reuse, {model} at {a.url}: system prompt ~{out['cached_tokens_median']:.0f} tokens "
          f"(prompt {out['prompt_tokens_median']:.0f}), {a.repeats} repeats")
    print(f"  TTFT first request (miss)  {f:9.1f} ms (median)")
    print(f"  TTFT second request (hit)  {s:9.1f} ms (median)   second / first = {100 * s / f:.1f}%")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=2)
            fh.write("\n")


if __name__ == "__main__":
    main()
