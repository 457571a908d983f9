"""Reading what a shared library needs and defines, in pure Python (no readelf where packages are loaded).

Why the deploy layer cares: an AOTInductor package's `wrapper.so` that carries its own copy of libstdc++ (linked
with `-static-libstdc++`, as the C++ compiler wrapper on the H200 image does) shares the process with the
libstdc++.so that torch loaded. Objects cross between the two copies: `std::locale`'s facets are looked up by ids
that each copy numbers on its own, so the std::regex in AOTInductor's device-string parsing (`parse_device_str`,
run when the model container is created) finds no facet. libstdc++ 12 throws std::bad_cast (the load fails);
libstdc++ 13 skips the check for standard facets and calls through a null pointer (SIGSEGV at address 0: the crash
on the H200 image, whose native backtrace runs parse_device_str -> std::regex -> regex_traits::transform_primary).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

_SECTION = struct.Struct("<IIQQQQIIQQ")
_SYMBOL = struct.Struct("<IBBHQQ")
_DYN = struct.Struct("<qQ")
SHT_SYMTAB, SHT_DYNSYM = 2, 11
# std::locale::classic(): a library defines it only when libstdc++ itself was linked into it.
_LIBSTDCXX_MARK = "_ZNSt6locale7classicEv"


class Image:
    """A 64-bit little-endian ELF file read on demand through `read(offset, size) -> bytes` (a file, a zip member):
    only the headers and the sections asked for are read."""

    def __init__(self, read: Callable[[int, int], bytes]):
        self._read = read
        head = read(0, 64)
        if head[:4] != b"\x7fELF" or len(head) < 64 or head[4] != 2 or head[5] != 1:
            raise ValueError("not a 64-bit little-endian ELF file")
        (shoff,) = struct.unpack_from("<Q", head, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", head, 0x3A)
        table = read(shoff, shentsize * shnum)
        self.sections: list[dict] = []
        for i in range(shnum):
            name, kind, _, addr, offset, size, link, _, _, _ = _SECTION.unpack_from(table, i * shentsize)
            self.sections.append({"name_at": name, "type": kind, "addr": addr, "offset": offset, "size": size,
                                  "link": link})  # fmt: skip
        names = self.data(self.sections[shstrndx])
        for h in self.sections:
            h["name"] = _cstring(names, h["name_at"])

    @classmethod
    def of_file(cls, f: BinaryIO) -> Image:
        def read(offset: int, size: int) -> bytes:
            f.seek(offset)
            return f.read(size)

        return cls(read)

    def data(self, section: dict) -> bytes:
        return self._read(section["offset"], section["size"])

    def section(self, name: str) -> dict | None:
        return next((h for h in self.sections if h["name"] == name), None)

    def symbols(self, kind: int) -> Iterator[tuple[str, int, int, int, int]]:
        """(name, info, section index, value, size) of each symbol in the tables of `kind` (SHT_SYMTAB or
        SHT_DYNSYM)."""
        for h in self.sections:
            if h["type"] != kind:
                continue
            table, strings = self.data(h), self.data(self.sections[h["link"]])
            for off in range(0, len(table) - _SYMBOL.size + 1, _SYMBOL.size):
                name, info, _, shndx, value, size = _SYMBOL.unpack_from(table, off)
                yield _cstring(strings, name), info, shndx, value, size


def _cstring(table: bytes, at: int) -> str:
    end = table.find(b"\0", at)
    return table[at : end if end >= 0 else len(table)].decode(errors="replace")


@dataclass(frozen=True)
class ElfFacts:
    needed: tuple[str, ...]  # DT_NEEDED: the libraries it asks the loader for
    comment: tuple[str, ...]  # .comment: the compilers that built it
    runpath: str | None  # DT_RUNPATH, else DT_RPATH
    carries_libstdcxx: bool  # defines libstdc++'s own symbols (std::locale::classic) for others to bind

    @property
    def static_libstdcxx(self) -> bool:
        """libstdc++ linked in rather than asked for as libstdc++.so: it will clash with the process's own."""
        return self.carries_libstdcxx and not any(n.startswith("libstdc++.so") for n in self.needed)


def facts(image: Image) -> ElfFacts:
    """What a shared library needs, who built it and whether it carries libstdc++ inside."""
    needed: list[str] = []
    paths: dict[int, str] = {}
    comment = image.section(".comment")
    dynamic = image.section(".dynamic")
    if dynamic is not None:
        table, strings = image.data(dynamic), image.data(image.sections[dynamic["link"]])
        for off in range(0, len(table) - _DYN.size + 1, _DYN.size):
            tag, value = _DYN.unpack_from(table, off)
            if tag == 0:
                break
            if tag == 1:
                needed.append(_cstring(strings, value))
            elif tag in (15, 29):  # DT_RPATH, DT_RUNPATH
                paths[tag] = _cstring(strings, value)
    carries = any(name == _LIBSTDCXX_MARK and shndx for name, _, shndx, _, _ in image.symbols(SHT_DYNSYM))
    return ElfFacts(
        needed=tuple(needed),
        comment=tuple(sorted({s.decode(errors="replace") for s in image.data(comment).split(b"\0") if s.strip()}))
        if comment
        else (),
        runpath=paths.get(29, paths.get(15)),
        carries_libstdcxx=carries,
    )


def file_facts(path: str | os.PathLike) -> ElfFacts:
    with open(path, "rb") as f:
        return facts(Image.of_file(f))
