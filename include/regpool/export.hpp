#pragma once
// Symbol export policy of libregpool (docs/architecture.md, "Public API and
// exported symbols"). The shared library is built with hidden visibility:
// only declarations marked REGPOOL_API are exported. That is every public
// class (with its typeinfo and vtable, so regpool::Error can be caught and
// dynamic_cast works across the library boundary) and every public free
// function in include/regpool/. Internal code (the pool's control blocks,
// the wire parsers, HMAC, the platform layer) stays hidden, so it is
// neither part of the ABI nor interposable.
//
// For consumers the attribute changes nothing (default visibility is what
// they get anyway), except that the declarations stay visible when they
// build with -fvisibility=hidden themselves.

#if defined(__GNUC__) || defined(__clang__)
#define REGPOOL_API __attribute__((visibility("default")))
// On a private member of an exported class whose signature names an internal
// type (only an opaque forward declaration in the public header): keeps it
// out of the export table, which then names no internal namespace at all.
#define REGPOOL_LOCAL __attribute__((visibility("hidden")))
#else
#define REGPOOL_API
#define REGPOOL_LOCAL
#endif

// REGPOOL_HOT: on the few exported functions a data-path loop calls once per
// object (allocate, the drop, data; base() is inline). A consumer built as PIC or PIE
// (the default) then calls them through the GOT directly instead of through a
// PLT entry: one indirect jump less per call (bench-alloc measured it); the
// symbol is bound when the library loads instead of at its first call.
#if defined(__has_attribute)
#if __has_attribute(noplt)
#define REGPOOL_HOT __attribute__((noplt))
#endif
#endif
#ifndef REGPOOL_HOT
#define REGPOOL_HOT
#endif
