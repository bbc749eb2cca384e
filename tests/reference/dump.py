"""Reader (and writer, for tests of the reader) of rackstep tensor dumps (exec/dump.h).

    DIR/manifest.json  {"format": "rackstep-tensor-dump", "version": 1, "bin_bytes": N,
                        "tensors": [{"name", "shape", "dtype": "f32"|"i32", "offset"}], "meta": {}}
    DIR/tensors.bin    raw little-endian values, each tensor at its byte offset

    d = read_dump("run/ref-dump")
    d.meta["lr"]; d.names(); d["logits"]  # a numpy array with the manifest's shape
"""

import json
import os

import numpy as np

FORMAT = "rackstep-tensor-dump"
VERSION = 1
_DTYPES = {"f32": np.dtype("<f4"), "i32": np.dtype("<i4")}


class DumpError(Exception):
    pass


class Dump:
    def __init__(self, tensors, meta):
        self._tensors = tensors  # name -> numpy array, in manifest order
        self.meta = meta

    def names(self):
        return list(self._tensors)

    def __contains__(self, name):
        return name in self._tensors

    def __getitem__(self, name):
        return self._tensors[name]

    def get(self, name, default=None):
        return self._tensors.get(name, default)

    def with_prefix(self, prefix):
        """{name without prefix: array} of every tensor whose name starts with prefix."""
        return {n[len(prefix):]: a for n, a in self._tensors.items() if n.startswith(prefix)}


def read_dump(directory):
    manifest_path = os.path.join(directory, "manifest.json")
    bin_path = os.path.join(directory, "tensors.bin")
    try:
        with open(manifest_path) as f:
            manifest = json.load(f)
    except (OSError, ValueError) as e:
        raise DumpError("%s: %s" % (manifest_path, e))
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise DumpError("%s: expected format %s version %d, found %r version %r" % (
            manifest_path, FORMAT, VERSION, manifest.get("format"), manifest.get("version")))
    try:
        blob = np.fromfile(bin_path, dtype=np.uint8)
    except OSError as e:
        raise DumpError("%s: %s" % (bin_path, e))
    if blob.size != manifest.get("bin_bytes"):
        raise DumpError("%s: %d bytes, manifest says %r" % (bin_path, blob.size, manifest.get("bin_bytes")))
    tensors = {}
    for i, t in enumerate(manifest.get("tensors", [])):
        where = "%s: /tensors/%d (%s)" % (manifest_path, i, t.get("name"))
        if set(t) != {"name", "shape", "dtype", "offset"}:
            raise DumpError("%s: expected keys name, shape, dtype, offset, found %s" % (where, sorted(t)))
        if t["dtype"] not in _DTYPES:
            raise DumpError("%s: expected dtype f32 or i32, found %r" % (where, t["dtype"]))
        if t["name"] in tensors:
            raise DumpError("%s: name used twice" % where)
        shape = tuple(int(s) for s in t["shape"])
        n = int(np.prod(shape, dtype=np.int64))
        begin = int(t["offset"])
        end = begin + 4 * n
        if begin < 0 or end > blob.size:
            raise DumpError("%s: bytes [%d, %d) outside tensors.bin (%d bytes)" % (where, begin, end, blob.size))
        tensors[t["name"]] = blob[begin:end].view(_DTYPES[t["dtype"]]).reshape(shape).copy()
    return Dump(tensors, manifest.get("meta", {}))


def write_dump(directory, tensors, meta=None):
    """Writes {name: numpy array (float32 or int32)} in the same format (for tests)."""
    os.makedirs(directory, exist_ok=True)
    entries, chunks, offset = [], [], 0
    for name, a in tensors.items():
        a = np.asarray(a)
        dtype = "i32" if np.issubdtype(a.dtype, np.integer) else "f32"
        raw = np.ascontiguousarray(a, dtype=_DTYPES[dtype]).tobytes()
        pad = (-len(raw)) % 64
        entries.append({"name": name, "shape": list(a.shape), "dtype": dtype, "offset": offset})
        chunks.append(raw + b"\0" * pad)
        offset += len(raw) + pad
    with open(os.path.join(directory, "tensors.bin"), "wb") as f:
        f.write(b"".join(chunks))
    with open(os.path.join(directory, "manifest.json"), "w") as f:
        json.dump({"format": FORMAT, "version": VERSION, "tensors": entries, "bin_bytes": offset,
                   "meta": meta or {}}, f)
