#pragma once
// Umbrella header: the whole public API of regpool.

#include "regpool/config.hpp"
#include "regpool/aggregator.hpp"
#include "regpool/bootstrap.hpp"
#include "regpool/domain.hpp"
#include "regpool/endpoint.hpp"
#include "regpool/error.hpp"
#include "regpool/host_domain.hpp"
#include "regpool/ldo.hpp"
#include "regpool/membership.hpp"
#include "regpool/messaging.hpp"
#include "regpool/memory_resource.hpp"
#include "regpool/pool.hpp"
#include "regpool/remote_ref.hpp"
#include "regpool/ring_channel.hpp"
#include "regpool/slice.hpp"
#include "regpool/telemetry.hpp"
#if REGPOOL_HAVE_FABRIC
#include "regpool/fabric_domain.hpp"
#include "regpool/fabric_endpoint.hpp"
#endif
#if REGPOOL_HAVE_VERBS
#include "regpool/verbs_domain.hpp"
#include "regpool/verbs_endpoint.hpp"
#endif
