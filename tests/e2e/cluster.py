"""A multi-broker Sluice cluster of real processes on loopback, for the cluster e2e tests.

    c = Cluster(tmp_path, n=3).start()        # brokers 1..n, each its own process
    c.create_topic("t", partitions=1, rf=3, configs={"min.insync.replicas": "2"})
    leader = c.leader_of("t", 0)
    c.kill(leader)                             # SIGKILL
    c.wait_until(lambda: c.leader_of("t", 0) not in (-1, leader), 20, "new leader")
    c.restart(leader)
    c.stop()

Every broker gets free loopback ports for its Kafka listener and its controller listener
and is started with the issue-6 CLI contract:

    sluice serve --node-id N --listen 127.0.0.1:K --controller-listen 127.0.0.1:C
                 --controller-quorum 1@127.0.0.1:C1,2@...,3@... --data-dir DIR
                 --broker-session-timeout-ms 3000 --broker-heartbeat-interval-ms 300
                 --replica-lag-time-max-ms 5000

Isolating a broker (`proxied=True`, then `isolate(n)` / `heal()`)
-----------------------------------------------------------------
Choice: a fault-injecting TCP proxy in the harness, not network namespaces. Namespaces
need root (CAP_NET_ADMIN) and `ip`, which CI runners and developer machines often lack;
they also force every broker off 127.0.0.1 onto veth addresses, so the client side of
the test would need a bridge and routes as well. The proxy works unprivileged, on
loopback only, and can cut exactly the links a test names.

With `proxied=True` every broker N gets two proxy ports in front of its two listeners:
  * its Kafka proxy is what it advertises (`--advertised`), so clients *and* follower
    fetches from the other brokers reach N through it;
  * its controller proxy is what every broker's `--controller-quorum` lists for N, so
    raft traffic, registration and heartbeats to N go through it.
All brokers connect from 127.0.0.1, so the proxy tells who is connecting by looking the
connecting socket up in /proc (the inode of the peer's socket in /proc/net/tcp, then
which broker process holds that inode among its fds); anything that is not a broker
process is "client" (this test process and its librdkafka threads).

A cut link stalls, like a real partition: the proxy stops forwarding in both directions
(bytes already read are held back, TCP back-pressure does the rest) and new connections
are accepted but carry nothing. `heal()` resumes them (as TCP retransmission would after
a short partition). `isolate(n)` cuts n from every other broker; `isolate(n,
clients=True)` also from clients. Traffic to a broker from itself is never cut.
"""
import asyncio
import os
import re
import signal
import socket
import struct
import threading
import time
import uuid

from conftest import Broker, check_brokers, check_consumer_error, free_port
from conftest import wait_until as _wait_until

FAST_FLAGS = ["--broker-session-timeout-ms", "3000", "--broker-heartbeat-interval-ms", "300",
              "--replica-lag-time-max-ms", "5000"]


def free_ports(n):
    """n distinct free loopback ports, none handed out before in this run."""
    return [free_port() for _ in range(n)]


