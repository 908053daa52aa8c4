"""`cowork serve` under concurrent clients: streamed vs whole answers, and continuous vs static batching.

    .venv/bin/python benchmarks/bench_serving.py [--checkpoint DIR] [--clients 16] [--new-tokens 64] [--repeats 3]
                                                 [--turns 4] [--stagger-ms 25]

Without ``--checkpoint`` the default student (``StudentConfig()``, random init: it rarely ends a turn early, so
every answer runs to its token limit) is built into a temp dir. Generated-token counts are the server's usage, not
assumed. Requests are sampled, each with its own seed (a random student's greedy text is one token repeated), so
an answer does not depend on what it is batched with.

1. Streaming: ``--clients`` requests sent at once (distinct prompts, no tools, ``--new-tokens`` each), streamed and
   not, in interleaved repeats against one server; the baseline is the unstreamed run. Streaming costs events; it
   should cost little throughput or server CPU (the server's own, from /proc: on a small machine the clients'
   reading competes with it for the cores), and its first text must come long before the whole answer.
2. Batching: ``--clients`` agents, each starting ``--stagger-ms`` after the one before, run ``--turns``-turn
   episodes (each turn's answer and a tool result go into the next request, after 10 ms of "tool work"), each turn
   with its own token limit (from 8 to twice ``--new-tokens``, as agents' turns vary). Against `cowork serve
   --batching static` (the baseline: a batch runs to its end before the next starts), continuous batching lets a
   request join the running batch at its next step and leave it when done. Reported: throughput, wall time, and
   request latency (median, 90th percentile), interleaved repeats against two servers; and whether both gave every
   episode the same answers.
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
from typing import Any

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


SYSTEM = {"role": "system", "content": "You are a coworker agent."}


def turn_limits(new_tokens: int) -> list[int]:
    """The token limits an agent's turns draw from (a short call, ..., a long answer)."""
    return sorted({8, max(1, new_tokens // 4), max(1, new_tokens // 2), new_tokens, 2 * new_tokens})


def episode(port: int, client: int, turns: int, new_tokens: int, stagger_s: float) -> list[tuple[float, int, str]]:
    """(latency, completion tokens, text) of each turn of one agent's episode, started ``stagger_s`` late."""
    import random

    time.sleep(stagger_s)
    limits = random.Random(client).choices(turn_limits(new_tokens), k=turns)
    messages = [SYSTEM, {"role": "user", "content": f"Please reconcile invoice INV-{1000 + client} with the CRM."}]
    conn, out = http.client.HTTPConnection("127.0.0.1", port, timeout=600), []
    for turn, limit in enumerate(limits):
        body = {"model": "student", "max_tokens": max(limit, 1), "temperature": 1.0, "seed": 100 * client + turn,
                "messages": messages}
        start = time.perf_counter()
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        answer = json.loads(conn.getresponse().read())
        out.append((time.perf_counter() - start, answer["usage"]["completion_tokens"],
                    answer["choices"][0]["message"]["content"] or ""))
        messages = messages + [{"role": "assistant", "content": out[-1][2]},
                               {"role": "user", "content": f"Tool result {turn}: 3 records, 1 updated."}]
        time.sleep(0.01)  # (the agent runs its tool)
    conn.close()
    return out


def agents_round(port: int, pid: int, clients: int, turns: int, new_tokens: int, stagger_s: float) -> dict[str, Any]:
    cpu, start = cpu_seconds(pid), time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        got = list(pool.map(lambda c: episode(port, c, turns, new_tokens, c * stagger_s), range(clients)))
    wall = time.perf_counter() - start
    turns_done = [t for ep in got for t in ep]
    tokens = sum(t[1] for t in turns_done)
    latencies = sorted(t[0] for t in turns_done)
    return {"tok_s": tokens / wall, "wall_s": wall, "latency_s": statistics.median(latencies),
            "p90_s": latencies[min(len(latencies) - 1, int(0.9 * len(latencies)))],
            "cpu_ms_per_tok": 1000 * (cpu_seconds(pid) - cpu) / tokens, "texts": [[t[2] for t in ep] for ep in got]}


def start_server(checkpoint: Path, home: str, batching: str) -> tuple[subprocess.Popen, int]:
    """`cowork serve` in its own process, as users run it: the clients' reading does not share its interpreter."""
    server = subprocess.Popen([str(Path(sys.executable).parent / "cowork"), "serve", str(checkpoint), "--port", "0",
                               "--batching", batching],
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "COWORK_HOME": home, "OMP_NUM_THREADS": "1"})
    announced = server.stdout.readline()
    return server, int(re.search(r"http://127\.0\.0\.1:(\d+)/v1", announced).group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", type=Path)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--stagger-ms", type=float, default=25.0)
    args = ap.parse_args()

    servers: dict[str, tuple[subprocess.Popen, int]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = args.checkpoint or build_default_student(Path(tmp) / "student")
        try:
            for batching in ("continuous", "static"):
                servers[batching] = start_server(checkpoint, tmp, batching)
            server, port = servers["continuous"]
            round_of(port, server.pid, args.clients, args.new_tokens, False)  # warm-up
            runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
            for _ in range(args.repeats):
                for stream in (False, True):
                    runs[stream].append(round_of(port, server.pid, args.clients, args.new_tokens, stream))
            batched: dict[str, list[dict[str, Any]]] = {"static": [], "continuous": []}
            stagger = args.stagger_ms / 1000
            for batching, (server, port) in servers.items():  # warm-up
                agents_round(port, server.pid, args.clients, 1, args.new_tokens, stagger)
            for _ in range(args.repeats):
                for batching in ("static", "continuous"):
                    server, port = servers[batching]
                    batched[batching].append(agents_round(port, server.pid, args.clients, args.turns,
                                                          args.new_tokens, stagger))
        finally:
            for server, _port in servers.values():
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

    def bmed(batching: str, key: str) -> float:
        return statistics.median(r[key] for r in batched[batching])

    limits = turn_limits(args.new_tokens)
    print(f"{args.clients} agents starting {args.stagger_ms:g} ms apart, {args.turns}-turn episodes ({limits[0]} to "
          f"{limits[-1]} tokens a turn), medians of {args.repeats} interleaved repeats")
    for batching, label in (("static", "static batching (baseline)"), ("continuous", "continuous batching")):
        print(f"  {label:27} {bmed(batching, 'tok_s'):8.1f} tok/s, wall {bmed(batching, 'wall_s'):.2f} s, latency "
              f"median {bmed(batching, 'latency_s'):.3f} s, p90 {bmed(batching, 'p90_s'):.3f} s, "
              f"server CPU {bmed(batching, 'cpu_ms_per_tok'):.3f} ms per token")
    print(f"  continuous / static: throughput x{bmed('continuous', 'tok_s') / bmed('static', 'tok_s'):.2f}, "
          f"wall x{bmed('continuous', 'wall_s') / bmed('static', 'wall_s'):.2f}, "
          f"latency median x{bmed('continuous', 'latency_s') / bmed('static', 'latency_s'):.2f}, "
          f"p90 x{bmed('continuous', 'p90_s') / bmed('static', 'p90_s'):.2f}, "
          f"server CPU per token x{bmed('continuous', 'cpu_ms_per_tok') / bmed('static', 'cpu_ms_per_tok'):.2f}")
    episodes = [ep for r in batched["static"] + batched["continuous"] for ep in r["texts"]]
    reference = batched["static"][0]["texts"]
    same_eps = sum(ep == reference[i % args.clients] for i, ep in enumerate(episodes))
    print(f"  episodes with the same answers in every run: {same_eps}/{len(episodes)}")

if __name__ == "__main__":
    main()
