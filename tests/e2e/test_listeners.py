"""Tier: several named listeners (issue 42): `--listeners`, `--advertised-listeners`,
`--listener-security-protocol-map` and `--inter-broker-listener-name`, as Kafka's
listeners, advertised.listeners, listener.security.protocol.map and
inter.broker.listener.name.

Each listener speaks its own protocol, and a client is answered (Metadata,
FindCoordinator, DescribeCluster) with every broker's endpoint of the listener it
connected through: a client of the SASL listener is never sent to the plaintext one.
Brokers replicate through the inter-broker listener. Real clients at their defaults
plus the security settings a user gives them (confluent-kafka, kcat)."""
import subprocess

import pytest
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from cluster import Cluster, metadata_from
from conftest import free_port, wait_until
from test_sasl import ADMIN, ALL_MECHANISMS, BOOTSTRAP_ENV, produce
from test_tls import certs, consume_all, create, tls_context  # noqa: F401 (the certificates fixture)


def sasl_conf(addr, user=ADMIN[0], password=ADMIN[1], protocol="sasl_plaintext", ca=None):
    c = {"bootstrap.servers": addr, "security.protocol": protocol,
         "sasl.mechanisms": "SCRAM-SHA-256", "sasl.username": user, "sasl.password": password}
    if ca:
        c["ssl.ca.location"] = ca
    return c


def test_one_broker_answers_each_listener_with_its_own_endpoints(make_broker):
    """INTERNAL (PLAINTEXT, the inter-broker listener) and CLIENT (SASL_PLAINTEXT,
    advertised as localhost): Metadata through each names that listener's address; a
    SASL client produces and consumes in a group through CLIENT only (its coordinator is
    the CLIENT address); the CLIENT port refuses a client without SASL and a wrong
    password; DescribeConfigs shows the listeners; after a restart (the registration
    replayed from the metadata journal) both answer as before."""
    internal, client = free_port(), free_port()
    b = make_broker(port=internal, env=BOOTSTRAP_ENV, extra=[
        "--listeners", f"INTERNAL://127.0.0.1:{internal},CLIENT://127.0.0.1:{client}",
        "--advertised-listeners", f"CLIENT://localhost:{client}",
        "--listener-security-protocol-map", "INTERNAL:PLAINTEXT,CLIENT:SASL_PLAINTEXT",
        "--inter-broker-listener-name", "INTERNAL", "--sasl-enabled-mechanisms", ALL_MECHANISMS])
    wait_until(lambda: metadata_from(f"127.0.0.1:{client}", topics=[], sasl=ADMIN)["brokers"],
               timeout=30, what="the CLIENT listener answering")

    def check_endpoints():
        assert metadata_from(f"127.0.0.1:{internal}", topics=[])["brokers"] == {1: f"127.0.0.1:{internal}"}
        assert metadata_from(f"127.0.0.1:{client}", topics=[], sasl=ADMIN)["brokers"] == {1: f"localhost:{client}"}

    check_endpoints()
    conf = sasl_conf(f"localhost:{client}")
    create(conf, "named")
    assert produce(conf, "named", 200) == (200, [])
    assert len(consume_all(conf, "named", 200)) == 200
    # kcat on the plaintext listener sees the plaintext address only.
    md = subprocess.run(["kcat", "-b", f"127.0.0.1:{internal}", "-L", "-t", "named"],
                        capture_output=True, text=True, timeout=30)
    assert md.returncode == 0, md.stderr
    assert f"127.0.0.1:{internal}" in md.stdout and str(client) not in md.stdout, md.stdout
    # The SASL listener: no login, or a wrong password, gets nothing.
    refused = Producer({"bootstrap.servers": f"127.0.0.1:{client}", "message.timeout.ms": 3000})
    refused.produce("named", b"plain")
    assert refused.flush(10) == 0
    bad = Producer(dict(sasl_conf(f"localhost:{client}", password="wrong"), **{"message.timeout.ms": 3000}))
    errors = []
    bad.produce("named", b"bad", on_delivery=lambda e, m: errors.append(e))
    bad.flush(10)
    assert errors and errors[0] is not None, errors
    # DescribeConfigs: Kafka's names, each listener.
    res = ConfigResource(ResourceType.BROKER, "1")
    admin = AdminClient(conf)
    cfg = admin.describe_configs([res])[res].result(30)
    assert cfg["listeners"].value == f"INTERNAL://127.0.0.1:{internal},CLIENT://127.0.0.1:{client}"
    assert cfg["advertised.listeners"].value == f"INTERNAL://127.0.0.1:{internal},CLIENT://localhost:{client}"
    assert cfg["listener.security.protocol.map"].value == "INTERNAL:PLAINTEXT,CLIENT:SASL_PLAINTEXT"
    assert cfg["inter.broker.listener.name"].value == "INTERNAL"
    # Nothing the refused clients sent was written.
    b.stop()
    b.start()
    wait_until(lambda: metadata_from(f"127.0.0.1:{client}", topics=[], sasl=ADMIN)["brokers"],
               timeout=30, what="the CLIENT listener answering after the restart")
    check_endpoints()
    c = Consumer(dict(conf, **{"group.id": "count", "auto.offset.reset": "earliest"}))
    from confluent_kafka import TopicPartition
    lo, hi = c.get_watermark_offsets(TopicPartition("named", 0), timeout=30)
    c.close()
    assert (lo, hi) == (0, 200)


