#!/usr/bin/env python3
"""Writes a few valid request frames (without the size prefix) as fuzz seeds."""
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "e2e"))
from kafka_wire import header, produce_v3, record_batch, string  # noqa: E402

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
seeds = {
    "api_versions_v0": header(18, 0, 1),
    "api_versions_v3": struct.pack(">hhi", 18, 3, 1) + string("c") + b"\x00" + b"\x02a\x021\x00",
    "metadata_v1": header(3, 1, 2) + struct.pack(">i", 1) + string("topic"),
    "metadata_v1_all": header(3, 1, 2) + struct.pack(">i", -1),
    "produce_v3": produce_v3("topic", 0, record_batch([b"hello", b"world"]))[4:],
    "fetch_v4": header(1, 4, 3) + struct.pack(">iiiib", -1, 500, 1, 1 << 20, 0)
    + struct.pack(">i", 1) + string("topic") + struct.pack(">i", 1) + struct.pack(">iqi", 0, 0, 1 << 20),
    "list_offsets_v1": header(2, 1, 4) + struct.pack(">i", -1) + struct.pack(">i", 1) + string("topic")
    + struct.pack(">i", 1) + struct.pack(">iq", 0, -1),
}
for name, data in seeds.items():
    with open(os.path.join(out, name), "wb") as f:
        f.write(data)
