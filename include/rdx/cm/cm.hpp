// rdx::cm: connections set up through librdmacm (target rdx::cm). The core
// umbrella rdx/rdx.hpp never includes this. How it works:
// rdx's design notes (share/doc/rdx/design.md), "rdma_cm".
#pragma once

#include <rdx/cm/acceptor.hpp>
#include <rdx/cm/connect.hpp>
#include <rdx/cm/event_channel.hpp>
#include <rdx/cm/id.hpp>
#include <rdx/cm/link.hpp>
#include <rdx/cm/listener.hpp>
#include <rdx/cm/private_data.hpp>
