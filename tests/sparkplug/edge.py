"""A Sparkplug B edge node made with pysparkplug (PyPI), for tests/sparkplug.rs.

  python edge.py HOST PORT birth   NBIRTH, then DBIRTH of device pump1 (metrics with aliases)
  python edge.py HOST PORT data    DDATA of pump1 by aliases only, then a DDATA with an
                                   alias no BIRTH announced; prints the rebirth request
                                   (NCMD) Sluice answers with
  python edge.py HOST PORT death   DDEATH of pump1, then NDEATH
Each message is QoS 1; the script waits for every PUBACK before it ends.
"""

import sys
import threading
import time

import pysparkplug as spb

host, port, step = sys.argv[1], int(sys.argv[2]), sys.argv[3]
T0 = 1767225600000  # 2026-01-01T00:00:00Z, in milliseconds
D = spb.DataType


def topic(kind, device=None):
    return spb.Topic(message_type=kind, group_id="plant", edge_node_id="edge1", device_id=device)


def send(client, kind, payload, device=None, dtypes=True):
    message = spb.Message(topic=topic(kind, device), payload=payload, qos=spb.QoS.AT_LEAST_ONCE, retain=False)
    client.publish(message, include_dtypes=dtypes)


connected = threading.Event()
client = spb.Client(client_id=f"edge1-{step}")
client.connect(host, port=port, callback=lambda _: connected.set())
assert connected.wait(10), "no CONNACK"
rebirth = threading.Event()
commands = []


def on_command(_client, message):
    commands.append([(m.name, m.value) for m in message.payload.metrics])
    rebirth.set()


if step == "birth":
    send(client, spb.MessageType.NBIRTH, spb.NBirth(T0, 0, (
        spb.Metric(T0, "bdSeq", D.INT64, value=0),
        spb.Metric(T0, "Node Control/Rebirth", D.BOOLEAN, value=False),
    )))
    send(client, spb.MessageType.DBIRTH, spb.DBirth(T0, 1, (
        spb.Metric(T0, "temperature", D.DOUBLE, value=21.5, alias=1),
        spb.Metric(T0, "pressure", D.INT32, value=-3, alias=2),
        spb.Metric(T0, "running", D.BOOLEAN, value=True, alias=3),
        spb.Metric(T0, "mode", D.STRING, value="auto", alias=4),
        spb.Metric(T0, "level", D.FLOAT, value=0.5, alias=5),
    )), device="pump1")
elif step == "data":
    subscribed = threading.Event()
    client._client.on_subscribe = lambda *_: subscribed.set()  # paho's SUBACK callback
    client.subscribe(topic(spb.MessageType.NCMD), spb.QoS.AT_LEAST_ONCE, on_command)
    assert subscribed.wait(10), "no SUBACK"
    t = T0 + 10_000
    send(client, spb.MessageType.DDATA, spb.DData(t, 2, (
        spb.Metric(t, None, D.DOUBLE, value=22.25, alias=1),
        spb.Metric(t, None, D.INT32, value=-7, alias=2),
        spb.Metric(t, None, D.BOOLEAN, value=False, alias=3),
        spb.Metric(t, None, D.STRING, value="manual", alias=4),
    )), device="pump1", dtypes=False)
    send(client, spb.MessageType.DDATA, spb.DData(t + 1000, 3, (
        spb.Metric(t + 1000, None, D.DOUBLE, value=1.0, alias=9),
    )), device="pump1", dtypes=False)
    assert rebirth.wait(10), "no rebirth request"
    print("NCMD", commands[0])
elif step == "death":
    send(client, spb.MessageType.DDEATH, spb.DDeath(T0 + 20_000, 4), device="pump1")
    send(client, spb.MessageType.NDEATH, spb.NDeath(T0 + 21_000, spb.Metric(T0 + 21_000, "bdSeq", D.INT64, value=0)))

# Every PUBACK in: paho's queue of unacknowledged messages is empty.
deadline = time.time() + 10
while client._client._out_messages and time.time() < deadline:
    time.sleep(0.02)
assert not client._client._out_messages, "PUBACKs missing"
client.disconnect()
print("done", step)
