// rdx: the endpoint and remote memory descriptors the connect layer exchanges.
// They live in the verbs layer (a queue pair connects to an endpoint); this
// header keeps the connect layer's name for them.
#pragma once

#include <rdx/verbs/endpoint.hpp>
