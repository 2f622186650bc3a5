"""A small safetensors reader and writer (Debian has no python3-safetensors).

Same format and the same checks as the C++ reader (io/safetensors.h): an 8-byte
little-endian header length, a JSON header {name: {dtype, shape, data_offsets}}
with optional "__metadata__" (strings), then the raw little-endian data. Files
are read whole; malformed ones raise ValueError naming the problem.
"""
import json
import struct

import torch

MAX_HEADER = 100_000_000
DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}
_NAMES = {v: k for k, v in DTYPES.items()}


def _bad(msg):
    return ValueError("safetensors: " + msg)


def _is_index(x):
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def parse(data):
    """(tensors: dict name -> CPU tensor, metadata: dict) from the bytes of a file."""
    data = memoryview(bytes(data))
    if len(data) < 8:
        raise _bad("file is %d bytes, shorter than the 8-byte header length" % len(data))
    (n,) = struct.unpack("<Q", data[:8])
    if n > MAX_HEADER:
        raise _bad("header length %d exceeds the limit of %d bytes" % (n, MAX_HEADER))
    if n > len(data) - 8:
        raise _bad("header length %d runs past the end of the file (%d bytes after the length)" % (n, len(data) - 8))
    text = bytes(data[8:8 + n])
    if not text.startswith(b"{"):
        raise _bad("header does not start with '{' (not a JSON object)")
    try:
        header = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _bad("header is not valid JSON: %s" % e) from None
    if not isinstance(header, dict):
        raise _bad("header is not a JSON object")
    buf = data[8 + n:]
    metadata, tensors, ranges = {}, {}, []
    for name, entry in header.items():
        if name == "__metadata__":
            if not isinstance(entry, dict) or not all(isinstance(v, str) for v in entry.values()):
                raise _bad("__metadata__ must be an object of strings")
            metadata = dict(entry)
            continue
        if not isinstance(entry, dict):
            raise _bad('tensor "%s": entry is not an object' % name)
        extra = set(entry) - {"dtype", "shape", "data_offsets"}
        if extra:
            raise _bad('tensor "%s": unknown field "%s" (allowed: dtype, shape, data_offsets)' % (name, sorted(extra)[0]))
        dtype = entry.get("dtype")
        if dtype not in DTYPES:
            raise _bad('tensor "%s": dtype %r is not supported (allowed: %s)' % (name, dtype, " ".join(DTYPES)))
        shape = entry.get("shape")
        if not isinstance(shape, list) or not all(_is_index(s) for s in shape):
            raise _bad('tensor "%s": shape %r is not a list of non-negative integers' % (name, shape))
        off = entry.get("data_offsets")
        if not isinstance(off, list) or len(off) != 2 or not all(_is_index(o) for o in off):
            raise _bad('tensor "%s": data_offsets must be [begin, end] of non-negative integers, got %r' % (name, off))
        begin, end = off
        if begin > end:
            raise _bad('tensor "%s": data_offsets %r: begin > end' % (name, off))
        if end > len(buf):
            raise _bad('tensor "%s": data_offsets %r run past the data buffer (%d bytes)' % (name, off, len(buf)))
        numel = 1
        for s in shape:
            numel *= s
        itemsize = torch.empty((), dtype=DTYPES[dtype]).element_size()
        if end - begin != numel * itemsize:
            raise _bad('tensor "%s": data_offsets %r hold %d bytes but %s %s needs %d'
                       % (name, off, end - begin, dtype, shape, numel * itemsize))
        raw = bytearray(buf[begin:end])
        t = torch.frombuffer(raw, dtype=DTYPES[dtype]) if raw else torch.empty(0, dtype=DTYPES[dtype])
        tensors[name] = t.reshape(shape)
        ranges.append((begin, end, name))
    at = 0
    for begin, end, name in sorted(ranges):
        if begin < at:
            raise _bad('tensor "%s": data_offsets [%d, %d] overlap the previous tensor (which ends at %d)'
                       % (name, begin, end, at))
        if begin > at:
            raise _bad('tensor "%s": data_offsets [%d, %d] leave a hole at bytes [%d, %d) of the buffer'
                       % (name, begin, end, at, begin))
        at = end
    if at != len(buf):
        raise _bad("the tensors cover %d bytes but the data buffer has %d (trailing bytes)" % (at, len(buf)))
    return tensors, metadata


def serialize(tensors, metadata=None):
    """The bytes of a file holding `tensors` (name -> tensor, in order) and `metadata` (str -> str)."""
    header, chunks, at = {}, [], 0
    if metadata:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise ValueError("safetensors: metadata keys and values must be strings")
        header["__metadata__"] = dict(metadata)
    for name, t in tensors.items():
        if not name or name == "__metadata__":
            raise ValueError("safetensors: tensor name %r is not allowed" % name)
        if t.dtype not in _NAMES:
            raise ValueError("safetensors: tensor %s has dtype %s, which safetensors cannot hold here" % (name, t.dtype))
        c = t.detach().to("cpu").contiguous()
        raw = c.reshape(-1).view(torch.uint8).numpy().tobytes() if c.numel() else b""
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(c.shape), "data_offsets": [at, at + len(raw)]}
        chunks.append(raw)
        at += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)


def save_file(tensors, path, metadata=None):
    """Writes `tensors` (a dict) to `path` (safetensors' own save_file signature)."""
    data = serialize(tensors, metadata)
    with open(path, "wb") as f:
        f.write(data)


def load_file(path, with_metadata=False):
    """The tensors of `path` as a dict (and the metadata, with_metadata=True)."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        tensors, metadata = parse(data)
    except ValueError as e:
        raise ValueError("%s: %s" % (path, e)) from None
    return (tensors, metadata) if with_metadata else tensors