def port_free(port):
    """True if a plain bind (SO_REUSEADDR, as the broker's own start-up check does)
    to 127.0.0.1:port succeeds."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def wait_until(pred, deadline, what="condition", interval=0.1, retry=()):
    """Calls `pred` until it returns a truthy value (returned) or `deadline` seconds
    pass (AssertionError naming `what` and the last value or transient error). Only
    expected transient errors are retried (conftest.is_transient; `retry` adds
    exception classes or KafkaError codes): an AssertionError or any other exception
    from `pred` fails at once."""
    return _wait_until(pred, timeout=deadline, interval=interval, what=what, retry=retry)


# --- fault-injecting proxy ------------------------------------------------------------

def _socket_inode(peer_port, local_port):
    """Inode of the socket bound to 127.0.0.1:peer_port connected to local_port."""
    want_local = "0100007F:%04X" % peer_port
    want_rem = ":%04X" % local_port
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as f:
                next(f)
                for line in f:
                    p = line.split()
                    loc, rem = p[1], p[2]
                    if (loc == want_local or loc.endswith("0100007F:%04X" % peer_port)) \
                            and rem.endswith(want_rem):
                        return p[9]
        except OSError:
            pass
    return None


class Faults:
    """TCP proxies on one asyncio loop (a daemon thread) with a set of cut links.

    `add(dst, target_port)` opens a proxy to 127.0.0.1:target_port that belongs to
    broker `dst`, returns its port. `pids()` returns {broker id: pid} of the running
    brokers, so connections can be attributed to their source broker."""

    def __init__(self, pids):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="fault-proxy", daemon=True)
        self.thread.start()
        self.pids = pids
        self.cut = set()  # frozenset({a, b}) for a, b in broker ids or "client"
        self.servers = []
        self.conns = {}  # id -> (src, dst) of live connections, for inspection
        self._changed = None
        self._run(self._init())

    async def _init(self):
        self._changed = asyncio.Condition()

    def _run(self, coro, timeout=10):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def add(self, dst, target_port):
        async def start():
            srv = await asyncio.start_server(
                lambda r, w: self._handle(r, w, dst, target_port), "127.0.0.1", 0)
            self.servers.append(srv)
            return srv.sockets[0].getsockname()[1]
        return self._run(start())

    def source_of(self, peer_port, local_port):
        inode = _socket_inode(peer_port, local_port)
        if inode is None:
            return "client"
        target = f"socket:[{inode}]"
        for node, pid in self.pids().items():
            try:
                fds = os.listdir(f"/proc/{pid}/fd")
            except OSError:
                continue
            for fd in fds:
                try:
                    if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                        return node
                except OSError:
                    pass
        return "client"

    def is_cut(self, a, b):
        return a != b and frozenset((a, b)) in self.cut

    async def _set_cut(self, cut):
        async with self._changed:
            self.cut = cut
            self._changed.notify_all()

    def set_cut(self, cut):
        self._run(self._set_cut(set(cut)))

    async def _pump(self, reader, writer, src, dst):
        try:
            while True:
                data = await reader.read(1 << 16)
                if not data:
                    break
                if self.is_cut(src, dst):
                    async with self._changed:
                        await self._changed.wait_for(lambda: not self.is_cut(src, dst))
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError, asyncio.CancelledError):
            pass
        finally:
            try:
                writer.close()
            except Exception:  # noqa: BLE001
                pass

    async def _handle(self, creader, cwriter, dst, target_port):
        peer = cwriter.get_extra_info("peername")
        local = cwriter.get_extra_info("sockname")
        src = self.source_of(peer[1], local[1])
        try:
            ureader, uwriter = await asyncio.open_connection("127.0.0.1", target_port)
        except OSError:
            cwriter.close()
            return
        key = uuid.uuid4().hex
        self.conns[key] = (src, dst)
        try:
            await asyncio.gather(self._pump(creader, uwriter, src, dst),
                                 self._pump(ureader, cwriter, dst, src))
        finally:
            self.conns.pop(key, None)

    def close(self):
        async def stop():
            for s in self.servers:
                s.close()
        try:
            self._run(stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(5)


# --- Metadata v1 straight to one broker -------------------------------------------------

def _str(b, i):
    (n,) = struct.unpack_from(">h", b, i)
    i += 2
    if n < 0:
        return None, i
    return b[i:i + n].decode(), i + n


def _call(s, body):
    """Sends one request frame on socket `s` and returns the response frame's body."""
    s.sendall(struct.pack(">i", len(body)) + body)

    def take(n):
        b = b""
        while len(b) < n:
            chunk = s.recv(n - len(b))
            if not chunk:
                raise ConnectionError("closed")
            b += chunk
        return b
    (n,) = struct.unpack(">i", take(4))
    return take(n)


def sasl_plain_login(s, user, password):
    """Logs socket `s` in with SASL/PLAIN (SaslHandshake v1, SaslAuthenticate v0), as a
    client does on a SASL listener; raises PermissionError with the broker's error code
    when refused."""
    client = struct.pack(">h", 5) + b"e2e-m"
    mech = b"PLAIN"
    r = _call(s, struct.pack(">hhi", 17, 1, 11) + client + struct.pack(">h", len(mech)) + mech)
    (code,) = struct.unpack_from(">h", r, 4)
    if code:
        raise PermissionError(f"SaslHandshake error {code}")
    token = b"\0" + user.encode() + b"\0" + password.encode()
    r = _call(s, struct.pack(">hhi", 36, 0, 12) + client + struct.pack(">i", len(token)) + token)
    (code,) = struct.unpack_from(">h", r, 4)
    if code:
        raise PermissionError(f"SaslAuthenticate error {code}")


