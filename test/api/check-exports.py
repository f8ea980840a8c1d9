#!/usr/bin/env python3
"""Suite 'unit' (api-exports-symbols): the export table of libregpool.so.

libregpool is built with hidden visibility and exports only what the public
headers mark REGPOOL_API (include/regpool/export.hpp). This reads the dynamic
symbol table of the built library with `nm -D` and checks:
  - no exported symbol names an internal namespace (regpool::detail,
    the wire parsers fabric_wire / verbs_wire / bootwire / ring / aggregate,
    regpool::platform,
    regpool::le) or the HMAC code, not even in a parameter or template
    argument;
  - the public API is there: a few functions of every layer, and the
    typeinfo and vtable of regpool::Error (without them a consumer cannot
    catch it) and of the Domain hierarchy (dynamic_cast).
Usage: check-exports.py LIBRARY. Exits 77 (SKIP) when nm is missing or the
library is not a shared object (a static-only build).
"""
import re
import shutil
import subprocess
import sys

INTERNAL = re.compile(
    r"regpool::(detail|fabric_wire|verbs_wire|bootwire|platform|le|ring|aggregate)::|hmac", re.IGNORECASE)

# Mangled names that must be exported (the Itanium C++ ABI spelling is
# stable; demanglers of different binutils versions print std types
# differently), with what they are.
REQUIRED = {
    "_ZTIN7regpool5ErrorE": "typeinfo for regpool::Error",
    "_ZTVN7regpool5ErrorE": "vtable for regpool::Error",
    "_ZTIN7regpool6DomainE": "typeinfo for regpool::Domain",
    "_ZTIN7regpool10HostDomainE": "typeinfo for regpool::HostDomain",
    "_ZN7regpool9to_stringENS_6StatusE": "regpool::to_string(regpool::Status)",
    "_ZN7regpool5ErrorC1ENS_6StatusEiRKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE":
        "regpool::Error::Error(Status, int, const std::string&)",
    "_ZN7regpool4Pool8allocateERKNS_8LdoShapeE": "regpool::Pool::allocate(const LdoShape&)",
    "_ZN7regpool3Ldo5resetEv": "regpool::Ldo::reset()",
    "_ZN7regpool5Slice4dataENS_3LdoE": "regpool::Slice::data(Ldo)",
    "_ZN7regpool9RemoteRef6decodeESt4spanIKSt4byteLm18446744073709551615EE":
        "regpool::RemoteRef::decode(std::span<const std::byte>)",
    "_ZN7regpool8Endpoint8progressEv": "regpool::Endpoint::progress()",
    "_ZN7regpool5printERSoRKNS_9PoolStatsE": "regpool::print(std::ostream&, const PoolStats&)",
    "_ZN7regpool12unpack_blobsESt4spanIKSt4byteLm18446744073709551615EE":
        "regpool::unpack_blobs(std::span<const std::byte>)",
}


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: check-exports.py LIBRARY", file=sys.stderr)
        return 2
    lib = sys.argv[1]
    if shutil.which("nm") is None:
        print("SKIP: nm not found (binutils)")
        return 77
    with open(lib, "rb") as f:
        head = f.read(18)
    # ELF, e_type ET_DYN (3), little-endian hosts only here.
    if head[:4] != b"\x7fELF" or head[16] != 3:
        print(f"SKIP: {lib} is not a shared object (static-only build)")
        return 77

    def exported(*flags: str) -> list[str]:
        out = subprocess.run(["nm", "-D", "--defined-only", *flags, lib], check=True, capture_output=True,
                             text=True).stdout
        # "address type name"; demangled names contain spaces.
        return [line.split(" ", 2)[2] for line in out.splitlines() if line.count(" ") >= 2]

    mangled = set(exported())
    demangled = set(exported("-C"))
    print(f"{lib}: {len(mangled)} exported symbols, "
          f"{sum('regpool' in n for n in demangled)} of them naming regpool")

    failed = False
    leaks = sorted(n for n in demangled if INTERNAL.search(n))
    if leaks:
        failed = True
        print(f"{len(leaks)} exported symbols name internals (mark them REGPOOL_LOCAL or keep "
              "them out of the public classes):")
        for n in leaks:
            print("  " + n)
    missing = [what for name, what in REQUIRED.items() if name not in mangled]
    if missing:
        failed = True
        print("public API not exported (REGPOOL_API missing?):")
        for what in missing:
            print("  " + what)
    if failed:
        return 1
    print(f"no internal symbol exported; {len(REQUIRED)} required public symbols present")
    return 0


if __name__ == "__main__":
    sys.exit(main())