def test_a_flag_that_conflicts_with_named_listeners_stops_the_start(tmp_path):
    """--listen beside --listeners, and a listener without a protocol: the broker says
    which flag and exits before it opens anything."""
    from conftest import SLUICE_BIN
    for args, flag in [
        (["--listeners", "PLAINTEXT://127.0.0.1:0", "--listen", "127.0.0.1:0"], "--listen"),
        (["--listeners", "CLIENT://127.0.0.1:0"], "--listener-security-protocol-map"),
        (["--listeners", "PLAINTEXT://0.0.0.0:0"], "--advertised-listeners"),
    ]:
        r = subprocess.run([SLUICE_BIN, "serve", "--data-dir", str(tmp_path / "d"), *args],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode != 0
        assert flag in r.stderr, r.stderr


def test_three_brokers_replicate_through_the_inter_broker_listener(tmp_path, certs):
    """INTERNAL (SSL with client certificates required, the inter-broker listener) and
    CLIENT (SASL_SSL, which as in Kafka asks no client certificate: the SASL login is the
    principal) on each of three brokers: RF=3 acks=all over CLIENT fills every ISR (the
    brokers fetch from each other through INTERNAL with their certificates), a group
    consumes through CLIENT with no client certificate, and each listener's Metadata
    lists the three brokers at that listener's ports."""
    client_ports = {}

    def listeners(i, kafka_port):
        client_ports[i] = free_port()
        return ["--listeners", f"INTERNAL://127.0.0.1:{kafka_port},CLIENT://127.0.0.1:{client_ports[i]}",
                "--listener-security-protocol-map", "INTERNAL:SSL,CLIENT:SASL_SSL",
                "--inter-broker-listener-name", "INTERNAL", "--sasl-enabled-mechanisms", ALL_MECHANISMS,
                "--ssl-certificate", certs("broker.pem"), "--ssl-key", certs("broker.key"),
                "--ssl-ca", certs("ca.pem"), "--ssl-client-auth", "required"]

    ctx = tls_context(certs, who="alice")
    c = Cluster(tmp_path / "named", n=3, env=BOOTSTRAP_ENV, tls=ctx, node_extra=listeners)
    c.start()
    try:
        client_bootstrap = ",".join(f"127.0.0.1:{client_ports[i]}" for i in c.ids)
        conf = sasl_conf(client_bootstrap, protocol="sasl_ssl", ca=certs("ca.pem"))
        wait_until(lambda: len(metadata_from(f"127.0.0.1:{client_ports[1]}", topics=[], tls=tls_context(certs),
                                             sasl=ADMIN)["brokers"]) == 3,
                   timeout=30, what="three brokers through CLIENT")
        assert metadata_from(f"127.0.0.1:{client_ports[1]}", topics=[], tls=tls_context(certs),
                             sasl=ADMIN)["brokers"] == {i: f"127.0.0.1:{client_ports[i]}" for i in c.ids}
        assert metadata_from(c.addr(2), topics=[], tls=ctx)["brokers"] == {i: c.addr(i) for i in c.ids}
        create(conf, "rep", partitions=6, rf=3)
        assert produce(conf, "rep", 600) == (600, [])

        def full():
            md = metadata_from(c.addr(1), ["rep"], tls=ctx)["topics"]["rep"]["partitions"]
            return len(md) == 6 and all(len(p["isr"]) == 3 for p in md.values())
        wait_until(full, timeout=30, what="every ISR full through INTERNAL")
        assert len(consume_all(conf, "rep", 600)) == 600
        with pytest.raises(KafkaException):
            # The INTERNAL listener does not speak SASL: a SASL_SSL client fails there.
            AdminClient(sasl_conf(c.addr(1), protocol="sasl_ssl", ca=certs("ca.pem"))).list_topics(timeout=5)
    finally:
        c.stop()
