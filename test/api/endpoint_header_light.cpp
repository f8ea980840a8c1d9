// Built, never run: a regression breaks the build. regpool/endpoint.hpp is
// included by every user of the transport, so it must not pull in the
// headers only the implementation needs (the progress thread and the
// condition variables live in lib/transport/endpoint.cpp). The include
// guards checked are libstdc++'s and libc++'s.
#include "regpool/endpoint.hpp"

#if defined(_GLIBCXX_THREAD) || defined(_LIBCPP_THREAD)
#error "regpool/endpoint.hpp includes <thread>: keep it in lib/transport/endpoint.cpp"
#endif
#if defined(_GLIBCXX_CONDITION_VARIABLE) || defined(_LIBCPP_CONDITION_VARIABLE)
#error "regpool/endpoint.hpp includes <condition_variable>: keep it in lib/transport/endpoint.cpp"
#endif

// The user API is complete without the backend header: a user can name and
// use these without regpool/endpoint_backend.hpp.
static_assert(sizeof(regpool::EndpointConfig) > 0);
static_assert(sizeof(regpool::Exposure) > 0);
static_assert(sizeof(regpool::Completion) > 0);

int regpool_endpoint_header_light() {
  regpool::Exposure e;
  regpool::Callback cb([](const regpool::Completion&) {});
  return (e ? 1 : 0) + (cb ? 1 : 0);
}
