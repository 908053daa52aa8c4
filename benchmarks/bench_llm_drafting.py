"""LLM drafting wall time: the repair loop against an OpenAI-compatible endpoint, by request concurrency.

    .venv/bin/python benchmarks/bench_llm_drafting.py [--capability invoice_reconcile] [--seeds 32]
                                                      [--latency 0.25] [--concurrency 1,4,8,16]

A chat-completions server on 127.0.0.1 (started here) answers every request after ``--latency`` seconds, as
a hosted model would: a first draft request with the embedded generator's first draft of that seed (about
half of them have planted flaws, as model drafts do), a revision request with that seed's certified
document. ``repair.synthesize`` then drafts, certifies and revises ``--seeds`` environments of one
capability with the LLM backend at each concurrency (the same sandbox and validator for all). Reported:
wall time, the speed-up against concurrency 1 measured in the same run, requests, and the share of wall
time spent certifying (the part concurrency does not touch). Outcomes must be identical across
concurrencies; the script checks it.
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

from cowork_pipeline.capabilities import load_catalog  # noqa: E402
from cowork_pipeline.synthesis.embedded import EmbeddedBackend  # noqa: E402
from cowork_pipeline.synthesis.llm import LLMBackend  # noqa: E402
from cowork_pipeline.synthesis.repair import synthesize  # noqa: E402
from cowork_pipeline.validation.certify import Validator  # noqa: E402
from cowork_pipeline.validation.sandbox import Sandbox  # noqa: E402


class Endpoint:
    """Answers chat completions from prepared documents after a fixed latency; counts requests."""

    def __init__(self, first: dict[int, str], final: dict[int, str], latency: float) -> None:
        self.requests = 0
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                with lock:
                    outer.requests += 1
                time.sleep(latency)
                seed = body["seed"]
                content = first[seed] if len(body["messages"]) == 2 else final[seed]
                payload = json.dumps({"id": "bench", "object": "chat.completion", "model": body["model"],
                                      "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                                                   "finish_reason": "stop"}],
                                      "usage": {"prompt_tokens": 3000, "completion_tokens": 4000, "total_tokens": 7000}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 128  # socketserver's default backlog (5) would make the endpoint the bottleneck

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--capability", default="invoice_reconcile")
    ap.add_argument("--seeds", type=int, default=32)
    ap.add_argument("--latency", type=float, default=0.25, help="seconds the endpoint takes per answer")
    ap.add_argument("--concurrency", default="1,4,8,16", help="comma-separated; the first is the baseline")
    args = ap.parse_args()

    cap = load_catalog()[args.capability]
    seeds = list(range(args.seeds))
    embedded = EmbeddedBackend()
    with Sandbox(workers=1) as sb:
        validator = Validator(sb)
        done = synthesize(embedded, validator, cap, seeds, max_rounds=3)
        first = {o.seed: o.attempts[0].draft.spec.to_json() for o in done}
        final = {o.seed: o.final.draft.spec.to_json() for o in done if o.accepted}
        seeds = sorted(final)  # seeds the embedded generator itself could not certify are left out
        endpoint = Endpoint(first, final, args.latency)
        rows, views = [], []
        try:
            for n in [int(x) for x in args.concurrency.split(",")]:
                backend = LLMBackend(endpoint.url, "bench-model", concurrency=n, backoff_s=0.01)
                before = endpoint.requests
                certify_s = 0.0
                certify_many = validator.certify_many

                def timed(drafts: Any, _inner: Any = certify_many) -> Any:
                    nonlocal certify_s
                    t = time.perf_counter()
                    try:
                        return _inner(drafts)
                    finally:
                        certify_s += time.perf_counter() - t

                validator.certify_many = timed  # type: ignore[method-assign]
                t0 = time.perf_counter()
                out = synthesize(backend, validator, cap, seeds, max_rounds=3)
                wall = time.perf_counter() - t0
                validator.certify_many = certify_many  # type: ignore[method-assign]
                views.append([(o.seed, o.accepted, [a.draft.spec.content_hash() if a.draft.spec else None for a in o.attempts]) for o in out])
                rows.append((n, wall, endpoint.requests - before, certify_s, sum(o.accepted for o in out)))
        finally:
            endpoint.close()

    same = all(v == views[0] for v in views)
    base = rows[0][1]
    print(f"{len(seeds)} environments of {cap.id}; endpoint latency {args.latency:.2f} s per answer; repair loop, 3 rounds max")
    print(f"{'concurrency':>12}{'wall s':>10}{'speed-up':>10}{'requests':>10}{'certify s':>11}{'accepted':>10}")
    for n, wall, req, cert, acc in rows:
        print(f"{n:>12}{wall:>10.2f}{base / wall:>9.1f}x{req:>10}{cert:>11.2f}{acc:>10}")
    ideal = rows[0][2] * args.latency
    print(f"(concurrency 1 is bounded below by requests x latency = {ideal:.1f} s; outcomes identical across concurrencies: {same})")
    if not same:
        raise SystemExit("outcomes differ between concurrencies")


if __name__ == "__main__":
    main()
