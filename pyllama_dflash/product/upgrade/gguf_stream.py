"""A dependency-free GGUF v2/v3 reader and a key-adding writer that streams the tensor data.

Why not gguf-py: the upgrade must run where only the standard library is at hand, and it must
never hold a multi-gigabyte draft in memory. The reader parses the header, every key/value and
every tensor info, and checks the file is long enough for every tensor; it reads nothing of the
tensor data. The writer re-emits the metadata with added or replaced keys (unchanged keys and
tensor infos byte for byte), pads to the alignment and copies the data section in chunks.

Tensor offsets in GGUF are relative to the data section, so moving the section (the metadata
grows) leaves them valid, as long as the alignment stays the same. Little-endian files only.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import Any, BinaryIO

from ...errors import GGUFError

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
ALIGNMENT_KEY = "general.alignment"
ARCHITECTURE_KEY = "general.architecture"
GGML_MAX_DIMS = 4
CHUNK_SIZE = 1 << 20  # the largest single read() or write() the reader and writer make


class ValueType(IntEnum):
    """GGUF metadata value types (gguf.h ``enum gguf_type``)."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


# struct format of each fixed-size value type (BOOL is a byte, read as 'B' and turned to bool)
_SCALAR_FMT: dict[ValueType, str] = {
    ValueType.UINT8: "B",
    ValueType.INT8: "b",
    ValueType.UINT16: "H",
    ValueType.INT16: "h",
    ValueType.UINT32: "I",
    ValueType.INT32: "i",
    ValueType.FLOAT32: "f",
    ValueType.BOOL: "B",
    ValueType.UINT64: "Q",
    ValueType.INT64: "q",
    ValueType.FLOAT64: "d",
}

