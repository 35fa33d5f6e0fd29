// rdx::detail: a connection's engine whole: its declaration (engine.hpp)
// and the files in engine_parts/ that define its member functions (and the
// worker's that drive engines), each of which includes the declaration and
// none of the others. Those files are parts of this one: include this one.
#pragma once

#include <rdx/channel/detail/engine.hpp>
#include <rdx/channel/detail/engine_parts/device_events.hpp>
#include <rdx/channel/detail/engine_parts/dispatch.hpp>
#include <rdx/channel/detail/engine_parts/engine_setup.hpp>
#include <rdx/channel/detail/engine_parts/events.hpp>
#include <rdx/channel/detail/engine_parts/failure.hpp>
#include <rdx/channel/detail/engine_parts/grants.hpp>
#include <rdx/channel/detail/engine_parts/handlers.hpp>
#include <rdx/channel/detail/engine_parts/lifetime.hpp>
#include <rdx/channel/detail/engine_parts/posting.hpp>
#include <rdx/channel/detail/engine_parts/progress.hpp>
#include <rdx/channel/detail/engine_parts/striping.hpp>
#include <rdx/channel/detail/engine_parts/worker_drive.hpp>
#include <rdx/channel/detail/engine_parts/worker_members.hpp>
