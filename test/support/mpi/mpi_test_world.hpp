// The world communicator of the multi-rank test program (set up by mpi_main.cpp).
#pragma once
#include <memory>

#include "parallel/communicator.hpp"

namespace mtnlg::test {
std::shared_ptr<parallel::Communicator>& mpi_test_world();
}