# ggml type id -> (name, block size in elements, bytes per block), as in llama.cpp b11434
# (ggml.c type_traits / gguf-py GGML_QUANT_SIZES). Ids 4, 5, 31-33 and 36-38 were removed
# from ggml; a type not listed here is refused, since its size, and so the file's, is unknown.
QK_K = 256
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 2 + 16),
    3: ("Q4_1", 32, 2 + 2 + 16),
    6: ("Q5_0", 32, 2 + 4 + 16),
    7: ("Q5_1", 32, 2 + 2 + 4 + 16),
    8: ("Q8_0", 32, 2 + 32),
    9: ("Q8_1", 32, 2 + 2 + 32),
    10: ("Q2_K", QK_K, 2 + 2 + QK_K // 16 + QK_K // 4),
    11: ("Q3_K", QK_K, 2 + QK_K // 4 + QK_K // 8 + 12),
    12: ("Q4_K", QK_K, 2 + 2 + QK_K // 2 + 12),
    13: ("Q5_K", QK_K, 2 + 2 + QK_K // 2 + QK_K // 8 + 12),
    14: ("Q6_K", QK_K, 2 + QK_K // 2 + QK_K // 4 + QK_K // 16),
    15: ("Q8_K", QK_K, 4 + QK_K + QK_K // 8),
    16: ("IQ2_XXS", QK_K, 2 + QK_K // 4),
    17: ("IQ2_XS", QK_K, 2 + QK_K // 4 + QK_K // 32),
    18: ("IQ3_XXS", QK_K, 2 + QK_K // 4 + QK_K // 8),
    19: ("IQ1_S", QK_K, 2 + QK_K // 8 + QK_K // 16),
    20: ("IQ4_NL", 32, 2 + 16),
    21: ("IQ3_S", QK_K, 2 + QK_K // 4 + QK_K // 8 + QK_K // 32 + 4),
    22: ("IQ2_S", QK_K, 2 + QK_K // 4 + QK_K // 16),
    23: ("IQ4_XS", QK_K, 2 + 2 + QK_K // 2 + QK_K // 64),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    29: ("IQ1_M", QK_K, QK_K // 8 + QK_K // 16 + QK_K // 32),
    30: ("BF16", 1, 2),
    34: ("TQ1_0", QK_K, 2 + 4 * 13),
    35: ("TQ2_0", QK_K, 2 + 64),
    39: ("MXFP4", 32, 1 + 16),
    40: ("NVFP4", 64, 4 + 32),
    41: ("Q1_0", 128, 2 + 16),
    42: ("Q2_0", 64, 2 + 16),
}


@dataclass(frozen=True)
class KeyValue:
    """One metadata entry. ``value`` is plain Python (arrays as lists, nested arrays as nested
    lists); ``raw`` is the encoded value exactly as in the file (type tag included), so the
    writer re-emits untouched entries byte for byte whatever their type."""

    key: str
    type: ValueType
    value: Any
    item_type: ValueType | None = None  # element type of a top-level array
    raw: bytes = field(default=b"", repr=False, compare=False)


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's description; ``offset`` is relative to the data section."""

    name: str
    shape: tuple[int, ...]  # ggml order: shape[0] is the contiguous dimension (ne0)
    ggml_type: int
    offset: int
    raw: bytes = field(default=b"", repr=False, compare=False)

    @property
    def type_name(self) -> str:
        return GGML_TYPES[self.ggml_type][0] if self.ggml_type in GGML_TYPES else f"type {self.ggml_type}"

    def nbytes(self) -> int:
        """Size of the tensor's data (ggml_nbytes for a contiguous tensor); ValueError when it
        cannot be computed (unknown ggml type, row not a whole number of blocks)."""
        if self.ggml_type not in GGML_TYPES:
            raise ValueError(f"tensor {self.name!r} has unknown ggml type {self.ggml_type}")
        name, block, size = GGML_TYPES[self.ggml_type]
        ne0 = self.shape[0] if self.shape else 1
        if ne0 % block:
            raise ValueError(f"tensor {self.name!r}: ne[0]={ne0} is not a multiple of the {name} block size {block}")
        n = ne0 // block * size
        for d in self.shape[1:]:
            n *= d
        return n


@dataclass(frozen=True)
class GGUFFile:
    """What :func:`read_gguf` found: everything but the tensor data itself."""

    path: Path
    version: int
    kvs: tuple[KeyValue, ...]  # in file order
    tensors: tuple[TensorInfo, ...]  # in file order
    alignment: int
    data_offset: int  # absolute file offset of the data section
    file_size: int

    def __contains__(self, key: object) -> bool:
        return any(kv.key == key for kv in self.kvs)

    def kv(self, key: str) -> KeyValue | None:
        return next((kv for kv in self.kvs if kv.key == key), None)

    def get(self, key: str, default: Any = None) -> Any:
        found = self.kv(key)
        return default if found is None else found.value

    @property
    def architecture(self) -> str | None:
        arch = self.get(ARCHITECTURE_KEY)
        return arch if isinstance(arch, str) else None


# ---- reading ---------------------------------------------------------------------------------


class _Reader:
    """Bounded, position-tracking reads that say where a truncated file ran out."""

    def __init__(self, f: BinaryIO, path: Path, size: int, chunk_size: int) -> None:
        self.f, self.path, self.size, self.chunk = f, path, size, chunk_size
        self.pos = 0
        self.where = "header"
        self._capture: list[bytes] | None = None

    def take(self, n: int) -> bytes:
        if n > self.size - self.pos:
            raise GGUFError(
                self.path,
                f"truncated in {self.where}: needs {n} bytes at offset {self.pos}, but the file ends at {self.size}",
            )
        parts = []
        left = n
        while left:
            part = self.f.read(min(left, self.chunk))
            if not part:  # the file shrank under us
                raise GGUFError(
                    self.path, f"truncated in {self.where}: unexpected end of file at offset {self.pos + n - left}"
                )
            parts.append(part)
            left -= len(part)
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        self.pos += n
        if self._capture is not None:
            self._capture.append(data)
        return data

    def unpack(self, fmt: str) -> Any:
        return struct.unpack("<" + fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.unpack("Q")
        # GGUF strings are bytes, not always valid UTF-8 (token pieces); keep them lossless
        return self.take(n).decode("utf-8", errors="surrogateescape")

    def value(self, vtype: int) -> tuple[Any, ValueType | None]:
        vt = self._value_type(vtype)
        if vt in _SCALAR_FMT:
            v = self.unpack(_SCALAR_FMT[vt])
            return (bool(v) if vt is ValueType.BOOL else v), None
        if vt is ValueType.STRING:
            return self.string(), None
        item = self._value_type(self.unpack("I"))
        count = self.unpack("Q")
        if item in _SCALAR_FMT:
            fmt = _SCALAR_FMT[item]
            width = struct.calcsize(fmt)
            if count * width > self.size - self.pos:
                self.take(count * width)  # raises the truncation error
            items: list[Any] = []
            per = max(1, self.chunk // width)  # bounded reads even for huge arrays
            done = 0
            while done < count:
                k = min(per, count - done)
                items.extend(struct.unpack(f"<{k}{fmt}", self.take(k * width)))
                done += k
            if item is ValueType.BOOL:
                items = [bool(v) for v in items]
            return items, item
        return [self.value(item)[0] for _ in range(count)], item

    def _value_type(self, vtype: int) -> ValueType:
        try:
            return ValueType(vtype)
        except ValueError:
            raise GGUFError(self.path, f"unknown metadata value type {vtype} in {self.where}") from None

    def start_capture(self) -> None:
        """Keep the bytes read from here on, for :meth:`end_capture` (raw copies of entries)."""
        self._capture = []

    def end_capture(self) -> bytes:
        data, self._capture = b"".join(self._capture or []), None
        return data


def _check_version(path: Path, version: int) -> None:
    if version in SUPPORTED_VERSIONS:
        return
    swapped = struct.unpack("<I", struct.pack(">I", version))[0]
    if version & 0xFFFF == 0 and swapped in (1, 2, 3):
        raise GGUFError(
            path, f"big-endian GGUF (version reads as {version:#010x}); only little-endian files are supported"
        )
    if version == 1:
        raise GGUFError(path, "GGUF version 1 is not supported (only versions 2 and 3)")
    raise GGUFError(path, f"unknown GGUF version {version} (only versions 2 and 3 are supported)")


def read_gguf(path: Path | str, *, chunk_size: int = CHUNK_SIZE) -> GGUFFile:
    """Parse a GGUF's metadata and tensor infos and check the data section covers every tensor.

    Raises GGUFError (bad magic, big-endian or unknown version, truncation with the place,
    unknown value or ggml type, bad alignment, duplicate key) and OSError for I/O failures.
    """
    path = Path(path)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        r = _Reader(f, path, size, chunk_size)
        magic = f.read(min(4, size))
        if magic != GGUF_MAGIC:
            raise GGUFError(path, f"not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})")
        r.pos = 4
        version = r.unpack("I")
        _check_version(path, version)
        n_tensors = r.unpack("Q")
        n_kv = r.unpack("Q")

        kvs: list[KeyValue] = []
        seen: set[str] = set()
        for i in range(n_kv):
            r.where = f"key/value #{i}"
            key = r.string()
            r.where = f"key/value #{i} ({key!r})"
            if key in seen:
                raise GGUFError(path, f"duplicate key {key!r} in key/value #{i}")
            seen.add(key)
            r.start_capture()
            vtype = r.unpack("I")
            value, item = r.value(vtype)
            kvs.append(KeyValue(key, ValueType(vtype), value, item, r.end_capture()))

        alignment = _alignment(path, kvs)

        tensors: list[TensorInfo] = []
        for i in range(n_tensors):
            r.where = f"tensor info #{i}"
            r.start_capture()
            name = r.string()
            r.where = f"tensor info #{i} ({name!r})"
            n_dims = r.unpack("I")
            if n_dims > GGML_MAX_DIMS:
                raise GGUFError(path, f"tensor {name!r} has {n_dims} dimensions (at most {GGML_MAX_DIMS})")
            shape = tuple(r.unpack("Q") for _ in range(n_dims))
            ggml_type = r.unpack("I")
            offset = r.unpack("Q")
            tensors.append(TensorInfo(name, shape, ggml_type, offset, r.end_capture()))

    # llama.cpp pads to the alignment before the data section only when there are tensors
    data_offset = _pad(r.pos, alignment) if tensors else r.pos
    _check_data(path, tensors, data_offset, size)
    return GGUFFile(path, version, tuple(kvs), tuple(tensors), alignment, data_offset, size)


def _alignment(path: Path, kvs: list[KeyValue]) -> int:
    found = next((kv for kv in kvs if kv.key == ALIGNMENT_KEY), None)
    if found is None:
        return DEFAULT_ALIGNMENT
    a = found.value
    if found.type is not ValueType.UINT32 or a <= 0 or a & (a - 1):
        raise GGUFError(path, f"{ALIGNMENT_KEY} must be a UINT32 power of 2, got {a!r} ({found.type.name})")
    return a


def _check_data(path: Path, tensors: list[TensorInfo], data_offset: int, size: int) -> None:
    # Every tensor is sized (unknown ggml types are refused rather than guessed), so a file cut
    # anywhere in the data section is caught, not only one cut before the last tensor's offset.
    if tensors and data_offset > size:
        raise GGUFError(
            path, f"truncated before the data section: it starts at offset {data_offset}, but the file ends at {size}"
        )
    for i, t in enumerate(tensors):
        try:
            n = t.nbytes()
        except ValueError as exc:
            raise GGUFError(path, str(exc)) from None
        end = data_offset + t.offset + n
        if end > size:
            raise GGUFError(
                path,
                f"truncated in the data section: tensor #{i} {t.name!r} ({t.type_name}, "
                f"{n} bytes) needs file bytes [{data_offset + t.offset}, {end}), "
                f"but the file ends at {size}",
            )


def _pad(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


# ---- writing ---------------------------------------------------------------------------------


def _encode_string(s: str) -> bytes:
    b = s.encode("utf-8", errors="surrogateescape")
    return struct.pack("<Q", len(b)) + b


def _encode_payload(vtype: ValueType, value: Any, item_type: ValueType | None) -> bytes:
    if vtype in _SCALAR_FMT:
        return struct.pack("<" + _SCALAR_FMT[vtype], int(value) if vtype is ValueType.BOOL else value)
    if vtype is ValueType.STRING:
        return _encode_string(value)
    if item_type is None:
        raise ValueError("an ARRAY value needs item_type")
    if item_type is ValueType.ARRAY:
        raise ValueError("encoding nested arrays is not supported (read ones are copied as they are)")
    items = list(value)
    body = b"".join(_encode_payload(item_type, v, None) for v in items)
    return struct.pack("<IQ", item_type, len(items)) + body


def make_kv(key: str, vtype: ValueType, value: Any, item_type: ValueType | None = None) -> KeyValue:
    """A new entry, encoded as the writer will emit it (e.g. an INT32 array of sections)."""
    if vtype is ValueType.ARRAY:
        value = list(value)
    raw = struct.pack("<I", vtype) + _encode_payload(vtype, value, item_type)
    return KeyValue(key, vtype, value, item_type, raw)


def write_with_kvs(src: GGUFFile, out: BinaryIO, changes: Iterable[KeyValue], *, chunk_size: int = CHUNK_SIZE) -> int:
    """Write ``src`` with ``changes`` replacing same-named entries (in place) or appended, to the
    open binary stream ``out``; returns the bytes written.

    The tensor infos are copied as they are and the data section is streamed from ``src.path``
    in reads of at most ``chunk_size`` bytes. The source must not have changed since it was read.
    """
    changes = list(changes)
    if any(c.key == ALIGNMENT_KEY for c in changes):
        raise ValueError(f"changing {ALIGNMENT_KEY} would move the tensor data; not supported")
    by_key = {c.key: c for c in changes}
    kvs = [by_key.pop(kv.key, kv) for kv in src.kvs] + [c for c in changes if c.key in by_key]

    head = bytearray(GGUF_MAGIC)
    head += struct.pack("<IQQ", src.version, len(src.tensors), len(kvs))
    for kv in kvs:
        head += _encode_string(kv.key) + kv.raw
    for t in src.tensors:
        head += t.raw
    if src.tensors:
        head += bytes(_pad(len(head), src.alignment) - len(head))
    written = 0
    for i in range(0, len(head), chunk_size):
        written += out.write(head[i : i + chunk_size])

    with open(src.path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size != src.file_size:
            raise GGUFError(src.path, f"changed since it was read ({src.file_size} bytes then, {size} now)")
        f.seek(src.data_offset)
        left = size - src.data_offset
        while left > 0:
            chunk = f.read(min(chunk_size, left))
            if not chunk:
                raise GGUFError(src.path, f"ended early while copying the data section ({left} bytes short)")
            written += out.write(chunk)
            left -= len(chunk)
    return written
