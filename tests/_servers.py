"""Real HTTP servers on 127.0.0.1 for the tests (uvicorn apps on a port bound before they start)."""
from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator


@contextmanager
def running(app: Any) -> Iterator[str]:
    """Serve the ASGI ``app`` on 127.0.0.1 in a thread; yields its base URL (``http://127.0.0.1:<port>``)."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # bound before the server starts: no free-port race
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.time() + 20
    while not server.started:
        assert time.time() < deadline, "server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
