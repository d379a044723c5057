#!/usr/bin/python3
"""An independent GGUF reader for tests: the header, metadata and tensor table of a GGUF v2/v3
file, parsed here from the format's published layout (not by the project's C++ reader). Prints
JSON: {"version", "alignment", "data_offset", "metadata": {key: value}, "tensors": [{"name",
"type", "ne", "offset"}]} with absolute tensor offsets. Array values are summarized by their
length ({"array": N}).

  gguf_tensors.py FILE.gguf            the JSON above
  gguf_tensors.py --offsets FILE.gguf  one "NAME ABSOLUTE_OFFSET" line per tensor
"""
import json
import struct
import sys

SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
           11: "<q", 12: "<d"}


class Reader:
    def __init__(self, data):
        self.data, self.pos = data, 0

    def take(self, fmt):
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self):
        n = self.take("<Q")
        raw = self.data[self.pos:self.pos + n]
        if len(raw) != n:
            raise ValueError("string past the end of the file")
        self.pos += n
        return raw.decode("utf-8", "replace")

    def value(self, kind):
        if kind in SCALARS:
            return self.take(SCALARS[kind])
        if kind == 8:
            return self.string()
        if kind == 9:
            elem, count = self.take("<I"), self.take("<Q")
            for _ in range(count):
                self.value(elem)
            return {"array": count}
        raise ValueError(f"unknown value type {kind} at byte {self.pos}")


def read(path):
    with open(path, "rb") as f:
        r = Reader(f.read())
    if r.data[:4] != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    r.pos = 4
    version = r.take("<I")
    n_tensors, n_kv = r.take("<Q"), r.take("<Q")
    metadata = {}
    for _ in range(n_kv):
        key = r.string()
        metadata[key] = r.value(r.take("<I"))
    tensors = []
    for _ in range(n_tensors):
        name = r.string()
        ne = [r.take("<Q") for _ in range(r.take("<I"))]
        tensors.append({"name": name, "type": r.take("<I"), "ne": ne, "offset": r.take("<Q")})
    alignment = metadata.get("general.alignment", 32)
    data_offset = (r.pos + alignment - 1) // alignment * alignment
    for t in tensors:
        t["offset"] += data_offset
    return {"version": version, "alignment": alignment, "data_offset": data_offset,
            "metadata": metadata, "tensors": tensors}


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--offsets":
        for t in read(sys.argv[2])["tensors"]:
            print(t["name"], t["offset"])
    else:
        json.dump(read(sys.argv[1]), sys.stdout, indent=1)
        sys.stdout.write("\n")
