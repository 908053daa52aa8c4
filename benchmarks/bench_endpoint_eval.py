"""Benchmark wall time for a model behind an OpenAI-compatible endpoint (`cowork eval`), by request concurrency.

    .venv/bin/python benchmarks/bench_endpoint_eval.py [--envs 12] [--trials 2] [--latency 0.2] [--concurrency 1,4,16]

A chat-completions server on 127.0.0.1 (started here, threaded) answers every request after ``--latency``
seconds, as a hosted model would, with what a perfect model would do: the next step of the environment's
reference (the task is recognised by its first user message). ``evaluate`` then scores ``OpenAIAgent`` on
``--envs`` certified environments (round-robin over the catalog) x (``--trials`` faulted + 1 clean) at each concurrency,
with the same sandbox. Reported: wall time, the speed-up against concurrency 1 measured in the same run, requests
and requests per second. The scores must be identical across concurrencies (every trial passes); the script
checks it.
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cowork_pipeline.agents.openai_agent import OpenAIAgent  # noqa: E402
from cowork_pipeline.agents.program import ProgramAgent  # noqa: E402
from cowork_pipeline.capabilities import load_catalog  # noqa: E402
from cowork_pipeline.evaluation import evaluate  # noqa: E402
from cowork_pipeline.synthesis.embedded import EmbeddedBackend  # noqa: E402
from cowork_pipeline.synthesis.repair import synthesize  # noqa: E402
from cowork_pipeline.validation.certify import Validator  # noqa: E402
from cowork_pipeline.validation.sandbox import Sandbox  # noqa: E402


class Endpoint:
    """Answers each request with the reference's next step after a fixed latency; counts requests."""

    def __init__(self, programs: dict[str, Any], latency: float) -> None:
        self.requests = 0
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                msgs = body["messages"]
                task = next(m["content"] for m in msgs if m["role"] == "user")
                msg = ProgramAgent(programs[task]).act(msgs, body.get("tools") or [])
                with lock:
                    outer.requests += 1
                time.sleep(latency)
                raw = json.dumps({"id": "x", "object": "chat.completion", "model": "oracle",
                                  "choices": [{"index": 0, "message": msg, "finish_reason": "tool_calls" if msg.get("tool_calls") else "stop"}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args: Any) -> None:
                pass

        ThreadingHTTPServer.daemon_threads = True
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--envs", type=int, default=12)
    ap.add_argument("--trials", type=int, default=2)
    ap.add_argument("--latency", type=float, default=0.2)
    ap.add_argument("--concurrency", default="1,4,16")
    args = ap.parse_args()
    catalog = load_catalog()
    caps = sorted(catalog)
    rows, baseline, first = [], None, None
    with Sandbox(workers=1) as sb:
        envs = []  # certified environments (the repair loop's), round-robin over the catalog
        for i in range(args.envs):
            (out,) = synthesize(EmbeddedBackend(), Validator(sb), catalog[caps[i % len(caps)]], [100 + i // len(caps)])
            if out.accepted:
                envs.append(out.final.draft.spec)
        endpoint = Endpoint({e.turns[0].user: e.reference for e in envs}, args.latency)
        for c in [int(x) for x in args.concurrency.split(",")]:
            agent = OpenAIAgent(endpoint.url, "oracle", concurrency=c)
            before, t0 = endpoint.requests, time.perf_counter()
            df = evaluate(agent, [(e, "heldout_env") for e in envs], sb, trials=args.trials, fault_rate=0.2)
            wall = time.perf_counter() - t0
            outcome = df.select("env_id", "trial", "passed", "score", "n_tool_calls").sort("env_id", "trial")
            if first is None:
                first = outcome
            assert outcome.equals(first), "scores differ across concurrencies"
            assert df["passed"].all(), df.filter(~df["passed"]).select("env_id", "failed_items", "termination_detail")
            baseline = baseline or wall
            n = endpoint.requests - before
            rows.append((c, wall, baseline / wall, n, n / wall, len(df)))
    print(f"\n{len(envs)} certified environments x {args.trials + 1} trials, endpoint latency {args.latency:.2f} s per request")
    print(f"{'concurrency':>11} {'wall s':>8} {'speed-up':>9} {'requests':>9} {'req/s':>7} {'trials':>7}")
    for c, wall, up, n, rps, trials in rows:
        print(f"{c:>11} {wall:>8.2f} {up:>8.2f}x {n:>9} {rps:>7.1f} {trials:>7}")
    print("scores identical across concurrencies; every trial passed")
    endpoint.server.shutdown()


if __name__ == "__main__":
    main()
