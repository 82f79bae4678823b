"""TensorBoard event files as protobuf's own parser reads them (Event,
Summary and Value declared from tensorflow's field numbers), every record's
masked CRC-32C checked: scalars(directory) -> {(tag, step): value}."""
import glob
import struct

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_fd = descriptor_pb2.FileDescriptorProto(name="event_test.proto", package="tb", syntax="proto3")
_T = descriptor_pb2.FieldDescriptorProto


def _msg(name, fields):
    m = _fd.message_type.add(name=name)
    for fname, num, typ, label, tname in fields:
        f = m.field.add(name=fname, number=num, type=typ, label=label)
        if tname:
            f.type_name = tname


_opt, _rep = _T.LABEL_OPTIONAL, _T.LABEL_REPEATED
_msg("Value", [("tag", 1, _T.TYPE_STRING, _opt, None), ("simple_value", 2, _T.TYPE_FLOAT, _opt, None)])
_msg("Summary", [("value", 1, _T.TYPE_MESSAGE, _rep, ".tb.Value")])
_msg("Event", [("wall_time", 1, _T.TYPE_DOUBLE, _opt, None), ("step", 2, _T.TYPE_INT64, _opt, None),
               ("file_version", 3, _T.TYPE_STRING, _opt, None), ("summary", 5, _T.TYPE_MESSAGE, _opt, ".tb.Summary")])
_pool = descriptor_pool.DescriptorPool()
_pool.Add(_fd)
Event = message_factory.MessageFactory(_pool).GetPrototype(_pool.FindMessageTypeByName("tb.Event"))


def _crc32c(b):
    c = 0xffffffff
    for x in b:
        c ^= x
        for _ in range(8):
            c = (c >> 1) ^ 0x82f63b78 if c & 1 else c >> 1
    return c ^ 0xffffffff


def _masked(b):
    c = _crc32c(b)
    return (((c >> 15) | (c << 17)) + 0xa282ead8) & 0xffffffff


def events(directory):
    """Every event of the one event file in `directory`, CRCs checked."""
    files = glob.glob(f"{directory}/events.out.tfevents.*")
    assert len(files) == 1, files
    data = open(files[0], "rb").read()
    out, pos = [], 0
    while pos < len(data):
        (n,) = struct.unpack_from("<Q", data, pos)
        assert struct.unpack_from("<I", data, pos + 8)[0] == _masked(data[pos:pos + 8]), "length CRC"
        body = data[pos + 12:pos + 12 + n]
        assert struct.unpack_from("<I", data, pos + 12 + n)[0] == _masked(body), "data CRC"
        e = Event()
        e.ParseFromString(body)
        out.append(e)
        pos += 16 + n
    assert out[0].file_version == "brain.Event:2", out[0]
    return out


def scalars(directory):
    """{(tag, step): value} of the scalar events (one value each)."""
    got = {}
    for e in events(directory)[1:]:
        assert len(e.summary.value) == 1 and e.wall_time > 1.6e9, e
        v = e.summary.value[0]
        got[(v.tag, e.step)] = v.simple_value
    return got


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]
