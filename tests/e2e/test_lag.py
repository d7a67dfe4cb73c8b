"""Tier: black-box tests of consumer-lag monitoring and alerting (issue 13): a real
broker samples the lag of the groups it coordinates; real confluent-kafka clients
produce and commit; /metrics is parsed with Prometheus' own text parser
(prometheus_client); a webhook receiver (a small HTTP server in the test) and a real
Alertmanager (Debian's prometheus-alertmanager) receive the alerts; `sluice lag` prints
the table. Every wait is a bounded poll (the broker samples every 200 ms here).
"""
import http.server
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client.parser import text_string_to_metric_families

from conftest import http_get, Broker, SLUICE_BIN, check_brokers, free_port, wait_until
from test_tls import certs  # noqa: F401 (the certificates fixture)

ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
PER_PARTITION = 40
# What the group commits per partition: part of the topic, a different amount each.
COMMITTED = {0: 25, 1: 7, 2: 0}
TOTAL_LAG = sum(PER_PARTITION - c for c in COMMITTED.values())



class Webhook:
    """An HTTP server (on a free port, or `port`) that keeps every JSON body POSTed to
    it."""

    def __init__(self, port=0):
        self.bodies = []
        self.lock = threading.Lock()
        hook = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                n = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(n))
                with hook.lock:
                    hook.bodies.append(body)
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}/alerts"

    def messages(self, group, status=None):
        with self.lock:
            return [b for b in self.bodies
                    if b["alerts"][0]["labels"].get("group") == group
                    and (status is None or b["status"] == status)]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class Alertmanager:
    """Debian's Alertmanager on free loopback ports with a temporary config and store."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="sluice-am-")
        self.port = free_port()
        cfg = os.path.join(self.dir, "alertmanager.yml")
        with open(cfg, "w") as f:
            f.write("route:\n  receiver: blackhole\nreceivers:\n  - name: blackhole\n")
        self.log = open(os.path.join(self.dir, "am.log"), "wb")
        self.proc = subprocess.Popen(
            [ALERTMANAGER, f"--config.file={cfg}", f"--storage.path={self.dir}/data",
             f"--web.listen-address=127.0.0.1:{self.port}", "--cluster.listen-address="],
            stdout=self.log, stderr=subprocess.STDOUT)

        def up():
            assert self.proc.poll() is None, open(os.path.join(self.dir, "am.log")).read()
            return http_get(self.url + "/-/ready", timeout=1)[0] == 200
        wait_until(up, timeout=30, what="alertmanager ready", retry=(OSError,))

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def alerts(self):
        status, body = http_get(self.url + "/api/v2/alerts")
        assert status == 200, body
        return json.loads(body)

    def close(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def webhook():
    w = Webhook()
    yield w
    w.close()


@pytest.fixture(scope="module")
def alertmanager():
    if not ALERTMANAGER:
        pytest.skip("prometheus-alertmanager is not installed; scripts/install-test-deps.sh installs it")
    am = Alertmanager()
    yield am
    am.close()


@pytest.fixture(scope="module")
def lag_broker(tmp_path_factory, webhook, alertmanager):
    d = tmp_path_factory.mktemp("lag")
    config = d / "sluice.toml"
    # A per-group rule from the file (before the flags' rule for every group).
    config.write_text('[[alert]]\ngroup = "stop-*"\nmin_status = "STOP"\nfor_ms = 0\n')
    b = Broker(d / "data", cores=2, extra=[
        "--config", str(config),
        "--lag-sample-interval-ms", "200",
        "--alert-lag-records", "5", "--alert-for-ms", "500", "--alert-repeat-ms", "2000",
        "--alert-webhook", webhook.url, "--alertmanager-url", alertmanager.url,
        "--group-initial-rebalance-delay-ms", "0"])
    b.start()
    yield b
    b.stop()
    check_brokers([b])


def scrape(broker):
    status, text = http_get(broker.metrics_url + "/metrics")
    assert status == 200, text[:500]
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def lag_of(samples, name, group, topic, partition):
    return samples.get((name, frozenset({("group", group), ("topic", topic),
                                         ("partition", str(partition))})))


def create_topic(bootstrap, name, partitions):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)], request_timeout=15)[name].result(timeout=20)


def produce(bootstrap, topic, per_partition, partitions):
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for part in range(partitions):
        for i in range(per_partition):
            p.produce(topic, value=f"v{i}".encode(), partition=part)
    assert p.flush(30) == 0


def commit(bootstrap, group, topic, offsets):
    """Commits {partition: offset} for the group with a consumer that then leaves."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                  "enable.auto.commit": False})
    tps = [TopicPartition(topic, p, o) for p, o in offsets.items()]

    def committed():
        # A commit the coordinator refuses raises, or names the error per partition;
        # wait_until retries only the transient ones (coordinator loading or moving).
        for tp in c.commit(offsets=tps, asynchronous=False):
            if tp.error is not None:
                raise KafkaException(tp.error)
        return True
    try:
        wait_until(committed, timeout=30, what=f"commit of {group}")
    finally:
        c.close()


