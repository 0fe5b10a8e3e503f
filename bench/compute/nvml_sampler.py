"""Independent measurement for the compute benchmark: NVML, sampled every 100 ms until SIGTERM.

Writes JSON lines to --out:
  {"t": epoch_s, "util": device utilization.gpu %, "sm_mhz": SM clock}            every 100 ms
  {"pid": pid, "ts": epoch_s, "sm": smUtil %}   per process sample (nvmlDeviceGetProcessUtilization)
NVML's per-process smUtil is the share of the driver's sampling period during which a kernel of that
process was running: the time share the enforcer is asked to hold, measured by the driver, not by us.
"""

from __future__ import annotations

import ctypes
import json
import signal
import sys
import time


class Sample(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("timeStamp", ctypes.c_ulonglong), ("smUtil", ctypes.c_uint),
                ("memUtil", ctypes.c_uint), ("encUtil", ctypes.c_uint), ("decUtil", ctypes.c_uint)]


class Util(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


def main() -> None:
    out = open(sys.argv[sys.argv.index("--out") + 1], "a", buffering=1)
    nv = ctypes.CDLL("libnvidia-ml.so.1")
    if nv.nvmlInit_v2() != 0:
        sys.exit("nvml_sampler: nvmlInit failed")
    h = ctypes.c_void_p()
    if nv.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h)) != 0:
        sys.exit("nvml_sampler: no device 0")
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    last = ctypes.c_ulonglong(int(time.time() * 1e6))
    while not stop:
        u, mhz = Util(), ctypes.c_uint()
        rec = {"t": time.time()}
        if nv.nvmlDeviceGetUtilizationRates(h, ctypes.byref(u)) == 0:
            rec["util"] = u.gpu
        if nv.nvmlDeviceGetClockInfo(h, 1, ctypes.byref(mhz)) == 0:  # NVML_CLOCK_SM
            rec["sm_mhz"] = mhz.value
        out.write(json.dumps(rec) + "\n")
        n = ctypes.c_uint(0)
        nv.nvmlDeviceGetProcessUtilization(h, None, ctypes.byref(n), last)  # asks for the count
        if n.value:
            buf = (Sample * (n.value + 8))()
            n2 = ctypes.c_uint(n.value + 8)
            if nv.nvmlDeviceGetProcessUtilization(h, buf, ctypes.byref(n2), last) == 0:
                newest = last.value
                for s in buf[: n2.value]:
                    if s.timeStamp > last.value:
                        out.write(json.dumps({"pid": s.pid, "ts": s.timeStamp / 1e6, "sm": s.smUtil}) + "\n")
                        newest = max(newest, s.timeStamp)
                last = ctypes.c_ulonglong(newest)
        time.sleep(0.1)
    nv.nvmlShutdown()


if __name__ == "__main__":
    main()
