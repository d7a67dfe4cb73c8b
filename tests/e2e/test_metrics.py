"""Tier: black-box tests of the metrics endpoint (`--metrics-listen`): real brokers,
real Kafka clients (confluent-kafka), the page parsed with Prometheus' own Python text
parser (prometheus_client), and a real Prometheus server (Debian's `prometheus`)
scraping a broker. Every wait is a bounded poll: shards publish partition state every
500 ms, Prometheus scrapes every second.
"""
import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse
import uuid
import json

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition, OFFSET_BEGINNING
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client.parser import text_string_to_metric_families

from conftest import http_get, Broker, ROOT, SLUICE_BIN, check_brokers, check_consumer_error, free_port, wait_until
from cluster import Cluster
from test_tls import certs  # noqa: F401 (the certificates fixture)



def scrape(broker):
    """The broker's /metrics parsed: {(sample name, frozenset(labels)): value}, and the
    families' types {family name: type}. The parser raises on anything malformed."""
    status, text = http_get(broker.metrics_url + "/metrics")
    assert status == 200, (status, text[:500])
    samples, types = {}, {}
    for fam in text_string_to_metric_families(text):
        types[fam.name] = fam.type
        for s in fam.samples:
            key = (s.name, frozenset(s.labels.items()))
            assert key not in samples, f"duplicate sample {key}"
            samples[key] = s.value
    return samples, types


def value(samples, name, **labels):
    return samples.get((name, frozenset(labels.items())))


def create_topic(bootstrap, name, partitions, rf=1):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, rf)], request_timeout=15)[name].result(timeout=20)


def produce(bootstrap, topic, counts):
    """Produces counts[p] records to partition p (acks=all) and waits for every ack."""
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    errors = []
    for part, n in enumerate(counts):
        for i in range(n):
            p.produce(topic, value=f"v{part}-{i}".encode(), partition=part,
                      on_delivery=lambda err, msg: err and errors.append(err))
    assert p.flush(30) == 0, "unacknowledged records"
    assert not errors, errors


def consume_all(bootstrap, topic, counts):
    """Reads every partition from the beginning until counts[p] records each."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"m-{uuid.uuid4().hex[:6]}",
                  "enable.auto.commit": False, "enable.partition.eof": True})
    try:
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(len(counts))])
        got = [0] * len(counts)
        deadline = time.monotonic() + 30
        while got != list(counts):
            assert time.monotonic() < deadline, f"consumed {got}, wanted {counts}"
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error() is not None:
                check_consumer_error(m.error())
                continue
            got[m.partition()] += 1
        return got
    finally:
        c.close()


def test_metrics_count_what_clients_did(make_broker):
    """Produce and consume through two shards, then the page has exact figures: records
    in, per-partition high watermark and log end, request counts, ISR 1 and nothing
    under-replicated; every sluice_ family is typed; histograms are consistent."""
    b = make_broker(cores=2)
    before, _ = scrape(b)
    topic = f"m-{uuid.uuid4().hex[:6]}"
    counts = [5, 7, 11]
    create_topic(b.addr, topic, len(counts))
    produce(b.addr, topic, counts)
    consume_all(b.addr, topic, counts)

    def settled():
        s, _ = scrape(b)
        hws = [value(s, "sluice_partition_high_watermark", topic=topic, partition=str(p))
               for p in range(len(counts))]
        return (s, hws) if hws == counts else None
    samples, _ = wait_until(settled, timeout=20, what="high watermarks on /metrics")
    samples, types = scrape(b)

    assert value(samples, "sluice_records_in_total") == sum(counts)
    # The consumer read each record once; records_out counts what Fetch returned.
    assert value(samples, "sluice_records_out_total") == sum(counts)
    for p, n in enumerate(counts):
        labels = {"topic": topic, "partition": str(p)}
        assert value(samples, "sluice_partition_log_end_offset", **labels) == n
        assert value(samples, "sluice_partition_log_start_offset", **labels) == 0
        assert value(samples, "sluice_partition_isr_size", **labels) == 1
        assert value(samples, "sluice_partition_under_replicated", **labels) == 0
        assert value(samples, "sluice_partition_offline", **labels) == 0
        assert value(samples, "sluice_partition_leader", **labels) == 1
        assert value(samples, "sluice_partition_size_bytes", **labels) > 0
    assert value(samples, "sluice_under_replicated_partitions") == 0
    assert value(samples, "sluice_offline_partitions") == 0
    for api in ("Produce", "Fetch", "Metadata", "CreateTopics"):
        old = value(before, "sluice_requests_total", api=api) or 0
        assert value(samples, "sluice_requests_total", api=api) > old, api
        # Every request is in its latency histogram, and the +Inf bucket holds them all.
        assert value(samples, "sluice_request_latency_seconds_count", api=api) == \
            value(samples, "sluice_requests_total", api=api)
        assert value(samples, "sluice_request_latency_seconds_bucket", api=api, le="+Inf") == \
            value(samples, "sluice_request_latency_seconds_count", api=api)
    assert value(samples, "sluice_bytes_in_total") > value(before, "sluice_bytes_in_total")
    assert value(samples, "sluice_bytes_out_total") > value(before, "sluice_bytes_out_total")
    assert value(samples, "sluice_connections_accepted_total") >= 2
    # Each acks=all produce request waited for its flush (fdatasync by default).
    assert value(samples, "sluice_fsync_latency_seconds_count") >= 1
    assert value(samples, "sluice_append_latency_seconds_count") >= len(counts)
    assert value(samples, "sluice_up") == 1
    assert value(samples, "sluice_ready") == 1
    assert value(samples, "sluice_shards") == 2
    assert value(samples, "sluice_controller_active") == 1
    assert value(samples, "sluice_leader_partitions") >= len(counts)
    assert value(samples, "sluice_disk_free_bytes") > 0
    assert value(samples, "sluice_disk_low") == 0
    for name, kind in types.items():
        assert kind in ("counter", "gauge", "histogram"), (name, kind)
    assert types["sluice_request_latency_seconds"] == "histogram"
    assert types["sluice_requests"] == "counter"  # the parser drops _total


def test_ongoing_transactions_are_counted(make_broker):
    """A transactional producer's open transaction shows as 1 until it commits."""
    b = make_broker()
    topic = f"t-{uuid.uuid4().hex[:6]}"
    create_topic(b.addr, topic, 1)
    p = Producer({"bootstrap.servers": b.addr, "transactional.id": f"tx-{uuid.uuid4().hex[:6]}"})
    p.init_transactions(30)
    p.begin_transaction()
    p.produce(topic, value=b"x")
    assert p.flush(30) == 0

    def ongoing(n):
        return lambda: value(scrape(b)[0], "sluice_ongoing_transactions") == n
    wait_until(ongoing(1), timeout=20, what="one ongoing transaction")
    p.commit_transaction(30)
    wait_until(ongoing(0), timeout=20, what="no ongoing transaction")


