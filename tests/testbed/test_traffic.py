"""The bulk-stream tool of the fabric tests (``laxflow.testbed.traffic``), on loopback."""

from __future__ import annotations

import socket
import threading
import time

from laxflow.testbed import traffic


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_sender_given_an_instant_connects_then_waits_for_it():
    """Senders launched one after the other send over one window: none may have the link alone."""
    port = _free_port()
    got: dict[str, int] = {}
    first: list[float] = []

    def sink() -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(1)
        listener.settimeout(10)
        conn, _ = listener.accept()
        accepted = time.time()
        n = 0
        while data := conn.recv(1 << 16):
            if not first:
                first.append(time.time())
            n += len(data)
        got["accepted"], got["bytes"] = accepted, n
        conn.close()
        listener.close()

    thread = threading.Thread(target=sink)
    thread.start()
    time.sleep(0.1)
    at = time.time() + 0.6
    sent = traffic.send("127.0.0.1", port, 0, 0.2, at=at)
    thread.join(timeout=10)
    assert sent > 0 and got["bytes"] == sent
    assert got["accepted"] < at - 0.3  # connected at once ...
    assert first[0] >= at  # ... and sent nothing before the instant
