"""Just enough of the Kafka wire format to send hand-made (and broken) requests."""
import select
import socket
import struct
import time

_CRC32C_TABLE = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
    _CRC32C_TABLE.append(_c)


def crc32c(data):
    crc = 0xFFFFFFFF
    t = _CRC32C_TABLE
    for b in data:
        crc = t[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def uvarint(n):
    """Unsigned varint (flexible versions' lengths, KIP-482)."""
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def varint(n):
    """Zigzag varint (record fields)."""
    return uvarint((n << 1) ^ (n >> 63))


def record_batch(values, good_crc=True, producer_id=-1, producer_epoch=-1, base_sequence=-1,
                 transactional=False, count=None):
    """An uncompressed v2 batch of records with null keys (sequenced when a producer id
    is given). `count` makes the header count (and last offset delta) say another
    number of records than it holds."""
    ts = int(time.time() * 1000)
    count = len(values) if count is None else count
    recs = b""
    for i, v in enumerate(values):
        body = b"\x00" + varint(0) + varint(i) + varint(-1) + varint(len(v)) + v + varint(0)
        recs += varint(len(body)) + body
    attributes = 0x10 if transactional else 0
    after_crc = struct.pack(">hiqqqhii", attributes, count - 1, ts, ts, producer_id, producer_epoch,
                            base_sequence, count) + recs
    crc = crc32c(after_crc)
    if not good_crc:
        crc ^= 0xDEAD
    after_len = struct.pack(">ibI", 0, 2, crc) + after_crc
    return struct.pack(">qi", 0, len(after_len)) + after_len


def string(s):
    if s is None:
        return struct.pack(">h", -1)
    b = s.encode()
    return struct.pack(">h", len(b)) + b


def header(api_key, version, corr, client="e2e"):
    return struct.pack(">hhi", api_key, version, corr) + string(client)


def frame(body):
    return struct.pack(">i", len(body)) + body


def produce_v3(topic, partition, records, acks=-1, corr=1, timeout_ms=10000, transactional_id=None):
    body = header(0, 3, corr) + string(transactional_id) + struct.pack(">hi", acks, timeout_ms)
    body += struct.pack(">i", 1) + string(topic) + struct.pack(">i", 1)
    body += struct.pack(">ii", partition, len(records)) + records
    return frame(body)


def parse_produce_v3(resp):
    """-> [(topic, partition, error_code, base_offset)]"""
    pos = 0
    (n_topics,) = struct.unpack_from(">i", resp, pos); pos += 4
    out = []
    for _ in range(n_topics):
        (ln,) = struct.unpack_from(">h", resp, pos); pos += 2
        name = resp[pos:pos + ln].decode(); pos += ln
        (n_parts,) = struct.unpack_from(">i", resp, pos); pos += 4
        for _ in range(n_parts):
            p, err, base, _ts = struct.unpack_from(">ihqq", resp, pos); pos += 22
            out.append((name, p, err, base))
    return out


class Conn:
    def __init__(self, addr, timeout=10):
        host, port = addr.rsplit(":", 1)
        self.s = socket.create_connection((host, int(port)), timeout=timeout)

    def send(self, data):
        self.s.sendall(data)

    def _read(self, n):
        buf = b""
        while len(buf) < n:
            chunk = self.s.recv(n - len(buf))
            if not chunk:
                raise EOFError("connection closed")
            buf += chunk
        return buf

    def recv(self):
        """-> (correlation id, body after the v0 response header)"""
        (size,) = struct.unpack(">i", self._read(4))
        data = self._read(size)
        return struct.unpack(">i", data[:4])[0], data[4:]

    def pending(self):
        """True if a response (or EOF) is readable right now, without waiting."""
        r, _, _ = select.select([self.s], [], [], 0)
        return bool(r)

    def closed_by_peer(self):
        """True once the broker has closed the connection (EOF or reset)."""
        try:
            return self.s.recv(1) == b""
        except ConnectionResetError:
            return True

    def close(self):
        self.s.close()


def api_versions_v0(conn, corr=99):
    conn.send(frame(header(18, 0, corr)))
    c, body = conn.recv()
    assert c == corr
    (err, n) = struct.unpack_from(">hi", body, 0)
    keys = {}
    for i in range(n):
        k, lo, hi = struct.unpack_from(">hhh", body, 6 + 6 * i)
        keys[k] = (lo, hi)
    return err, keys


# COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR,
# CONCURRENT_TRANSACTIONS: a coordinator that is getting ready; clients retry them.
COORDINATOR_RETRIABLE = (14, 15, 16, 51)


def init_producer_id(addr, transactional_id=None, timeout_ms=60000, deadline=30):
    """InitProducerId v0 -> (producer id, epoch), retrying (bounded) while the
    coordinator gets ready; raises on any other error code."""
    end = time.monotonic() + deadline
    while True:
        conn = Conn(addr)
        try:
            conn.send(frame(header(22, 0, 7) + string(transactional_id) + struct.pack(">i", timeout_ms)))
            corr, body = conn.recv()
            assert corr == 7
            _throttle, err, pid, epoch = struct.unpack_from(">ihqh", body, 0)
        finally:
            conn.close()
        if err == 0:
            return pid, epoch
        if err not in COORDINATOR_RETRIABLE or time.monotonic() > end:
            raise RuntimeError(f"InitProducerId error {err}")
        time.sleep(0.1)


def fetch_v4(topic, partition, offset, max_wait_ms=500, min_bytes=1, max_bytes=50 << 20,
             partition_max_bytes=1 << 20, corr=1):
    body = header(1, 4, corr) + struct.pack(">iiiib", -1, max_wait_ms, min_bytes, max_bytes, 0)
    body += struct.pack(">i", 1) + string(topic) + struct.pack(">i", 1)
    body += struct.pack(">iqi", partition, offset, partition_max_bytes)
    return frame(body)


def parse_fetch_v4(resp):
    """-> [(topic, partition, error_code, high_watermark, records bytes)]"""
    pos = 4  # throttle time
    (n_topics,) = struct.unpack_from(">i", resp, pos); pos += 4
    out = []
    for _ in range(n_topics):
        (ln,) = struct.unpack_from(">h", resp, pos); pos += 2
        name = resp[pos:pos + ln].decode(); pos += ln
        (n_parts,) = struct.unpack_from(">i", resp, pos); pos += 4
        for _ in range(n_parts):
            p, err, hw, _lso = struct.unpack_from(">ihqq", resp, pos); pos += 22
            (n_aborted,) = struct.unpack_from(">i", resp, pos); pos += 4
            pos += max(n_aborted, 0) * 16
            (rl,) = struct.unpack_from(">i", resp, pos); pos += 4
            recs = resp[pos:pos + max(rl, 0)]; pos += max(rl, 0)
            out.append((name, p, err, hw, recs))
    return out


def list_offsets_v1(topic, partitions, timestamp=-1, corr=1):
    body = header(2, 1, corr) + struct.pack(">i", -1) + struct.pack(">i", 1) + string(topic)
    body += struct.pack(">i", len(partitions))
    for p in partitions:
        body += struct.pack(">iq", p, timestamp)
    return frame(body)


def parse_list_offsets_v1(resp):
    """-> {partition: (error_code, offset)} of the one topic asked"""
    pos = 4  # topics count (1)
    (ln,) = struct.unpack_from(">h", resp, pos); pos += 2 + ln
    (n,) = struct.unpack_from(">i", resp, pos); pos += 4
    out = {}
    for _ in range(n):
        p, err, _ts, off = struct.unpack_from(">ihqq", resp, pos); pos += 22
        out[p] = (err, off)
    return out


def batch_count(records):
    n, pos = 0, 0
    while pos + 12 <= len(records):
        (ln,) = struct.unpack_from(">i", records, pos + 8)
        pos += 12 + ln
        n += 1
    return n


def compact_string(s):
    """A compact nullable string (flexible versions): uvarint(len + 1), 0 for null."""
    if s is None:
        return uvarint(0)
    b = s.encode()
    return uvarint(len(b) + 1) + b


def metadata_v12(topics, corr=1, auto=False):
    """Metadata v12 (flexible) for `topics`: [(name or None, 16-byte topic id)]."""
    body = struct.pack(">hhi", 3, 12, corr) + string("e2e") + uvarint(0)
    body += uvarint(len(topics) + 1)
    for name, topic_id in topics:
        body += topic_id + compact_string(name) + uvarint(0)
    body += struct.pack(">??", auto, False) + uvarint(0)
    return frame(body)


class _Reader:
    def __init__(self, buf):
        self.buf, self.pos = buf, 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return v[0] if len(v) == 1 else v

    def uvarint(self):
        n = shift = 0
        while True:
            b = self.buf[self.pos]
            self.pos += 1
            n |= (b & 0x7F) << shift
            if b < 0x80:
                return n
            shift += 7

    def compact_string(self):
        n = self.uvarint()
        if n == 0:
            return None
        s = self.buf[self.pos:self.pos + n - 1].decode()
        self.pos += n - 1
        return s

    def raw(self, n):
        b = self.buf[self.pos:self.pos + n]
        self.pos += n
        return b

    def tags(self):
        for _ in range(self.uvarint()):
            self.uvarint()
            self.pos += self.uvarint()


def parse_metadata_v12(body):
    """The body of a Metadata v12 response (after the correlation id) ->
    [(error code, name or None, 16-byte topic id, partition count)]."""
    r = _Reader(body)
    r.tags()  # response header v1
    r.take(">i")  # throttle
    for _ in range(r.uvarint() - 1):  # brokers
        r.take(">i"); r.compact_string(); r.take(">i"); r.compact_string(); r.tags()
    r.compact_string()  # cluster id
    r.take(">i")  # controller
    topics = []
    for _ in range(r.uvarint() - 1):
        err = r.take(">h")
        name = r.compact_string()
        topic_id = r.raw(16)
        r.take(">?")
        n_parts = r.uvarint() - 1
        for _ in range(n_parts):
            r.take(">hiii")
            for _ in range(3):  # replicas, isr, offline
                for _ in range(r.uvarint() - 1):
                    r.take(">i")
            r.tags()
        r.take(">i")  # authorized operations
        r.tags()
        topics.append((err, name, topic_id, n_parts))
    return topics
