"""A TCP proxy between Kafka clients and one broker that loses answers: it forwards
every request, and for chosen Produce requests it throws the broker's answer away and
cuts the client's connection (as a network failure right after the broker appended
would). The client cannot know whether its batch was written and retries it: without
idempotence that writes the batch twice. The broker advertises the proxy's address, so
every connection of the client goes through it."""
import socket
import struct
import threading

PRODUCE = 0
FETCH = 1


def _read_exact(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def _read_frame(sock):
    head = _read_exact(sock, 4)
    if head is None:
        return None
    (size,) = struct.unpack(">i", head)
    body = _read_exact(sock, size)
    return None if body is None else head + body


class DroppingProxy:
    """Listens on 127.0.0.1:<port>; drops the answer to every `every`-th Produce
    request (or request of API `api_key`), at most `max_drops` times (so the run
    always finishes)."""

    def __init__(self, upstream_port, every=7, max_drops=20, api_key=PRODUCE):
        self.upstream_port = upstream_port
        self.api_key = api_key
        self.every = every
        self.max_drops = max_drops
        self.produces = 0
        self.dropped = 0
        self.lock = threading.Lock()
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def addr(self):
        return f"127.0.0.1:{self.port}"

    def reset(self):
        """Starts counting (and dropping) afresh."""
        with self.lock:
            self.produces = self.dropped = 0

    def close(self):
        self.closed = True
        self.listener.close()

    def _accept(self):
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            except OSError:
                client.close()  # the broker is down: so is this connection
                continue
            doomed = set()  # correlation ids whose answers are lost
            threading.Thread(target=self._requests, args=(client, upstream, doomed), daemon=True).start()
            threading.Thread(target=self._answers, args=(client, upstream, doomed), daemon=True).start()

    def _requests(self, client, upstream, doomed):
        try:
            while True:
                frame = _read_frame(client)
                if frame is None:
                    break
                api_key, _version, corr = struct.unpack(">hhi", frame[4:12])
                if api_key == self.api_key:
                    with self.lock:
                        self.produces += 1
                        if self.produces % self.every == 0 and self.dropped < self.max_drops:
                            self.dropped += 1
                            doomed.add(corr)
                upstream.sendall(frame)
        except OSError:
            pass
        _close(client, upstream)

    def _answers(self, client, upstream, doomed):
        try:
            while True:
                frame = _read_frame(upstream)
                if frame is None:
                    break
                (corr,) = struct.unpack(">i", frame[4:8])
                if corr in doomed:
                    break  # the broker answered; the client never hears it
                client.sendall(frame)
        except OSError:
            pass
        _close(client, upstream)


def _close(*socks):
    for s in socks:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()