def test_health_and_ready_codes(tmp_path):
    """A broker whose controller quorum has not formed runs (/health 200) but is not
    ready (/ready 503); once the quorum forms and it serves Kafka, /ready is 200."""
    c = Cluster(tmp_path, n=3)
    try:
        c._spawn(1)
        b = c.brokers[1]
        wait_until(lambda: http_get(b.metrics_url + "/health", timeout=1)[0] == 200,
                   timeout=20, what="broker 1 /health", retry=(OSError,))
        status, body = http_get(b.metrics_url + "/ready")
        assert status == 503, (status, body)
        samples, _ = scrape(b)
        assert value(samples, "sluice_ready") == 0
        assert http_get(b.metrics_url + "/nope")[0] == 404
        for i in (2, 3):
            c._spawn(i)
        for i in c.ids:
            wait_until(lambda: http_get(c.brokers[i].metrics_url + "/ready", timeout=1)[0] == 200,
                       timeout=60, what=f"broker {i} /ready", retry=(OSError,))
        # Shard 0 publishes the broker-wide facts every 500 ms.
        samples = wait_until(lambda: (s := scrape(b)[0]) and value(s, "sluice_brokers") == 3 and s,
                             timeout=20, what="3 brokers on broker 1's page")
        assert value(samples, "sluice_fenced_brokers") == 0
        assert value(samples, "sluice_ready") == 1
        wait_until(lambda: sum(value(scrape(c.brokers[i])[0], "sluice_controller_active")
                               for i in c.ids) == 1, timeout=20, what="one active controller")
    finally:
        c.stop()


def listening_ports(pid):
    """TCP ports the process listens on (from /proc: its socket inodes, then the
    kernel's table of listening sockets)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in inodes:
                    ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


def test_metrics_listen_off_serves_nothing(make_broker):
    b = make_broker(extra=["--metrics-listen", "off"])
    assert listening_ports(b.proc.pid) == {b.port}
    assert "metrics on http" not in b.read_log()


def test_explicit_address_in_use_fails_start(tmp_path):
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        taken = blocker.getsockname()[1]
        p = subprocess.run([SLUICE_BIN, "serve", "--listen", f"127.0.0.1:{free_port()}",
                            "--data-dir", str(tmp_path / "d"), "--cores", "1",
                            "--metrics-listen", f"127.0.0.1:{taken}"],
                           capture_output=True, text=True, timeout=30)
    assert p.returncode != 0
    assert f"cannot serve metrics on --metrics-listen 127.0.0.1:{taken}" in p.stderr, p.stderr


@contextlib.contextmanager
def listening_below_the_ephemeral_range(offset):
    """(port, port + offset): `port` free (conftest.free_port: below the kernel's
    ephemeral range, so no outgoing connection takes it meanwhile), and a listener of
    this test's own on `port + offset`, also below that range, held while in the block."""
    for _ in range(100):
        port = free_port()  # its slice keeps 600 ports clear below the ephemeral range
        blocker = socket.socket()
        try:
            blocker.bind(("127.0.0.1", port + offset))
        except OSError:
            blocker.close()
            continue
        with blocker:
            blocker.listen()
            yield port, port + offset
        return
    raise AssertionError(f"no free port p below {low} with p + {offset} free too")


