"""An independent reader of TensorBoard event files (no TensorFlow, no
protobuf library): TFRecord framing with both masked CRC-32C checked, the
Event and Summary messages decoded with this file's own varint code.
Prints one JSON line per value: {"step", "tag", "value"} for scalars,
{"step", "tag", "text"} for text, and {"file_version"} for the first record.
Exits 1 naming the first malformed record.

    python3 tests/python/tfevents.py events.out.tfevents.*
"""
import json
import struct
import sys


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def varint(buf, i):
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i


def fields(buf):
    """(field number, wire type, value) of a message; bytes for wire type 2."""
    i = 0
    while i < len(buf):
        key, i = varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = varint(buf, i)
        elif wire == 1:
            value, i = buf[i:i + 8], i + 8
        elif wire == 5:
            value, i = buf[i:i + 4], i + 4
        elif wire == 2:
            n, i = varint(buf, i)
            value, i = buf[i:i + n], i + n
        else:
            raise ValueError(f"wire type {wire}")
        yield number, wire, value


def decode_value(value, step):
    tag, out = None, {"step": step}
    for number, wire, v in fields(value):
        if number == 1:
            tag = v.decode()
        elif number == 2 and wire == 5:
            out["value"] = struct.unpack("<f", v)[0]
        elif number == 8:  # TensorProto: string_val (8)
            for n, _, t in fields(v):
                if n == 8:
                    out["text"] = t.decode()
        elif number == 9:  # SummaryMetadata.plugin_data.plugin_name
            for n, _, p in fields(v):
                if n == 1:
                    out["plugin"] = next(x for k, _, x in fields(p) if k == 1).decode()
    out["tag"] = tag
    return out


def main(path):
    data = open(path, "rb").read()
    i = records = 0
    while i < len(data):
        if i + 12 > len(data):
            sys.exit(f"{path}: record {records}: truncated header")
        head = data[i:i + 8]
        (length,) = struct.unpack("<Q", head)
        (head_crc,) = struct.unpack("<I", data[i + 8:i + 12])
        if head_crc != masked(head):
            sys.exit(f"{path}: record {records}: length CRC mismatch")
        body = data[i + 12:i + 12 + length]
        (body_crc,) = struct.unpack("<I", data[i + 12 + length:i + 16 + length])
        if len(body) != length or body_crc != masked(body):
            sys.exit(f"{path}: record {records}: data CRC mismatch")
        i += 16 + length
        records += 1
        step, summary = 0, None
        for number, wire, v in fields(body):
            if number == 2:
                step = v
            elif number == 3:
                print(json.dumps({"file_version": v.decode()}))
            elif number == 5:
                summary = v
        if summary is not None:
            for number, _, v in fields(summary):
                if number == 1:
                    print(json.dumps(decode_value(v, step)))


if __name__ == "__main__":
    main(sys.argv[1])
