#!/usr/bin/env python3
"""Independent consumer of a CUDA device arena (label gpu): opens the arena's IPC memory handle
from Python with CuPy, copies every slot to the host, compares it with the expected bytes, checks
the zero tail padding, and computes one reduction on the GPU as a second opinion.

Run through `cuda_device_gpu --cupy-check python3 tests/gpu/cupy_ipc_check.py`, which keeps the
arena alive and appends DIR, the folder holding arena.txt (handle=<hex>, bytes, reserved_bytes,
slot_stride, slots, owner_pid) and slot<k>.bin. Exit 0 when everything matches, 1 on a
mismatch, 77 when CuPy is not installed.
"""
import os
import sys


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    try:
        import cupy
        import numpy
    except ImportError as e:  # an environment without CuPy: skipped, not passed
        print(f"SKIP: {e}")
        return 77
    folder = sys.argv[1]
    meta = {}
    with open(os.path.join(folder, "arena.txt")) as f:
        for line in f:
            key, _, value = line.strip().partition("=")
            meta[key] = value
    handle = bytes.fromhex(meta["handle"])
    size = int(meta["bytes"])
    reserved = int(meta["reserved_bytes"])
    stride = int(meta["slot_stride"])
    slots = int(meta["slots"])
    print(f"arena of daemon pid {meta['owner_pid']}: {slots} slots x {stride} bytes, "
          f"{reserved} reserved; cupy {cupy.__version__}")

    ptr = cupy.cuda.runtime.ipcOpenMemHandle(handle)
    failures = 0
    try:
        mem = cupy.cuda.UnownedMemory(ptr, reserved, None)
        arena = cupy.ndarray((reserved,), dtype=cupy.uint8, memptr=cupy.cuda.MemoryPointer(mem, 0))
        for k in range(slots):
            expected = numpy.fromfile(os.path.join(folder, f"slot{k}.bin"), dtype=numpy.uint8)
            got = cupy.asnumpy(arena[k * stride:(k + 1) * stride])
            if got.shape != expected.shape or not numpy.array_equal(got, expected):
                bad = int(numpy.argmax(got != expected)) if got.shape == expected.shape else -1
                print(f"FAIL: slot {k} differs (first at byte {bad})")
                failures += 1
            gpu_sum = int(arena[k * stride:(k + 1) * stride].astype(cupy.uint64).sum())
            host_sum = int(expected.astype(numpy.uint64).sum())
            if gpu_sum != host_sum:
                print(f"FAIL: slot {k} byte sum on the GPU {gpu_sum} != host {host_sum}")
                failures += 1
        if int(cupy.count_nonzero(arena[size:reserved])) != 0:
            print("FAIL: the tail padding is not zero")
            failures += 1
        cupy.cuda.runtime.deviceSynchronize()
        del arena, mem
    finally:
        cupy.cuda.runtime.ipcCloseMemHandle(ptr)
    print("cupy_ipc_check:", "OK" if failures == 0 else f"FAILED ({failures})")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