def metadata_from(addr, topics=None, timeout=5.0, tls=None, sasl=None):
    """Metadata v1 asked of exactly the broker at `addr` (librdkafka picks any broker,
    which is no good for "what does broker N believe"); over TLS with the
    `ssl.SSLContext` `tls` when given, logged in with SASL/PLAIN as `sasl` (user,
    password) when given. Returns
    {"controller": id, "brokers": {id: "host:port"},
     "topics": {name: {p: {"leader", "replicas", "isr", "error"}}}}."""
    body = struct.pack(">hhi", 3, 1, 7) + struct.pack(">h", 5) + b"e2e-m"
    if topics is None:
        body += struct.pack(">i", -1)
    else:
        body += struct.pack(">i", len(topics))
        for t in topics:
            tb = t.encode()
            body += struct.pack(">h", len(tb)) + tb
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as raw, \
            (tls.wrap_socket(raw, server_hostname=host) if tls is not None else raw) as s:
        s.settimeout(timeout)
        if sasl is not None:
            sasl_plain_login(s, *sasl)
        s.sendall(struct.pack(">i", len(body)) + body)
        hdr = b""
        while len(hdr) < 4:
            chunk = s.recv(4 - len(hdr))
            if not chunk:
                raise ConnectionError("closed")
            hdr += chunk
        (n,) = struct.unpack(">i", hdr)
        b = b""
        while len(b) < n:
            chunk = s.recv(n - len(b))
            if not chunk:
                raise ConnectionError("closed")
            b += chunk
    i = 4  # correlation id
    (nb,) = struct.unpack_from(">i", b, i)
    i += 4
    brokers = {}
    for _ in range(nb):
        (nid,) = struct.unpack_from(">i", b, i)
        h, i = _str(b, i + 4)
        (p,) = struct.unpack_from(">i", b, i)
        _, i = _str(b, i + 4)  # rack
        brokers[nid] = f"{h}:{p}"
    (controller, nt) = struct.unpack_from(">ii", b, i)
    i += 8
    out = {}
    for _ in range(nt):
        (terr,) = struct.unpack_from(">h", b, i)
        name, i = _str(b, i + 2)
        i += 1  # is_internal
        (np_,) = struct.unpack_from(">i", b, i)
        i += 4
        parts = {}
        for _ in range(np_):
            perr, pid, leader = struct.unpack_from(">hii", b, i)
            i += 10
            (nr,) = struct.unpack_from(">i", b, i)
            replicas = list(struct.unpack_from(">%di" % nr, b, i + 4))
            i += 4 + 4 * nr
            (ni,) = struct.unpack_from(">i", b, i)
            isr = list(struct.unpack_from(">%di" % ni, b, i + 4))
            i += 4 + 4 * ni
            parts[pid] = {"leader": leader, "replicas": replicas, "isr": isr, "error": perr}
        out[name] = {"error": terr, "partitions": parts}
    return {"controller": controller, "brokers": brokers, "topics": out}


# --- on-disk log comparison -------------------------------------------------------------

def disk_batches(data_dir, topic, partition):
    """[(base_offset, last_offset, leader_epoch, crc)] of every batch in the partition's
    segments on disk, in order, stopping at padding or a torn tail
    (<data>/<topic>-<partition>/<20-digit base>.log)."""
    d = os.path.join(data_dir, f"{topic}-{partition}")
    out = []
    if not os.path.isdir(d):
        return out
    for name in sorted(f for f in os.listdir(d) if f.endswith(".log")):
        with open(os.path.join(d, name), "rb") as f:
            data = f.read()
        i = 0
        while i + 61 <= len(data):
            base, length, epoch, magic, crc, _attrs, delta = struct.unpack_from(">qiibIhi", data, i)
            if length <= 0 or magic != 2 or i + 12 + length > len(data):
                break
            out.append((base, base + delta, epoch, crc))
            i += 12 + length
    return out


