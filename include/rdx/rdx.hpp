// rdx: the core umbrella header. Needs only libibverbs: no CUDA, no rdma_cm.
#pragma once

#include <rdx/verbs/endpoint.hpp>
#include <rdx/connect/rc_pingpong_exchange.hpp>
#include <rdx/connect/tcp_bootstrap.hpp>
#include <rdx/connect/wire.hpp>
#include <rdx/error.hpp>
#include <rdx/verbs/address_handle.hpp>
#include <rdx/verbs/completion.hpp>
#include <rdx/verbs/completion_queue.hpp>
#include <rdx/verbs/context.hpp>
#include <rdx/verbs/device_list.hpp>
#include <rdx/verbs/dma_buf.hpp>
#include <rdx/verbs/gid.hpp>
#include <rdx/verbs/memory_region.hpp>
#include <rdx/verbs/memory_window.hpp>
#include <rdx/verbs/page_allocation.hpp>
#include <rdx/verbs/poll.hpp>
#include <rdx/verbs/post.hpp>
#include <rdx/verbs/protection_domain.hpp>
#include <rdx/verbs/queue_pair.hpp>
#include <rdx/verbs/queue_pair_attr.hpp>
#include <rdx/verbs/registration_cache.hpp>
#include <rdx/verbs/shared_receive_queue.hpp>
#include <rdx/verbs/work_request.hpp>

#include <rdx/channel/acceptor.hpp>
#include <rdx/channel/channel.hpp>
#include <rdx/channel/connection.hpp>
#include <rdx/channel/exchange.hpp>
#include <rdx/channel/message_ring.hpp>
#include <rdx/channel/operation.hpp>
#include <rdx/channel/send_queue.hpp>
#include <rdx/channel/window.hpp>
#include <rdx/channel/worker.hpp>
