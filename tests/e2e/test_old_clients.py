"""Tier: black-box, old clients. Kafka 3.9 serves old protocol versions; these tests
hold Sluice to Kafka's answers for them: the answer to a version it does not serve
(wire tests), and old clients (librdkafka with `api.version.request=false`, kafka-python
pinned to an old `api_version`) producing and consuming."""
import struct

from conftest import wait_until
from kafka_wire import Conn, api_versions_v0, frame, header

UNSUPPORTED_VERSION = 35


def test_api_versions_from_the_future_gets_kafkas_v0_answer(broker):
    """Kafka answers an ApiVersions request of a version it does not know as v0:
    UNSUPPORTED_VERSION and (KIP-511) only the ApiVersions range; the connection stays
    open and the client retries at a version both know."""
    c = Conn(broker.addr)
    for corr, version in [(8, 99), (9, 4), (10, -1)]:
        c.send(frame(header(18, version, corr)))
        got, body = c.recv()
        err, n = struct.unpack_from(">hi", body, 0)
        assert (got, err, n) == (corr, UNSUPPORTED_VERSION, 1)
        assert struct.unpack_from(">hhh", body, 6) == (18, 0, 3)
        assert len(body) == 6 + 6, "v0: no throttle time after the array"
    err, keys = api_versions_v0(c)
    assert err == 0 and 0 in keys and 1 in keys
    c.close()


def test_unsupported_version_of_any_other_api_closes_the_connection(broker):
    """Kafka refuses a request of an unknown API key or of a version it does not serve
    while parsing its header, and closes the connection without a response."""
    for key, version in [(999, 0), (0, 99), (1, 99), (3, 99), (3, -1)]:
        other = Conn(broker.addr)
        c = Conn(broker.addr)
        c.send(frame(header(key, version, 5)))
        wait_until(c.closed_by_peer, what=f"connection closed after key {key} v{version}")
        err, _ = api_versions_v0(other)
        assert err == 0, "other connections are unaffected"
        other.close()
