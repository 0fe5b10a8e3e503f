"""The driver-API allocation paths no framework above exercises, called straight through ctypes.

Used by mem_probe.py for ``driver:<path>`` scenarios. ctypes opens libcuda.so.1 with dlopen and finds
each entry point with dlsym on that handle — the path CuPy, JAX and Triton take — so these scenarios
also prove the enforcer's dlsym interception; ``procaddr`` instead fetches cuMemAlloc through
cuGetProcAddress_v2 (cudart's path). Each path allocates 64 MiB pieces until the driver answers
CUDA_ERROR_OUT_OF_MEMORY, then 2 MiB pieces until it answers it again, so the bytes granted end
within 2 MiB of what the slice really leaves. Structure layouts are the CUDA 12/13 driver ABI
(cuda.h); no CUDA headers or toolkit are needed.
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, byref, c_int, c_size_t, c_uint, c_uint64, c_void_p

MiB = 1 << 20
CUDA_ERROR_OUT_OF_MEMORY = 2
PATHS = ("dlsym", "procaddr", "pitch", "managed", "vmm", "async", "pool", "array", "mipmap")


class CudaError(RuntimeError):
    def __init__(self, call: str, code: int):
        super().__init__(f"{call} failed with CUresult {code}")
        self.code = code


class _Location(ctypes.Structure):
    _fields_ = [("type", c_int), ("id", c_int)]  # CU_MEM_LOCATION_TYPE_DEVICE = 1


class _AllocProp(ctypes.Structure):  # CUmemAllocationProp (32 bytes)
    _fields_ = [("type", c_int), ("handleTypes", c_int), ("location", _Location),
                ("win32", c_void_p), ("allocFlags", ctypes.c_ubyte * 8)]


class _PoolProps(ctypes.Structure):  # CUmemPoolProps (88 bytes; maxSize/usage live in the tail, 0 = default)
    _fields_ = [("allocType", c_int), ("handleTypes", c_int), ("location", _Location),
                ("win32", c_void_p), ("tail", ctypes.c_ubyte * 64)]


class _Array3D(ctypes.Structure):  # CUDA_ARRAY3D_DESCRIPTOR
    _fields_ = [("Width", c_size_t), ("Height", c_size_t), ("Depth", c_size_t),
                ("Format", c_int), ("NumChannels", c_uint), ("Flags", c_uint)]


class Driver:
    """A primary context on device 0 and the calls the paths need."""

    def __init__(self) -> None:
        self.cu = ctypes.CDLL("libcuda.so.1")
        self.check("cuInit", self.cu.cuInit(0))
        dev = c_int()
        self.check("cuDeviceGet", self.cu.cuDeviceGet(byref(dev), 0))
        self.dev = dev.value
        ctx = c_void_p()
        self.check("cuDevicePrimaryCtxRetain", self.cu.cuDevicePrimaryCtxRetain(byref(ctx), dev))
        self.check("cuCtxSetCurrent", self.cu.cuCtxSetCurrent(ctx))
        self.pool = c_void_p()
        self.keep: list = []  # handles stay referenced until the process exits (the orchestrator looks)

    @staticmethod
    def check(call: str, rc: int) -> None:
        if rc != 0:
            raise CudaError(call, rc)

    def mem_info(self) -> dict:
        free, total = c_size_t(), c_size_t()
        self.check("cuMemGetInfo_v2", self.cu.cuMemGetInfo_v2(byref(free), byref(total)))
        return {"free": free.value, "total": total.value}

    def allocate(self, path: str, size: int) -> None:
        """One allocation of `size` bytes through `path`; raises CudaError with the driver's code."""
        getattr(self, "_" + path)(size)

    def _dlsym(self, size: int) -> None:
        p = c_uint64()
        self.check("cuMemAlloc_v2", self.cu.cuMemAlloc_v2(byref(p), c_size_t(size)))
        self.keep.append(p)

    def _procaddr(self, size: int) -> None:
        if not hasattr(self, "_alloc_fn"):
            fn, status = c_void_p(), c_int()
            self.check("cuGetProcAddress_v2", self.cu.cuGetProcAddress_v2(
                b"cuMemAlloc", byref(fn), c_int(12000), c_uint64(0), byref(status)))
            self._alloc_fn = ctypes.CFUNCTYPE(c_int, POINTER(c_uint64), c_size_t)(fn.value)
        p = c_uint64()
        self.check("cuMemAlloc (via cuGetProcAddress_v2)", self._alloc_fn(byref(p), size))
        self.keep.append(p)

    def _pitch(self, size: int) -> None:
        p, pitch = c_uint64(), c_size_t()
        width = MiB  # a multiple of every pitch alignment, so the pitch equals the width
        self.check("cuMemAllocPitch_v2", self.cu.cuMemAllocPitch_v2(
            byref(p), byref(pitch), c_size_t(width), c_size_t(size // width), c_uint(16)))
        self.keep.append(p)

    def _managed(self, size: int) -> None:
        p = c_uint64()
        self.check("cuMemAllocManaged", self.cu.cuMemAllocManaged(byref(p), c_size_t(size), c_uint(1)))
        self.keep.append(p)

    def _vmm(self, size: int) -> None:
        prop = _AllocProp(type=1, location=_Location(1, self.dev))  # pinned, on our device
        h = c_uint64()
        self.check("cuMemCreate", self.cu.cuMemCreate(byref(h), c_size_t(size), byref(prop), c_uint64(0)))
        self.keep.append(h)

    def _async(self, size: int) -> None:
        p = c_uint64()
        self.check("cuMemAllocAsync", self.cu.cuMemAllocAsync(byref(p), c_size_t(size), c_void_p(0)))
        self.check("cuCtxSynchronize", self.cu.cuCtxSynchronize())
        self.keep.append(p)

    def _pool(self, size: int) -> None:
        if not self.pool.value:
            props = _PoolProps(allocType=1, location=_Location(1, self.dev))
            self.check("cuMemPoolCreate", self.cu.cuMemPoolCreate(byref(self.pool), byref(props)))
        p = c_uint64()
        self.check("cuMemAllocFromPoolAsync", self.cu.cuMemAllocFromPoolAsync(
            byref(p), c_size_t(size), self.pool, c_void_p(0)))
        self.check("cuCtxSynchronize", self.cu.cuCtxSynchronize())
        self.keep.append(p)

    def _array_desc(self, size: int) -> _Array3D:
        width = 1024  # texels of 4 bytes (RGBA8): 4 KiB a row
        return _Array3D(Width=width, Height=size // (4 * width), Depth=0, Format=0x01, NumChannels=4, Flags=0)

    def _array(self, size: int) -> None:
        a = c_void_p()
        self.check("cuArray3DCreate_v2", self.cu.cuArray3DCreate_v2(byref(a), byref(self._array_desc(size))))
        self.keep.append(a)

    def _mipmap(self, size: int) -> None:
        a = c_void_p()
        self.check("cuMipmappedArrayCreate", self.cu.cuMipmappedArrayCreate(
            byref(a), byref(self._array_desc(size)), c_uint(1)))
        self.keep.append(a)


def fill(drv: Driver, path: str, rep: dict, alloc_mib: int = 0) -> None:
    """Allocate through `path` until OOM (64 MiB, then 2 MiB pieces), or just alloc_mib MiB."""
    for piece in (64 * MiB, 2 * MiB):
        try:
            while not alloc_mib or rep["granted"] < alloc_mib * MiB:
                drv.allocate(path, piece)
                rep["granted"] += piece
            return
        except CudaError as e:
            if e.code != CUDA_ERROR_OUT_OF_MEMORY:
                raise
            rep["oom"], rep["oom_message"] = True, str(e)