def consume_part(bootstrap, group, topic, counts):
    """A subscribed consumer reads `counts[p]` records of each partition, commits
    exactly there, and stops."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                  "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        c.assign([TopicPartition(topic, p, 0) for p in counts])
        got = {p: 0 for p in counts}
        deadline = time.time() + 60
        while any(got[p] < counts[p] for p in counts) and time.time() < deadline:
            m = c.poll(0.5)
            if m is None or m.error():
                continue
            if got[m.partition()] < counts[m.partition()]:
                got[m.partition()] += 1
                if got[m.partition()] == counts[m.partition()]:
                    c.pause([TopicPartition(topic, m.partition())])
        assert got == counts, got
        c.commit(offsets=[TopicPartition(topic, p, n) for p, n in counts.items()],
                 asynchronous=False)
    finally:
        c.close()


def group_json(broker, group):
    status, body = http_get(f"{broker.metrics_url}/v1/groups/{group}")
    return status, json.loads(body)


def test_lag_metrics_alerts_and_resolution(lag_broker, webhook, alertmanager):
    b = lag_broker
    topic, group = f"lagged-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
    create_topic(b.addr, topic, 3)
    produce(b.addr, topic, PER_PARTITION, 3)
    consume_part(b.addr, group, topic, {0: COMMITTED[0], 1: COMMITTED[1]})
    commit(b.addr, group, topic, {2: COMMITTED[2]})

    # /metrics: the exact lag per partition and a positive age.
    def exact():
        s = scrape(b)
        lags = {p: lag_of(s, "sluice_consumer_group_lag_records", group, topic, p) for p in range(3)}
        if lags != {p: PER_PARTITION - COMMITTED[p] for p in range(3)}:
            return None
        return s
    s = wait_until(exact, timeout=30, what="exact lag in /metrics")
    for p in range(3):
        assert lag_of(s, "sluice_consumer_group_committed_offset", group, topic, p) == COMMITTED[p]
        assert lag_of(s, "sluice_consumer_group_lag_seconds", group, topic, p) > 0
    assert s[("sluice_consumer_group_members", frozenset({("group", group)}))] == 0
    assert s[("sluice_consumer_group_state", frozenset({("group", group), ("state", "Empty")}))] == 1

    # The JSON view, Burrow-shaped; an unknown group is a JSON 404.
    status, j = group_json(b, group)
    assert status == 200 and j["error"] is False
    parts = {p["partition"]: p for p in j["status"]["partitions"]}
    assert {p: parts[p]["current_lag"] for p in range(3)} == {p: PER_PARTITION - COMMITTED[p] for p in range(3)}
    assert parts[0]["committed_offset"] == 25 and parts[0]["high_watermark"] == PER_PARTITION
    assert j["status"]["totallag"] == sum(PER_PARTITION - c for c in COMMITTED.values())
    status, j = group_json(b, "no-such-group")
    assert status == 404 and j["error"] is True
    status, body = http_get(f"{b.metrics_url}/v1/groups")
    listed = {g["group"]: g for g in json.loads(body)["groups"]}
    assert listed[group]["totallag"] == TOTAL_LAG

    # The webhook gets Alertmanager's webhook JSON, firing, with the labels.
    msgs = wait_until(lambda: webhook.messages(group, "firing"), timeout=30, what="firing webhook")
    m = msgs[0]
    assert m["version"] == "4" and m["status"] == "firing"
    a = m["alerts"][0]
    assert a["labels"]["alertname"] == "SluiceConsumerLag"
    assert a["labels"]["topic"] == topic
    assert a["labels"]["severity"] in ("warning", "critical")
    assert int(a["annotations"]["lag_records"]) == TOTAL_LAG
    assert m["groupKey"] and a["startsAt"] and a["endsAt"] == "0001-01-01T00:00:00Z"

    # A real Alertmanager lists it.
    def listed_in_am():
        return [x for x in alertmanager.alerts() if x["labels"].get("group") == group
                and x["status"]["state"] == "active"]
    am = wait_until(listed_in_am, timeout=30, what="alert in Alertmanager")
    assert am[0]["labels"]["alertname"] == "SluiceConsumerLag"
    assert am[0]["labels"]["topic"] == topic

    # `sluice lag` shows the group and its lag.
    out = subprocess.run([SLUICE_BIN, "lag", "--bootstrap", b.addr, "--group", group,
                          "--metrics", f"127.0.0.1:{b.metrics_port}"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    rows = [l.split() for l in out.stdout.splitlines() if l.startswith(group)]
    assert sorted((int(r[2]), int(r[5])) for r in rows) == [(p, PER_PARTITION - COMMITTED[p]) for p in range(3)], out.stdout

    # The group catches up: lag 0 and `resolved`.
    commit(b.addr, group, topic, {p: PER_PARTITION for p in range(3)})
    def caught_up():
        s = scrape(b)
        return all(lag_of(s, "sluice_consumer_group_lag_records", group, topic, p) == 0 and
                   lag_of(s, "sluice_consumer_group_lag_seconds", group, topic, p) == 0
                   for p in range(3))
    wait_until(caught_up, timeout=30, what="lag 0")
    r = wait_until(lambda: webhook.messages(group, "resolved"), timeout=30, what="resolved webhook")
    assert r[0]["alerts"][0]["endsAt"] != "0001-01-01T00:00:00Z"
    wait_until(lambda: not listed_in_am(), timeout=30, what="alert resolved in Alertmanager")


def partition_status(broker, group):
    status, j = group_json(broker, group)
    if status != 200:
        return None
    return j


def test_stop_frozen_offset_while_producers_write(lag_broker, webhook):
    b = lag_broker
    topic, group = f"stopped-{uuid.uuid4().hex[:6]}", f"stop-{uuid.uuid4().hex[:6]}"
    create_topic(b.addr, topic, 1)
    produce(b.addr, topic, 10, 1)
    commit(b.addr, group, topic, {0: 5})
    p = Producer({"bootstrap.servers": b.addr, "linger.ms": 5})

    def stopped():
        p.produce(topic, value=b"more", partition=0)
        p.flush(10)
        j = partition_status(b, group)
        return j if j and j["status"]["partitions"] and j["status"]["partitions"][0]["status"] == "STOP" else None
    j = wait_until(stopped, timeout=30, interval=0.2, what="STOP")
    assert j["status"]["status"] == "ERR"
    _, body = http_get(f"{b.metrics_url}/v1/groups")
    g = [x for x in json.loads(body)["groups"] if x["group"] == group][0]
    assert g["worst_partition_status"] == "STOP" and g["status"] == "ERR"
    # The file's rule for stop-* (min_status STOP) fires, critical.
    m = wait_until(lambda: webhook.messages(group, "firing"), timeout=30, what="STOP alert")
    assert m[0]["alerts"][0]["labels"]["severity"] == "critical"
    assert "STOP" in m[0]["alerts"][0]["annotations"]["lag_status"]


def test_stall_same_offset_committed_while_behind(lag_broker):
    b = lag_broker
    topic, group = f"stalled-{uuid.uuid4().hex[:6]}", f"stall-{uuid.uuid4().hex[:6]}"
    create_topic(b.addr, topic, 1)
    produce(b.addr, topic, 20, 1)
    c = Consumer({"bootstrap.servers": b.addr, "group.id": group, "enable.auto.commit": False})
    try:
        def stalled():
            # The consumer keeps committing the same offset (1.2 s apart: Burrow's
            # min-distance of 1 s makes each a window entry) while 15 records wait.
            [tp] = c.commit(offsets=[TopicPartition(topic, 0, 5)], asynchronous=False)
            if tp.error is not None:
                raise KafkaException(tp.error)  # retried only if transient
            end = time.time() + 1.2
            while time.time() < end:
                j = partition_status(b, group)
                # A group's first answer may list no partition yet (not sampled).
                if j and j["status"]["partitions"] and j["status"]["partitions"][0]["status"] == "STALL":
                    return j
                time.sleep(0.1)
            return None
        j = wait_until(stalled, timeout=40, interval=0, what="STALL")
    finally:
        c.close()
    assert j["status"]["partitions"][0]["current_lag"] == 15
    assert j["status"]["status"] == "ERR"


def test_cluster_coordinator_reports_lag_of_partitions_led_elsewhere(tmp_path):
    """3 brokers, a topic whose partitions are led by different brokers: the group's
    coordinator alone answers for it, with the exact lag of every partition (the
    high watermarks of partitions it does not lead come from their leaders over the
    Kafka protocol); `sluice lag` asking every broker shows the group once."""
    from cluster import Cluster
    c = Cluster(tmp_path, n=3, extra=("--lag-sample-interval-ms", "200")).start()
    try:
        topic, group = f"spread-{uuid.uuid4().hex[:6]}", f"cg-{uuid.uuid4().hex[:6]}"
        c.create_topic(topic, partitions=3, rf=1)
        produce(c.bootstrap, topic, PER_PARTITION, 3)
        commit(c.bootstrap, group, topic, COMMITTED)
        want = {p: PER_PARTITION - COMMITTED[p] for p in range(3)}

        def coordinator():
            found = [i for i in c.ids if group_json(c.brokers[i], group)[0] == 200]
            return found[0] if len(found) == 1 else None
        coord = wait_until(coordinator, timeout=30, what="one broker answering for the group")
        leaders = {p: c.leader_of(topic, p) for p in range(3)}
        assert any(l != coord for l in leaders.values()), leaders

        def exact():
            j = group_json(c.brokers[coord], group)[1]
            got = {p["partition"]: p["current_lag"] for p in j["status"]["partitions"]}
            return j if got == want else None
        j = wait_until(exact, timeout=30, what="exact lag on the coordinator")
        for p in j["status"]["partitions"]:
            assert p["high_watermark"] == PER_PARTITION
            assert p["lag_seconds"] > 0
        s = scrape(c.brokers[coord])
        for p in range(3):
            assert lag_of(s, "sluice_consumer_group_lag_records", group, topic, p) == want[p]
        for i in c.ids:
            if i != coord:
                status, body = group_json(c.brokers[i], group)
                assert status == 404 and body["error"] is True

        metrics = ",".join(f"127.0.0.1:{c.brokers[i].metrics_port}" for i in c.ids)
        out = subprocess.run([SLUICE_BIN, "lag", "--bootstrap", c.bootstrap.split(",")[0],
                              "--metrics", metrics],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        rows = [l.split() for l in out.stdout.splitlines() if l.startswith(group)]
        assert sorted((int(r[2]), int(r[5])) for r in rows) == sorted(want.items()), out.stdout
    finally:
        c.stop()


def test_a_webhook_that_is_down_is_retried_until_it_answers(make_broker):
    """The webhook's port refuses connections when the alert fires: the sink thread
    retries with backoff, and once a receiver listens there the alert arrives. The
    broker keeps serving meanwhile (produce and commit go on)."""
    port = free_port()
    b = make_broker(extra=["--lag-sample-interval-ms", "200", "--alert-lag-records", "0",
                           "--alert-for-ms", "0", "--alert-repeat-ms", "600000",
                           "--alert-webhook", f"http://127.0.0.1:{port}/alerts"])
    topic, group = f"down-{uuid.uuid4().hex[:6]}", f"d-{uuid.uuid4().hex[:6]}"
    create_topic(b.addr, topic, 1)
    produce(b.addr, topic, 10, 1)
    commit(b.addr, group, topic, {0: 3})

    def failed_attempts():
        return b.read_log().count("alert sink unreachable")
    wait_until(failed_attempts, timeout=30, what="a refused delivery attempt")
    produce(b.addr, topic, 10, 1)  # the broker serves while the sink is down
    # Now a receiver listens on the webhook's port: a retry delivers the alert.
    hook = Webhook(port)
    try:
        m = wait_until(lambda: hook.messages(group, "firing"), timeout=40, what="retried alert")
        assert m[0]["alerts"][0]["labels"]["topic"] == topic
        assert int(m[0]["alerts"][0]["annotations"]["lag_records"]) == 7
    finally:
        hook.close()


def test_alerts_reach_an_https_webhook(make_broker, certs):
    """An https:// webhook whose certificate chains to --alert-ssl-ca (not a public
    root) receives the firing alert over TLS; the sink's counters show it delivered."""
    import ssl
    hook = Webhook()
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(certs("broker.pem"), certs("broker.key"))
    hook.server.socket = ctx.wrap_socket(hook.server.socket, server_side=True)
    try:
        b = make_broker(cores=1, extra=[
            "--lag-sample-interval-ms", "200", "--alert-lag-records", "5", "--alert-for-ms", "0",
            "--alert-webhook", f"https://127.0.0.1:{hook.port}/alerts", "--alert-ssl-ca", certs("ca.pem"),
            "--group-initial-rebalance-delay-ms", "0"])
        topic, group = f"tls-{uuid.uuid4().hex[:6]}", f"tg-{uuid.uuid4().hex[:6]}"
        create_topic(b.addr, topic, 1)
        produce(b.addr, topic, 20, 1)
        commit(b.addr, group, topic, {0: 2})
        msgs = wait_until(lambda: hook.messages(group, "firing"), timeout=30, what="firing https webhook")
        assert msgs[0]["alerts"][0]["labels"]["group"] == group

        def delivered():
            return scrape(b).get(("sluice_lag_alert_notices_delivered_total", frozenset()), 0) >= 1
        wait_until(delivered, timeout=10, what="delivered counter")
    finally:
        hook.close()
