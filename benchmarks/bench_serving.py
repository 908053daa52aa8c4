"""`cowork serve` streamed vs whole answers: throughput and time to first text for concurrent clients.

    .venv/bin/python benchmarks/bench_serving.py [--checkpoint DIR] [--clients 16] [--new-tokens 64] [--repeats 3]

Without ``--checkpoint`` the default student (``StudentConfig()``, random init: it rarely ends a turn early, so
every answer runs to ``--new-tokens``) is built into a temp dir. ``--clients`` requests are sent at once (sampled,
each with its own seed, since a random student's greedy text is one token repeated, distinct prompts, no tools),
streamed and not, in interleaved repeats against one server; the baseline is the
unstreamed run against the same server. Streaming costs events; it should cost little throughput or server CPU (the
server's own, from /proc: on a small machine the clients' reading competes with it for the cores), and its first
text must come long before the whole answer. Generated-token counts are the server's usage, not assumed.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_generation import build_default_student  # noqa: E402


def request(port: int, i: int, new_tokens: int, stream: bool) -> tuple[float, float, int, str]:
    """(seconds to the first text, seconds to the end, completion tokens, the text) of one request."""
    body = {"model": "student", "max_tokens": new_tokens, "temperature": 1.0, "seed": i, "stream": stream,
            "messages": [{"role": "system", "content": "You are a coworker agent."},
                         {"role": "user", "content": f"Please write the team a status update, item {i}."}]}
    if stream:
        body["stream_options"] = {"include_usage": True}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    start = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    first, tokens, text = None, 0, ""
    if not stream:
        answer = json.loads(resp.read())
        first, tokens = time.perf_counter() - start, answer["usage"]["completion_tokens"]
        text = answer["choices"][0]["message"]["content"] or ""
    else:
        for line in resp:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            event = json.loads(line[6:])
            said = "".join(c["delta"].get("content") or "" for c in event["choices"])
            if first is None and said:
                first = time.perf_counter() - start
            text += said
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
    end = time.perf_counter() - start
    conn.close()
    return first if first is not None else end, end, tokens, text


def cpu_seconds(pid: int) -> float:
    """CPU time the process has used, all its threads (Linux's /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def round_of(port: int, pid: int, clients: int, new_tokens: int, stream: bool) -> dict[str, float]:
    cpu, start = cpu_seconds(pid), time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        got = list(pool.map(lambda i: request(port, i, new_tokens, stream), range(clients)))
    wall = time.perf_counter() - start
    tokens = sum(g[2] for g in got)
    return {"tok_s": tokens / wall, "first_s": statistics.median(g[0] for g in got), "wall_s": wall,
            "cpu_ms_per_tok": 1000 * (cpu_seconds(pid) - cpu) / tokens, "texts": [g[3] for g in got]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", type=Path)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = args.checkpoint or build_default_student(Path(tmp) / "student")
        # `cowork serve` in its own process, as users run it: the clients' reading does not share its interpreter.
        server = subprocess.Popen([str(Path(sys.executable).parent / "cowork"), "serve", str(checkpoint), "--port", "0"],
                                  stdout=subprocess.PIPE, text=True, env={**os.environ, "COWORK_HOME": tmp, "OMP_NUM_THREADS": "1"})
        try:
            announced = server.stdout.readline()
            port = int(re.search(r"http://127\.0\.0\.1:(\d+)/v1", announced).group(1))
            round_of(port, server.pid, args.clients, args.new_tokens, False)  # warm-up
            runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
            for _ in range(args.repeats):
                for stream in (False, True):
                    runs[stream].append(round_of(port, server.pid, args.clients, args.new_tokens, stream))
        finally:
            server.terminate()
            server.wait(30)

    def med(stream: bool, key: str) -> float:  # (of the interleaved repeats)
        return statistics.median(r[key] for r in runs[stream])

    print(f"{args.clients} concurrent clients, {args.new_tokens} new tokens each, medians of {args.repeats} "
          f"interleaved repeats")
    for stream, label in ((False, "whole answers (baseline)"), (True, "streamed")):
        print(f"  {label:25} {med(stream, 'tok_s'):8.1f} tok/s, first text after {med(stream, 'first_s'):.3f} s, "
              f"server CPU {med(stream, 'cpu_ms_per_tok'):.3f} ms per token")
    print(f"  streamed / whole: throughput x{med(True, 'tok_s') / med(False, 'tok_s'):.2f}, "
          f"time to first text x{med(True, 'first_s') / med(False, 'first_s'):.2f}, "
          f"server CPU per token x{med(True, 'cpu_ms_per_tok') / med(False, 'cpu_ms_per_tok'):.2f}")
    # (each client samples with its own seed: streamed or not, the same answer)
    same = all(r["texts"] == runs[False][0]["texts"] for r in runs[False] + runs[True])
    print(f"  streamed texts identical to the whole answers: {same}")

if __name__ == "__main__":
    main()