def test_default_address_in_use_is_a_warning(tmp_path):
    """The default (Kafka port + 552) taken by someone else: the broker starts anyway,
    without metrics, and says so. Also: a bad --metrics-listen is refused."""
    with listening_below_the_ephemeral_range(552) as (kafka, _):
        b = Broker(tmp_path / "d", port=kafka, metrics_port="default")
        try:
            b.start()
            assert "cannot serve metrics on the default address" in b.read_log()
            assert listening_ports(b.proc.pid) == {kafka}
        finally:
            check_brokers([b])
    p = subprocess.run([SLUICE_BIN, "serve", "--data-dir", str(tmp_path / "e"),
                        "--metrics-listen", "localhost"], capture_output=True, text=True, timeout=30)
    assert p.returncode != 0 and "--metrics-listen localhost: expected IP:PORT or off" in p.stderr, p.stderr


@pytest.fixture
def prometheus(tmp_path):
    """Starts a real Prometheus server; returns start(targets) -> its base URL."""
    exe = shutil.which("prometheus")
    if exe is None:
        pytest.fail("prometheus not installed (make deps installs Debian's prometheus)")
    procs = []

    def start(targets, tls_ca=None):
        """`tls_ca`: scrape over https, trusting that CA file."""
        port = free_port()
        d = tmp_path / "prometheus"
        d.mkdir()
        rules = os.path.join(ROOT, "deploy", "prometheus", "sluice-rules.yml")
        https = f"    scheme: https\n    tls_config:\n      ca_file: {tls_ca}\n" if tls_ca else ""
        (d / "prometheus.yml").write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            f"rule_files:\n  - {rules}\n"
            "scrape_configs:\n  - job_name: sluice\n" + https + "    static_configs:\n"
            f"      - targets: [{', '.join(repr(t) for t in targets)}]\n")
        log = open(d / "prometheus.log", "wb")
        procs.append((subprocess.Popen(
            [exe, f"--config.file={d / 'prometheus.yml'}", f"--storage.tsdb.path={d / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT), d))
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: http_get(url + "/-/ready", timeout=1)[0] == 200, timeout=30,
                   what="prometheus ready", retry=(OSError,))
        return url
    yield start
    for p, d in procs:
        p.terminate()
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def promql(url, query):
    status, body = http_get(url + "/api/v1/query?" + urllib.parse.urlencode({"query": query}))
    assert status == 200, body
    r = json.loads(body)
    assert r["status"] == "success", r
    return {frozenset((k, v) for k, v in s["metric"].items() if k not in ("instance", "job")):
            float(s["value"][1]) for s in r["data"]["result"]}


def test_real_prometheus_scrapes_the_broker(make_broker, prometheus):
    """Prometheus scrapes the broker (with the shipped rules loaded) and its query API
    returns the high watermarks the clients produced, and the recording rules run."""
    b = make_broker(cores=2)
    topic = f"p-{uuid.uuid4().hex[:6]}"
    counts = [3, 8]
    create_topic(b.addr, topic, len(counts))
    produce(b.addr, topic, counts)
    url = prometheus([b.metrics_url.removeprefix("http://")])

    def hws():
        got = promql(url, f'sluice_partition_high_watermark{{topic="{topic}"}}')
        want = {frozenset({("__name__", "sluice_partition_high_watermark"), ("topic", topic),
                           ("partition", str(p))}): float(n) for p, n in enumerate(counts)}
        return got == want
    wait_until(hws, timeout=30, what="Prometheus to return the high watermarks", retry=(OSError,))
    assert promql(url, 'up{job="sluice"}') == {frozenset({("__name__", "up")}): 1.0}
    wait_until(lambda: promql(url, "sluice:under_replicated_partitions:sum") ==
               {frozenset({("__name__", "sluice:under_replicated_partitions:sum")}): 0.0},
               timeout=30, what="a recording rule evaluated", retry=(OSError,))
    status, body = http_get(url + "/api/v1/rules")
    groups = {g["name"] for g in json.loads(body)["data"]["groups"]}
    assert {"sluice-recording", "sluice-alerts"} <= groups


def test_metrics_over_https_for_prometheus_and_sluice_lag(make_broker, prometheus, certs):
    """--metrics-tls: the metrics endpoint speaks https with the listener's certificate
    (none asked of clients, though the SSL listener requires them): a client trusting
    the CA reads /metrics, a plain-http request gets no page, a real Prometheus scrapes
    it over https (up == 1), and `sluice lag --https-ca` reads a group's lag from it."""
    import ssl
    import urllib.request
    from test_tls import client_conf, ssl_flags
    b = make_broker(extra=ssl_flags(certs, client_auth="required") +
                    ["--metrics-tls", "true", "--lag-sample-interval-ms", "200"])
    host = f"127.0.0.1:{b.metrics_port}"
    ctx = ssl.create_default_context(cafile=certs("ca.pem"))
    with urllib.request.urlopen(f"https://{host}/metrics", context=ctx, timeout=5) as r:
        assert r.status == 200 and "sluice_" in r.read().decode()
    import http.client
    with pytest.raises((OSError, http.client.HTTPException)):
        # The TLS alert the server answers with is no HTTP status line.
        http_get(f"http://{host}/metrics", timeout=5)
    # A group with lag: 10 records, 4 committed.
    conf = client_conf(certs, b.addr, who="alice")
    admin = AdminClient(conf)
    for f in admin.create_topics([NewTopic("lagged", 1, 1)]).values():
        f.result(30)
    p = Producer(conf)
    for i in range(10):
        p.produce("lagged", f"v{i}".encode())
    assert p.flush(30) == 0
    c = Consumer(dict(conf, **{"group.id": "https-lag", "enable.auto.commit": False}))
    c.commit(offsets=[TopicPartition("lagged", 0, 4)], asynchronous=False)
    c.close()

    def lag_row():
        out = subprocess.run([SLUICE_BIN, "lag", "--group", "https-lag", "--metrics", host,
                              "--https-ca", certs("ca.pem")], capture_output=True, text=True, timeout=30)
        rows = [l.split() for l in out.stdout.splitlines() if l.startswith("https-lag")]
        return out.returncode == 0 and rows and rows[0][5] == "6" and rows
    wait_until(lag_row, timeout=30, what="sluice lag over https showing lag 6")
    url = prometheus([host], tls_ca=certs("ca.pem"))
    wait_until(lambda: promql(url, 'up{job="sluice"}') == {frozenset({("__name__", "up")}): 1.0},
               timeout=30, what="Prometheus scraping over https", retry=(OSError,))


def test_under_replicated_after_follower_sigkill(tmp_path, request):
    """3 brokers, a topic with 3 replicas: all in sync (flag 0, ISR 3) until a follower
    is SIGKILLed; then the leader's page shows the partition under-replicated."""
    c = Cluster(tmp_path, n=3).start()
    try:
        topic = f"u-{uuid.uuid4().hex[:6]}"
        c.create_topic(topic, partitions=1, rf=3)
        produce(c.bootstrap, topic, [10])
        leader = c.leader_of(topic, 0)
        lb = c.brokers[leader]
        labels = {"topic": topic, "partition": "0"}

        def in_sync():
            s, _ = scrape(lb)
            return value(s, "sluice_partition_isr_size", **labels) == 3 and \
                value(s, "sluice_partition_high_watermark", **labels) == 10 and s
        s = wait_until(in_sync, timeout=30, what="ISR 3 and high watermark 10 on the leader")
        assert value(s, "sluice_partition_under_replicated", **labels) == 0
        assert value(s, "sluice_partition_leader", **labels) == 1
        follower = next(i for i in c.ids if i != leader)

        def follower_lists_it():
            s, _ = scrape(c.brokers[follower])
            return value(s, "sluice_partition_leader", **labels) is not None and s
        # The follower publishes its shards' figures periodically: wait for the one that
        # has its replica (the leader's ISR can be full before it).
        fs = wait_until(follower_lists_it, timeout=30, what="the follower's page lists its replica")
        # A follower exports its replica's state too, but never counts it as led.
        assert value(fs, "sluice_partition_leader", **labels) == 0
        assert value(fs, "sluice_partition_under_replicated", **labels) == 0
        c.kill(follower)

        def under():
            s, _ = scrape(lb)
            return value(s, "sluice_partition_under_replicated", **labels) == 1 and s
        s = wait_until(under, timeout=60, what="the partition under-replicated on the leader")
        assert value(s, "sluice_partition_isr_size", **labels) == 2
        assert value(s, "sluice_under_replicated_partitions") >= 1
    finally:
        c.stop(expected_errors=[e for m in request.node.iter_markers("broker_log_errors") for e in m.args])
