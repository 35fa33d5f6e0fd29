// rdx-doctor: the checks of one host. Each adds findings with their fixes;
// none throws (a failed query is itself a finding).
#pragma once

#include "device_checks.hpp"
#include "gpu_checks.hpp"
#include "port_checks.hpp"
#include "process_checks.hpp"
#include "scope.hpp"