# --- the cluster ------------------------------------------------------------------------

class Cluster:
    def __init__(self, root, n=3, proxied=False, extra=(), cores=1, fast=True, env=None, roles=None,
                 tls=None, sasl=None, node_extra=None):
        """`tls`: an `ssl.SSLContext` the harness's own Metadata requests use (the
        brokers' listeners are SSL, as `extra` configures them); `sasl`: the (user,
        password) they log in with over PLAIN (the listeners are SASL and offer it);
        `node_extra(i, kafka_port)`: flags of broker i alone (named listeners, one of
        them on `kafka_port`, which the harness talks to)."""
        self.root = str(root)
        self.tls = tls
        self.sasl = sasl
        self.n = n
        self.ids = list(range(1, n + 1))
        self.proxied = proxied
        ports = free_ports(2 * n)
        self.kafka_port = {i: ports[2 * (i - 1)] for i in self.ids}
        self.controller_port = {i: ports[2 * (i - 1) + 1] for i in self.ids}
        self.brokers = {}
        self.faults = Faults(self._pids) if proxied else None
        if proxied:
            self.kafka_front = {i: self.faults.add(i, self.kafka_port[i]) for i in self.ids}
            self.controller_front = {i: self.faults.add(i, self.controller_port[i]) for i in self.ids}
        else:
            self.kafka_front = dict(self.kafka_port)
            self.controller_front = dict(self.controller_port)
        quorum = ",".join(f"{i}@127.0.0.1:{self.controller_front[i]}" for i in self.ids)
        self._node_args = (quorum, cores, fast, tuple(extra), env)
        for i in self.ids:
            flags = ["--node-id", str(i),
                     "--controller-listen", f"127.0.0.1:{self.controller_port[i]}",
                     "--controller-quorum", quorum]
            if roles is not None:
                flags += ["--process-roles", roles]
            if proxied:
                flags += ["--advertised", f"127.0.0.1:{self.kafka_front[i]}"]
            flags += (FAST_FLAGS if fast else []) + list(extra)
            if node_extra is not None:
                flags += list(node_extra(i, self.kafka_port[i]))
            self.brokers[i] = Broker(os.path.join(self.root, f"node-{i}"), port=self.kafka_port[i],
                                     cores=cores, extra=flags, env=env)
        self._admin = None

    # -- processes --

    def data_dir(self, i):
        return self.brokers[i].data_dir

    def addr(self, i):
        """The address clients use for broker i (its proxy when proxied)."""
        return f"127.0.0.1:{self.kafka_front[i]}"

    @property
    def bootstrap(self):
        return ",".join(self.addr(i) for i in self.ids)

    def _pids(self):
        # Broker.start assigns `proc` right after spawning, before it waits for the
        # port, so a starting broker's first connections are already attributed to it.
        return {i: b.proc.pid for i, b in list(self.brokers.items())
                if b.proc is not None and b.proc.poll() is None}

    def start(self, deadline=60):
        """Starts every broker process, then waits until each answers Kafka requests
        and the cluster metadata names a controller and lists every broker. (All are
        spawned before any wait: a broker opens its Kafka port only once a quorum of
        controllers runs.)"""
        try:
            for i in self.ids:
                self._spawn(i)
            for i in self.ids:
                self._wait_answering(i, deadline)
            self.wait_until(lambda: self.registered() == set(self.ids), deadline,
                            f"all {self.n} brokers registered with a controller")
        except BaseException:
            for i in self.ids:
                if self.alive(i):
                    print(f"--- broker {i} ---\n{self.log(i)[-2000:]}")
            try:
                self.stop()  # no fixture teardown runs when set-up fails
            except AssertionError as e:
                print(e)
            raise
        return self

    def add_node(self, i, roles=None, deadline=60):
        """Starts node i outside the bootstrap voters (`--controller-quorum` names the
        cluster's first voters, not it): it joins the metadata quorum as a learner and
        registers as a broker. Waits until the cluster metadata lists it (a controller
        without the broker role: until it says it runs)."""
        assert i not in self.ids and not self.proxied
        quorum, cores, fast, extra, env = self._node_args
        self.kafka_port[i], self.controller_port[i] = free_ports(2)
        self.kafka_front[i] = self.kafka_port[i]
        self.controller_front[i] = self.controller_port[i]
        flags = ["--node-id", str(i),
                 "--controller-listen", f"127.0.0.1:{self.controller_port[i]}",
                 "--controller-quorum", quorum]
        if roles is not None:
            flags += ["--process-roles", roles]
        flags += (FAST_FLAGS if fast else []) + list(extra)
        self.brokers[i] = Broker(os.path.join(self.root, f"node-{i}"), port=self.kafka_port[i],
                                 cores=cores, extra=flags, env=env)
        self.ids.append(i)
        self.n += 1
        self._spawn(i, deadline)
        if roles == "controller":
            self.wait_until(lambda: "a controller only" in self.log(i), deadline, f"controller {i} running")
            return
        self._wait_answering(i, deadline)
        self.wait_until(lambda: i in self.registered(), deadline, f"node {i} registered")

    def _spawn(self, i, deadline=30):
        # A SIGKILLed broker's listening sockets can outlive the process for a moment
        # (glommio's io_uring is torn down asynchronously by the kernel): wait until its
        # ports are really free, or the new process fails its port check.
        self.wait_until(lambda: port_free(self.kafka_port[i]) and port_free(self.controller_port[i]),
                        deadline, f"ports of broker {i} free")
        self.brokers[i].spawn()

    def _wait_answering(self, i, deadline=30):
        b = self.brokers[i]
        b.wait_ready(timeout=deadline)

        # The port accepting is not enough: make sure it is this process answering
        # Kafka requests, not a lingering socket.
        def answers():
            if not b.alive():
                raise AssertionError(f"broker {i} exited: {b.read_log()[-2000:]}")
            metadata_from(f"127.0.0.1:{self.kafka_port[i]}", topics=[], timeout=2, tls=self.tls, sasl=self.sasl)
            return True
        self.wait_until(answers, deadline, f"broker {i} answering Metadata")

    def registered(self):
        """Broker ids in the cluster metadata, if some broker answers and names a
        controller; else an empty set."""
        for i in self.ids:
            if not self.alive(i):
                continue
            try:
                m = metadata_from(self.addr(i), topics=[], tls=self.tls, sasl=self.sasl)
            except OSError:
                continue
            if m["controller"] >= 0:
                return set(m["brokers"])
        return set()

    def alive(self, i):
        return self.brokers[i].alive()

    def kill(self, i, sig=signal.SIGKILL):
        """SIGKILL (or `sig`) broker i; the health check at the end accepts its exit."""
        self.brokers[i].kill(sig)

    def restart(self, i, deadline=30):
        """Starts broker i again and waits until the cluster metadata lists it."""
        assert not self.alive(i), f"broker {i} is still running"
        self._spawn(i, deadline)
        self._wait_answering(i, deadline)
        self.wait_until(lambda: i in self.registered(), deadline, f"broker {i} registered again")

    def stop(self, expected_errors=()):
        """Ends the cluster and checks its health: each broker the test did not end
        must still be running, stops on SIGTERM with exit code 0 (SIGKILL after 30 s),
        and its log has no ERROR or panic line outside `expected_errors` (regexes) and
        its own Broker.expected_errors. Closes the proxies. Raises AssertionError with
        the problems and log tails."""
        try:
            check_brokers([self.brokers[i] for i in self.ids], expected_errors, names=self.ids)
        finally:
            self._admin = None
            if self.faults is not None:
                self.faults.close()
                self.faults = None

    def log(self, i):
        return self.brokers[i].read_log()

    def shards_of(self, i):
        """{(topic, partition): shard} of the logs broker i opened, from its
        `opened log` debug lines (needs RUST_LOG with sluice::partition::broker=debug)."""
        return {(t, int(p)): int(s) for s, t, p in
                re.findall(r"opened log shard=(\d+) topic=(\S+) partition=(\d+)", self.log(i))}

    # -- faults --

    def isolate(self, i, clients=False):
        assert self.faults is not None, "isolate needs Cluster(proxied=True)"
        cut = {frozenset((i, j)) for j in self.ids if j != i}
        if clients:
            cut.add(frozenset((i, "client")))
        self.faults.set_cut(cut)

    def heal(self):
        self.faults.set_cut(set())

    # -- waiting --

    @staticmethod
    def wait_until(pred, deadline, what="condition", interval=0.1, retry=()):
        return wait_until(pred, deadline, what, interval, retry)

    # -- clients and metadata --

    def admin(self):
        from confluent_kafka.admin import AdminClient
        if self._admin is None:
            # librdkafka sends admin requests (CreateTopics, DescribeCluster) to the
            # controller it last saw in Metadata: refresh that every second so a
            # controller failover is noticed.
            self._admin = AdminClient({"bootstrap.servers": self.bootstrap,
                                       "socket.connection.setup.timeout.ms": 3000,
                                       "reconnect.backoff.max.ms": 500,
                                       "topic.metadata.refresh.interval.ms": 1000})
        return self._admin

    def partition_meta(self, topic, partition, timeout=5):
        md = self.admin().list_topics(topic=topic, timeout=timeout)
        t = md.topics[topic]
        if t.error is not None:
            from confluent_kafka import KafkaException
            raise KafkaException(t.error)  # transient (LEADER_NOT_AVAILABLE, ...) or not
        return t.partitions[partition]

    def leader_of(self, topic, partition):
        """Leader id (-1: none) of topic-partition, per the cluster's Metadata."""
        return self.partition_meta(topic, partition).leader

    def isr_of(self, topic, partition):
        return sorted(self.partition_meta(topic, partition).isrs)

    def replicas_of(self, topic, partition):
        return list(self.partition_meta(topic, partition).replicas)

    def controller_id(self, timeout=5):
        """The controller id DescribeCluster reports (-1 if none)."""
        d = self.admin().describe_cluster(request_timeout=timeout).result(timeout=timeout + 1)
        return d.controller.id if d.controller is not None else -1

    def create_topic(self, name, partitions=1, rf=3, configs=None, deadline=30):
        """Creates the topic and waits until every partition has a leader and a full
        ISR in the cluster's metadata."""
        from confluent_kafka.admin import NewTopic
        fut = self.admin().create_topics([NewTopic(name, partitions, rf, config=configs or {})],
                                         request_timeout=15)[name]
        fut.result(timeout=20)

        def ready():
            md = self.admin().list_topics(topic=name, timeout=5).topics[name]
            return md.error is None and len(md.partitions) == partitions and all(
                p.leader >= 0 and len(p.isrs) == rf for p in md.partitions.values())
        self.wait_until(ready, deadline, f"{name}: leaders and full ISRs")

    def read_all(self, topic, partition, deadline=30, **conf):
        """Every record of topic-partition from the earliest offset up to the high
        watermark at the time of the call: [(offset, key, value)]."""
        from confluent_kafka import Consumer, TopicPartition, OFFSET_BEGINNING
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"read-{uuid.uuid4().hex[:8]}",
                      "enable.auto.commit": False, "auto.offset.reset": "earliest",
                      "enable.partition.eof": True, **conf})
        try:
            low, high = self.wait_until(
                lambda: c.get_watermark_offsets(TopicPartition(topic, partition), timeout=5),
                deadline, f"watermarks of {topic}-{partition}")
            c.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
            out = []
            end = time.monotonic() + deadline
            # Done once the consumer's position passes the high watermark taken above
            # (the last offsets may be transaction markers, which are never returned).
            position = low
            while position < high:
                if time.monotonic() > end:
                    raise AssertionError(f"read {len(out)} records of {topic}-{partition} "
                                         f"(position {position}), wanted up to offset {high}")
                m = c.poll(0.5)
                if m is not None and m.error() is None:
                    out.append((m.offset(), m.key(), m.value()))
                elif m is not None:
                    check_consumer_error(m.error())  # end of partition, transient, else fails
                [tp] = c.position([TopicPartition(topic, partition)])
                position = max(position, tp.offset)
            return out
        finally:
            c.close()
